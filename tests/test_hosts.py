"""Sandboxes on several Docker hosts (env.Env over hosts.py): placement by capacity, a host that stops
answering drained and its episodes run again elsewhere, a restarted daemon rejoining, transports.

The second host is a second dockerd on this machine (scripts/second_dockerd.py), started and removed
by the module fixture; the primary daemon (/var/run/docker.sock) is never stopped.
"""
import dataclasses
import json
import logging
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import container
import env as E
import grading
import hosts as H
from policy import ScriptedPolicy
import rollout as R
import task_folders as T

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from second_dockerd import Dockerd  # noqa: E402

MAIN = "unix:///var/run/docker.sock"


@pytest.fixture(scope="module")
def second():
    """A second dockerd with its own socket, data root, exec root and pid file; removed at the end."""
    if not shutil.which("dockerd"):
        pytest.skip("dockerd is not installed (apt-get install docker.io): no second daemon to test against")
    d = Dockerd().start()
    yield d
    d.remove()


def own(client, token: str) -> list:
    return client.api.containers(all=True, filters={"label": f"termrl.env={token}"})


def test_plain_tcp_is_refused_with_how_to_fix(tmp_path):
    """Bug guard: a tcp:// host without TLS would hand root on that machine to whoever reaches the
    port; it must be refused with what to use instead, as must a TLS folder without the client's keys."""
    with pytest.raises(ValueError, match=r"plain TCP is refused.*ssh://user@box2.*tls=DIR"):
        H.parse_host("tcp://box2:2375,capacity=8")
    with pytest.raises(ValueError, match=r"plain TCP is refused"):
        E.Env(hosts=["http://box2:2375"])
    with pytest.raises(ValueError, match=r"lacks ca.pem, cert.pem, key.pem"):
        H.parse_host(f"tcp://box2:2376,tls={tmp_path}")
    for f in H.TLS_FILES:
        (tmp_path / f).write_text("x")
    h = H.parse_host({"url": "tcp://box2:2376", "capacity": 8, "labels": ["big"], "tls": str(tmp_path)})
    assert (h.name, h.capacity, h.labels) == ("box2:2376", 8, ["big"])
    assert H.parse_host("ssh://me@box3,capacity=4,labels=a:b").labels == ["a", "b"]
    with pytest.raises(ValueError, match="capacity must be a whole number"):
        H.parse_host("ssh://me@box3,capacity=lots")
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, str(root / "tasktool.py"), "validate",
                        str(root / "tests" / "fixtures"), "--docker-host", "tcp://box2:2375"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "plain TCP is refused" in r.stderr, r.stderr[-500:]


def test_task_host_labels_are_read_from_both_layouts(tmp_path):
    """Bug guard: a task's host_labels (TB1 task.yaml, TB2 [environment]) must reach Task.host_labels,
    and a label that is not a list of names must be a task error, not a silent any-host task."""
    fixtures = Path(__file__).parent / "fixtures"
    tb1, tb2 = tmp_path / "tb1", tmp_path / "tb2"
    shutil.copytree(fixtures / "tb1-hello", tb1)
    shutil.copytree(fixtures / "tb2-partial", tb2)
    with open(tb2 / "task.toml", "a") as f:
        f.write('host_labels = ["arm64", "big"]\n')  # the last table of the file is [environment]
    assert T.load_task(tb2).host_labels == ["arm64", "big"]
    (tb1 / "task.yaml").write_text((tb1 / "task.yaml").read_text() + "\nhost_labels: arm64\n")
    with pytest.raises(T.TaskError, match="host_labels must be a list of label names"):
        T.load_task(tb1)


def test_episodes_spread_over_both_hosts_by_capacity(second, easy_tasks):
    """Bug guard: containers must go to the least loaded host with room and never past a host's
    capacity; a reset with every host full waits for room instead of overfilling one; a task's
    host_labels send it only to hosts with those labels. The second daemon starts without termrl's
    base image: Env loads it there from the first (docker save | load)."""
    with E.Env(hosts=[f"{MAIN},capacity=2,name=main",
                      f"{second.url},capacity=4,name=second,labels=big"]) as env:
        main, sec = env._hosts.hosts
        with ThreadPoolExecutor(6) as pool:
            terms = list(pool.map(env.reset, easy_tasks[:6]))
        assert "termrl-base:bookworm" in sec.images  # loaded from main
        assert sorted(t.host.name for t in terms) == ["main"] * 2 + ["second"] * 4
        assert (main.running, sec.running) == (2, 4)
        assert all(t.run("echo hi").output == "hi\n" for t in terms)
        late = ThreadPoolExecutor(1).submit(env.reset, easy_tasks[6])
        time.sleep(1.0)
        assert not late.done()  # both hosts are full
        next(t for t in terms if t.host is main).close()
        t7 = late.result(timeout=60)
        assert t7.host is main and main.running == 2
        stats = env.host_stats()
        assert stats["hosts/main/running"] == 2 and stats["hosts/second/running"] == 4
        assert stats["hosts/second/start_s"] > 0 and stats["hosts/second/failed"] == 0
        assert env.hosts_postfix() == "main=2/2 second=4/4"
        for t in terms + [t7]:
            t.close()
        assert (main.running, sec.running) == (0, 0)
        with env.reset(dataclasses.replace(easy_tasks[7], host_labels=["big"])) as t:
            assert t.host is sec  # though main is as empty
        with pytest.raises(container.InfraError,
                           match=r"needs Docker host labels \['gpu'\]; no host in env.hosts has them"):
            env.reset(dataclasses.replace(easy_tasks[7], host_labels=["gpu"]))
        assert not own(main.client, env._token) and not own(sec.client, env._token)


def test_a_stopped_daemon_is_drained_and_the_step_completes_on_the_other(second, easy_tasks, tiny_tokenizer,
                                                                          caplog):
    """Bug guard: a sandbox host that stops answering mid-rollout must not stop training nor cost rows:
    its episodes end as host_down (masked), run again on the other host, the step completes with
    every row valid, nothing of ours is left on either daemon, and the restarted daemon rejoins.
    With every host down, a reset fails clearly after env.hosts_down_wait_s. Prints the timeline."""
    caplog.set_level(logging.WARNING)
    t0 = time.time()
    marks = []

    def mark(what):
        marks.append((time.time(), what))
    tasks = easy_tasks[:6]
    cfg = R.RolloutConfig(max_turns=4, num_workers=6, group_size=1)
    with E.Env(hosts=[f"{MAIN},capacity=3,name=main", f"{second.url},capacity=3,name=second"]) as env, \
            E.Env(hosts=[second.url], hosts_down_wait_s=1.0) as solo, \
            ScriptedPolicy(tiny_tokenizer, "fixed", latency_s=0.05, commands=["sleep 3; echo ok"]) as policy:
        main, sec = env._hosts.hosts
        result = {}
        th = threading.Thread(
            target=lambda: result.update(trajs=R.collect(tasks, policy, env, cfg, progress=False)))
        th.start()
        end = time.monotonic() + 90  # (the base image is loaded onto the second daemon first)
        while sum(t.host is sec and t.task is not None and not t.closed for t in list(env._terms)) < 3:
            assert time.monotonic() < end, "no 3 episodes started on the second host"
            time.sleep(0.05)
        mark("3 episodes run on each host")
        time.sleep(1.0)  # the episodes are inside their `sleep 3`
        mark("stop sent to the second dockerd (SIGTERM)")
        second.stop()
        mark("second dockerd exited")
        th.join(120)
        mark("collect returned (the step's rollout is complete)")
        trajs = result["trajs"]
        assert len(trajs) == 6 and all(t.valid and t.finish_reason == "submitted" for t in trajs), \
            [(t.finish_reason, t.error) for t in trajs]
        resampled = [r for r in caplog.records if "running it again" in r.getMessage()]
        assert len(resampled) >= 1 and sec.failed >= 1 and not sec.up
        with pytest.raises(H.HostsDown, match="every Docker host has stopped answering"):
            solo.reset(tasks[0])
        mark("a reset with its only host down raised HostsDown")
        second.start()
        mark("second dockerd restarted")
        end = time.monotonic() + 90
        while not sec.up and time.monotonic() < end:
            time.sleep(0.1)
        assert sec.up, "the restarted daemon did not rejoin"
        mark("second host rejoined")
        assert not own(sec.client, env._token) and not sec.lost  # what the drain lost is swept
        terms = [env.reset(t) for t in tasks[:4]]
        assert sorted(t.host.name for t in terms) == ["main", "main", "second", "second"]
        for t in terms:
            t.close()
    assert not own(main.client, env._token) and not own(sec.client, env._token)
    events = [(t, f"Env: host {name} {what}") for t, name, what in env._hosts.events]
    events += [(r.created, f"rollout: {r.getMessage()[:110]}") for r in resampled]
    print("\ndrain timeline (s after the rollout began):")
    for t, what in sorted(marks + events):
        print(f"  {t - t0:7.2f}  {what}")


def test_remote_host_fallbacks_through_the_docker_api(easy_tasks):
    """Bug guard: for a daemon on another machine State.Pid is that machine's pid; reading /proc or
    signalling it here hits an unrelated local process. With host-side work off (what a remote host
    gets) the terminal must touch no /proc path, and still: end a timed-out command, stop the agent's
    processes before grading (a kill from inside), see toolchain changes (docker diff) and keep the
    disk cap (the daemon's SizeRw)."""
    with E.Env(hosts=[MAIN]) as env:
        env._hosts.hosts[0].host_side = False
        term = env.reset(easy_tasks[0])
        with term:
            assert term.local is False and term.cgroup == {} and term.procs() is None
            r = term.run("sleep 100", timeout=1)
            assert r.timed_out and term.run("echo still").output == "still\n"
            term.run("(sleep 1000 &) ; cp /bin/true /usr/local/bin/python3")
            g = grading.grade(term)
            assert g.reward == 0
            assert "added /usr/local/bin/python3 (a program the test harness runs)" in g.tampered
            assert term.exec("pgrep -fx 'sleep 1000' || echo gone")[1].strip() == "gone"
        with env.reset(easy_tasks[1]) as term:
            term.disk_cap_mb = 1
            assert term.run("head -c 3000000 /dev/urandom > /root/big").exit_code == 0
            term.check_disk()
            assert term.dead and "disk cap" in term.dead


def seeded(d) -> str:
    """d's URL once it holds the base image (loaded from the main daemon): a run on it alone has no
    other host to load it from."""
    import docker
    client = docker.DockerClient(base_url=d.url, timeout=600)
    try:
        client.api.inspect_image(T.BASE_IMAGE)
    except docker.errors.ImageNotFound:
        client.api.load_image(docker.from_env(timeout=600).api.get_image(T.BASE_IMAGE))
    client.close()
    return d.url


def test_a_daemon_down_at_start_is_named_by_its_own_error(tmp_path):
    """Bug: with the daemon down at start the run said "Docker is not reachable (RuntimeError: cannot
    notify on un-acquired lock)": HostPool.drain notifies the lock's waiters and was reached without
    the lock. The error names the host and the daemon's own answer."""
    sock = tmp_path / "docker.sock"
    with pytest.raises(container.InfraError) as e:
        E.Env(hosts=[f"unix://{sock}"])
    assert "un-acquired lock" not in str(e.value)
    assert re.search(rf"cannot reach the Docker daemon; {re.escape(str(sock))}: \w+(Error|Exception): .*"
                     r"(No such file|Connection)", str(e.value)), e.value


def three_live_episodes(env, policy, easy_tasks, cfg):
    """A step of 3 episodes collected on a thread, returned once all 3 run (plus a second, so each
    is inside its command): (the thread, the dict its trajectories or error land in)."""
    result = {}

    def step():
        try:
            result["trajs"] = R.collect(easy_tasks[:3], policy, env, cfg, progress=False)
        except BaseException as e:  # said by all_submitted's assertions
            result["error"] = e
    th = threading.Thread(target=step)
    th.start()
    end = time.monotonic() + 120  # the base image is loaded onto the second daemon first
    while sum(t.task is not None and not t.closed for t in list(env._terms)) < 3:
        assert time.monotonic() < end and th.is_alive(), "no 3 episodes started: " + repr(
            result.get("error") or [(t.finish_reason, t.error) for t in result["trajs"]])
        time.sleep(0.05)
    time.sleep(1.0)
    return th, result


def all_submitted(th, result):
    """The step of three_live_episodes returned, every episode valid and submitted."""
    th.join(180)
    assert not th.is_alive() and "trajs" in result, f"collect did not return: {result.get('error')!r}"
    trajs = result["trajs"]
    assert len(trajs) == 3 and all(t.valid and t.finish_reason == "submitted" for t in trajs), \
        [(t.finish_reason, t.error) for t in trajs]


def test_a_daemon_stopped_shorter_than_the_wait_loses_no_episode(second, easy_tasks, tiny_tokenizer):
    """Bug: a daemon stopped (SIGSTOP) for less than env.hosts_down_wait_s stopped the run with
    "every Docker host has stopped answering", though it had answered again for a while: the
    doubling back-off had put the drained host's next retry past the wait, and the run stopped at
    the wait without asking it again. Here the daemon is let go once the back-off has set that
    retry (after the retry in flight gave up), well before the wait ends: the step's episodes all
    end valid, and the containers that outlived the stall are removed by label, not counted lost."""
    wait = 40.0
    cfg = R.RolloutConfig(max_turns=4, num_workers=3, group_size=1)
    with E.Env(hosts=[f"{seeded(second)},name=stalled"], hosts_down_wait_s=wait) as env, \
            ScriptedPolicy(tiny_tokenizer, "fixed", latency_s=0.05, commands=["sleep 3; echo ok"]) as policy:
        host = env._hosts.hosts[0]
        th, result = three_live_episodes(env, policy, easy_tasks, cfg)
        second.proc.send_signal(signal.SIGSTOP)
        try:
            end = time.monotonic() + wait
            while host.up or host.retry_at < host.down_since + wait - 1:  # the last retry within
                                                                          # the wait is set
                assert time.monotonic() < end, "the stopped daemon was not drained"
                time.sleep(0.1)
            time.sleep(H.PROBE_TIMEOUT_S + 1)  # the retry in flight gives up
            assert time.monotonic() < host.down_since + wait - 3, "the back-off left no time to let it go"
        finally:
            second.proc.send_signal(signal.SIGCONT)
        all_submitted(th, result)
        assert host.up and [e[2] for e in env._hosts.events][-1] == "rejoined"
        assert host.failed == 0, host.failed  # they outlived the stall: not lost
    assert not own(host.client, env._token)


def test_a_daemon_restarted_under_live_episodes_reruns_them(second, easy_tasks, tiny_tokenizer):
    """A daemon restarted (SIGTERM, then started again) under live episodes, the run's only host:
    the lost episodes end as infra, run again once it rejoins, and the step ends with every row
    valid; nothing of ours is left on it."""
    cfg = R.RolloutConfig(max_turns=4, num_workers=3, group_size=1)
    with E.Env(hosts=[f"{seeded(second)},name=restarted"], hosts_down_wait_s=60.0) as env, \
            ScriptedPolicy(tiny_tokenizer, "fixed", latency_s=0.05, commands=["sleep 3; echo ok"]) as policy:
        host = env._hosts.hosts[0]
        th, result = three_live_episodes(env, policy, easy_tasks, cfg)
        second.stop()
        second.start()
        all_submitted(th, result)
        assert host.failed >= 1 and any(e[2].startswith("drained") for e in env._hosts.events)
    assert not own(host.client, env._token)


def test_a_train_run_rides_out_a_stalled_daemon(second, tiny_model_dir, tmp_path):
    """`python train.py --config configs/tiny.yaml` with a second daemon as its only host, stopped
    (SIGSTOP) mid-run for less than env.hosts_down_wait_s: the run finishes every step without
    --resume, and its records stay valid JSON."""
    steps, out = 5, tmp_path / "run"
    argv = [sys.executable, "train.py", "--config", "configs/tiny.yaml", "--set", f"out_dir={out}",
            "--set", f"model.path={tiny_model_dir}", "--set", "model.build_tiny=false",
            "--set", f"env.hosts=['{seeded(second)},name=stalled']", "--set", "env.hosts_down_wait_s=30",
            "--set", "sft.steps=0", "--set", "sft.val_tasks=0", "--set", "sft.stop_at_val_prob=0",
            "--set", "sft.num_tasks=1", "--set", f"train.steps={steps}", "--set", "train.tasks_per_step=3",
            "--set", "train.group_size=2", "--set", "train.updates_per_step=1", "--set", "eval.num_tasks=0",
            "--set", "eval.at_start=false", "--set", "rollout.num_workers=6", "--set", "checkpoint.every=100"]
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen(argv, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        end = time.monotonic() + 300
        while not (out / "metrics.jsonl").exists() or not (out / "metrics.jsonl").read_text().count("\n"):
            assert proc.poll() is None and time.monotonic() < end, proc.communicate()[0][-3000:]
            time.sleep(0.2)
        second.proc.send_signal(signal.SIGSTOP)  # mid-run: step 1 logged, step 2's episodes under way
        try:
            time.sleep(15)
            assert proc.poll() is None, "the run ended during the stall"
        finally:
            second.proc.send_signal(signal.SIGCONT)
        log, _ = proc.communicate(timeout=400)
    finally:
        proc.kill()
    assert proc.returncode == 0, log[-3000:]
    assert "docker host stalled stopped answering" in log and "--resume" not in log, log[-3000:]
    metrics = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if m.get("phase") == "rl"] == list(range(1, steps + 1)), metrics
    trajs = [json.loads(ln) for ln in (out / "trajectories.jsonl").read_text().splitlines()]
    assert len(trajs) >= steps * 6, len(trajs)
