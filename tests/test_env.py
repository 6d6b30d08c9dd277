"""The terminal, grading and the Env against real Docker (terminal.py, grading.py, env.py, container.py):
the persistent shell, limits, hidden tests, grading, cleanup, loading."""
import dataclasses
import json
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

import container
import env as E
import generated_tasks as G
import grading
import task_folders as T
import tasktool
import terminal
from conftest import FIXTURE_TASKS, ROOT


# --- the persistent shell ----------------------------------------------------------------------

def test_state_persists_across_commands(docker_env, easy_tasks):
    with docker_env.reset(easy_tasks[0]) as term:
        assert term.run("pwd").output == "/app\n"
        r = term.run("cd /tmp && X=41; declare -A m; m[k]=v; f() { echo fn$1; }; false")
        assert r.exit_code == 1 and not r.timed_out
        r = term.run("echo $? $PWD $((X+1)) ${m[k]} $(f 7)")
        assert r.output == "1 /tmp 42 v fn7\n" and r.exit_code == 0
        term.run("sleep 300 & echo $! > /tmp/bg.pid")
        r = term.run("jobs; kill -0 $(cat /tmp/bg.pid) && echo bg-alive")
        assert "sleep 300" in r.output and "bg-alive" in r.output
        assert term.run("printf 'no newline'").output == "no newline"
        assert term.run("echo 'unterminated").exit_code == 2  # a syntax error must not hang the shell
        assert term.run("cat").output == ""                   # stdin is empty, not our protocol


def test_timeout_kills_command_not_session(docker_env, easy_tasks):
    with docker_env.reset(easy_tasks[1]) as term:
        term.run("X=kept; sleep 300 &")
        for cmd in ["echo started; sleep 300", "while true; do sleep 1; done",
                    "python3 -c 'while True: pass'"]:
            t0 = time.monotonic()
            r = term.run(cmd, timeout=1.5)
            assert r.timed_out and r.exit_code is None, cmd
            assert "timed out after 1.5s" in r.output and "still usable" in r.output, r.output
            # killed at its deadline, not left to finish (sleep 300) or hang (the loops); the bound is
            # the deadline plus a container under a parallel `validate` on 2 shared cores (~2 s idle)
            assert time.monotonic() - t0 < 60, cmd
        assert r.output  # the notice reaches the agent
        r = term.run("echo $X; jobs")
        assert r.output.startswith("kept\n") and "sleep 300" in r.output  # older background job survives
        assert term.run("exit 3").exit_code is None
        assert term.run("echo fresh").output == "fresh\n"  # a new shell replaced the exited one


def test_output_flood_is_capped(docker_env, easy_tasks):
    with docker_env.reset(easy_tasks[2]) as term:
        r = term.run("yes", timeout=20)
        assert r.timed_out and r.truncated
        assert "bytes of output omitted" in r.output and len(r.output) < terminal.OUTPUT_CAP + 500
        r = term.run("seq 1 200000")
        assert r.exit_code == 0 and r.truncated
        assert r.output.startswith("1\n2\n") and r.output.endswith("199999\n200000\n")
        r = term.run(r"printf 'ok \xff\xfe end\n'")
        assert r.output == "ok \ufffd\ufffd end\n"  # undecodable bytes replaced, never an exception
        assert term.run("echo fine").output == "fine\n"


def test_sandbox_network_caps_and_file_size(docker_env, easy_tasks):
    with docker_env.reset(easy_tasks[5]) as term:
        assert term.run("ls /sys/class/net").output.split() == ["lo"]
        r = term.run("python3 -c \"import socket; socket.create_connection(('10.1.2.3', 80), 3)\"")
        assert r.exit_code != 0 and "unreachable" in r.output.lower()
        assert term.run("mount -t tmpfs none /mnt").exit_code != 0        # no CAP_SYS_ADMIN
        assert term.run("ulimit -f").output == f"{E.FILE_SIZE_LIMIT // 1024}\n"
        # ...but what a root shell needs on its own files still works
        r = term.run("useradd -m bob && su bob -c 'touch /tmp/b' && chown bob /app && chmod 700 /app && "
                     "stat -c %U /tmp/b")
        assert r.output == "bob\n", r.output
    assert not docker_env.client.api.containers(all=True, filters={"id": term.id})  # closed = removed


# --- TB1 / TB2 tasks, hidden tests, grading ---------------------------------------------------

def test_tb1_task_hidden_tests_and_grade(docker_env):
    task = T.load_task(FIXTURE_TASKS / "tb1-hello")
    assert task.layout == "tb1" and task.workdir == "/app" and "run-tests.sh" in task.tests
    assert T.oracle_commands(task) == ["cat > /app/greeting.txt <<'TXT'\nhello termrl\nTXT",
                                       "echo done >> /app/seed.txt"]
    with docker_env.reset(task) as term:
        r = term.run("ls -A /tests 2>&1; find / -xdev \\( -name test_outputs.py -o -name 'solution*' "
                     "-o -name run-tests.sh \\) 2>/dev/null; cat /app/seed.txt")
        assert r.output == "ls: cannot access '/tests': No such file or directory\nseed\n", r.output
        g = grading.grade(term)
        assert (g.reward, g.passed, g.infra_error) == (0.0, False, None)
        assert g.tests == {"tests/test_outputs.py::test_greeting": "FAILED",
                           "tests/test_outputs.py::test_seed_appended": "FAILED"} or \
            set(g.tests.values()) == {"FAILED"}, g.tests
    with docker_env.reset(task) as term:
        for cmd in T.oracle_commands(task):
            assert term.run(cmd).exit_code == 0
        g = grading.grade(term)
        assert (g.reward, g.passed, g.infra_error) == (1.0, True, None), g.output
        assert len(g.tests) == 2 and set(g.tests.values()) == {"PASSED"}


def test_tb2_task_partial_reward_from_reward_txt(docker_env):
    task = T.load_task(FIXTURE_TASKS / "tb2-partial")
    assert task.layout == "tb2" and task.memory_mb == 512 and task.test_timeout_s == 30
    with docker_env.reset(task) as term:
        term.run("echo alpha > /app/a.txt")
        g = grading.grade(term)
        assert (g.reward, g.passed, g.infra_error) == (0.5, False, None), g
        assert g.tests == {"a": "PASSED", "b": "FAILED"}
    with docker_env.reset(task) as term:
        for cmd in T.oracle_commands(task):
            term.run(cmd)
        assert grading.grade(term).reward == 1.0


def test_tests_go_in_through_the_docker_api_with_the_same_grade(docker_env):
    """The tests go in by put_archive (docker's `extract-to-dir` event), never the container's own
    base64/tar, small or big, and with those deleted the grade is the same; a planted /tests is replaced."""
    import os
    task = G.generate_easy_tasks(1, seed=0, kinds=["create"])[0]
    big = dataclasses.replace(task, tests={**task.tests, "data.bin": os.urandom(64 << 10)})
    for t, sabotage in [(task, ""), (big, ""), (task, "rm -f /usr/bin/base64"), (task, "rm -f /usr/bin/tar")]:
        for solve, want in [(False, 0.0), (True, 1.0)]:
            since = int(time.time()) - 1
            with docker_env.reset(t) as term:
                term.run("mkdir -p /tests && printf 'exit 0\\n' > /tests/test.sh")  # must not count
                if solve:
                    term.run(t.solution)
                term.run(sabotage)
                g = grading.grade(term)
                events = docker_env.client.api.events(since=since, until=int(time.time()) + 1, decode=True,
                                                      filters={"container": term.id})
                assert (g.reward, g.infra_error) == (want, None), (sabotage, g.output)
                assert sum(e["Action"] == "extract-to-dir" for e in events) == 1, sabotage


def test_grading_infra_error_is_distinct_from_failure(docker_env, tmp_path):
    broken = shutil.copytree(FIXTURE_TASKS / "tb2-partial", tmp_path / "no-reward")
    (broken / "tests" / "test.sh").write_text("echo 'crashed before writing a reward'; exit 1\n")
    with docker_env.reset(T.load_task(broken)) as term:
        g = grading.grade(term)
        assert g.reward is None and g.infra_error and "reward.txt" in g.infra_error
    with docker_env.reset(T.load_task(FIXTURE_TASKS / "tb2-partial")) as term:
        docker_env.client.api.remove_container(term.id, force=True)  # the daemon loses the container
        g = grading.grade(term)
        assert g.reward is None and g.infra_error
    bad = dataclasses.replace(T.load_task(FIXTURE_TASKS / "tb1-hello"), name="bad-image",
                              dockerfile=None, image="termrl-no-such-image:latest")
    with pytest.raises(container.InfraError, match="not available locally"):
        docker_env.reset(bad)


# --- loading ------------------------------------------------------------------------------------

def _break(d, how):
    if how.startswith("rm:"):
        p = d / how[3:]
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    else:
        name, text = how.split("=", 1)
        (d / name).write_text(text)


@pytest.mark.parametrize("fixture,how,named", [
    ("tb1-hello", "task.yaml=instruction: [unclosed", "task.yaml"),
    ("tb1-hello", "task.yaml=difficulty: easy\n", "task.yaml"),
    ("tb1-hello", "task.yaml=max_agent_timeout_sec: soon\ninstruction: hi\n", "task.yaml"),
    ("tb1-hello", "rm:Dockerfile", "Dockerfile"),
    ("tb1-hello", "rm:run-tests.sh", "run-tests.sh"),
    ("tb1-hello", "rm:tests", "tests"),
    ("tb1-hello", "rm:solution.sh", "solution.sh"),
    ("tb2-partial", "task.toml=[verifier\ntimeout_sec = 3", "task.toml"),
    ("tb2-partial", "task.toml=[environment]\nmemory = \"lots\"\n", "task.toml"),
    ("tb2-partial", "rm:instruction.md", "instruction.md"),
    ("tb2-partial", "rm:environment/Dockerfile", "Dockerfile"),
    ("tb2-partial", "rm:tests/test.sh", "test.sh"),
    ("tb2-partial", "rm:solution/solve.sh", "solve.sh"),
])
def test_malformed_task_is_rejected_naming_the_file(tmp_path, fixture, how, named):
    d = shutil.copytree(FIXTURE_TASKS / fixture, tmp_path / fixture)
    _break(d, how)
    with pytest.raises(T.TaskError) as e:
        T.load_tasks(tmp_path)
    assert named in str(e.value) and str(d) in str(e.value), str(e.value)


def test_load_tasks_from_dir_and_list_file(tmp_path):
    assert [t.name for t in T.load_tasks(FIXTURE_TASKS)] == ["tb1-hello", "tb2-partial"]
    (tmp_path / "list.json").write_text(json.dumps({"tasks": [str(FIXTURE_TASKS / "tb2-partial")]}))
    (tmp_path / "list.txt").write_text(f"# one per line\n{FIXTURE_TASKS / 'tb1-hello'}\n")
    assert [t.name for t in T.load_tasks(tmp_path / "list.json")] == ["tb2-partial"]
    assert [t.name for t in T.load_tasks(tmp_path / "list.txt")] == ["tb1-hello"]
    (tmp_path / "orphan" / "tests").mkdir(parents=True)
    with pytest.raises(T.TaskError, match="neither task.yaml"):
        T.load_tasks(tmp_path)


def test_oracle_commands_split_top_level():
    task = T.Task(name="t", instruction="x", layout="generated", solution=(
        "#!/bin/bash\nset -euo pipefail\n# comment\n\nfor f in a b; do\n  echo $f\ndone\n"
        "if true; then\n  x=1\nfi\ncat <<EOF > out\nline\nEOF\npython3 - <<'PY'\nprint(1)\nPY\n"
        "echo 'a;b' # tail\nls \\\n  -l\n"))
    assert T.oracle_commands(task) == [
        "for f in a b; do\n  echo $f\ndone", "if true; then\n  x=1\nfi", "cat <<EOF > out\nline\nEOF",
        "python3 - <<'PY'\nprint(1)\nPY", "echo 'a;b' # tail", "ls \\\n  -l"]
    with pytest.raises(T.TaskError, match="does not parse"):
        T.oracle_commands(dataclasses.replace(task, solution="echo 'open\n"))


# --- generated tasks, concurrency, curation -----------------------------------------------------

def test_generated_family_splits_differ_and_are_deterministic():
    train, again = G.generate_easy_tasks(40, seed=0), G.generate_easy_tasks(40, seed=0)
    held = G.generate_easy_tasks(40, seed=0, split="heldout")
    assert [t.instruction for t in train] == [t.instruction for t in again]
    assert {t.metadata["kind"] for t in train} == set(G.EASY_KINDS)
    def words(tasks):
        text = " ".join(t.instruction + t.setup for t in tasks)
        return set(text.replace("/", " ").replace(".", " ").split())
    train_words, held_words = words(train), words(held)
    assert not (set(G._EASY_WORDS["heldout"]) | set(G._EASY_NAMES["heldout"])) & train_words
    assert held_words & set(G._EASY_WORDS["heldout"])
    rl_words = words(G.generate_easy_tasks(40, seed=0, split="rl"))  # RL's own split: neither's words
    assert rl_words & set(G._EASY_WORDS["rl"]) and not (train_words | held_words) & set(G._EASY_WORDS["rl"])
    assert not rl_words & (set(G._EASY_WORDS["train"]) | set(G._EASY_WORDS["heldout"]))
    assert G.generate_easy_tasks(7, seed=1)[0].instruction != train[0].instruction


def test_every_easy_kind_passes_oracle_and_fails_noop(docker_env):
    for task in [t for split in ("heldout", "rl") for t in G.generate_easy_tasks(len(G.EASY_KINDS), seed=3,
                                                                                 split=split)]:
        row = tasktool.validate_task(docker_env, task, k=1)
        assert row["status"] == "ok" and row["noop"] == 0.0 and row["oracle"] == [1.0], row


def test_eight_episodes_at_once(docker_env, easy_tasks):
    results, errors = {}, []

    def episode(task):
        try:
            results[task.name] = tasktool.run_oracle(docker_env, task)
        except Exception as e:  # surfaced below with its task
            errors.append((task.name, e))

    threads = [threading.Thread(target=episode, args=(t,)) for t in easy_tasks[:8]]
    for th in threads:
        th.start()
    for th in threads:  # the bound catches a deadlock between episodes, not slowness: 8 oracle
        th.join(900)     # episodes take ~20 s here idle, minutes on 2 cores under a parallel validate
        assert not th.is_alive(), "an episode is stuck (deadlock in Env.reset / Terminal.run?)"
    assert not errors and len(results) == 8, errors
    assert all(g.passed and g.reward == 1.0 for g in results.values()), results


def test_killed_parent_leaves_nothing_after_next_start(docker_env, easy_tasks):
    code = ("import sys, time; sys.path.insert(0, %r); import env as E, generated_tasks as G; e = E.Env();"
            "t = e.reset(G.generate_easy_tasks(1)[0]); print(t.id, flush=True); time.sleep(600)" % str(ROOT))
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        cid = child.stdout.readline().strip()
        assert cid, "child did not start a container"
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        client = docker_env.client
        assert client.api.containers(all=True, filters={"id": cid})  # the kill left it behind...
        with docker_env.reset(easy_tasks[9]) as ours:                  # ...while our own is live
            E.Env().close()                                            # the next start sweeps
            assert not client.api.containers(all=True, filters={"id": cid})
            assert ours.run("echo mine").output == "mine\n"  # a live run's containers are not touched
    finally:
        child.kill()


def test_sweep_spares_live_containers_of_another_pid_namespace(docker_env):
    """Bug: two nodes' trainers in containers that share the host's hostname (host networking) and
    its Docker daemon, each in its own pid namespace: each saw the other's pids as dead (or as
    another process), so the first sweep removed the other node's live containers. Here the other
    node is a process in a new pid namespace (`unshare`); it creates a container and lives on."""
    if subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True).returncode:
        pytest.skip("unshare --pid is not permitted here (needs root or CAP_SYS_ADMIN)")
    # no Env(): no sweep there
    code = ("import sys, time; sys.path.insert(0, %r); import docker, container as C, task_folders as T;"
            "c = docker.from_env().containers.create(T.BASE_IMAGE, 'true', labels=C.owner_labels());"
            "print(c.id, flush=True); time.sleep(600)" % str(ROOT))
    child = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", sys.executable,
                              "-c", code], stdout=subprocess.PIPE, text=True)
    client, cid = docker_env.client, ""
    try:
        cid = child.stdout.readline().strip()
        assert cid, "child did not create a container"
        container.sweep_stale(client)
        assert client.api.containers(all=True, filters={"id": cid}), \
            "the sweep removed a live process's container"
    finally:
        child.kill()
        child.wait(30)
        if cid:
            container.remove(client, cid)


def test_validate_cli_table_and_json(tmp_path):
    out = tmp_path / "v.json"
    r = subprocess.run([sys.executable, str(ROOT / "tasktool.py"), "validate", str(FIXTURE_TASKS), "--k", "2",
                        "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "tb1-hello" in r.stdout and "2/2 tasks ok" in r.stdout
    rows = {row["task"]: row for row in json.loads(out.read_text())["tasks"]}
    assert rows["tb2-partial"]["oracle"] == [1.0, 1.0] and rows["tb2-partial"]["noop"] == 0.0
    assert rows["tb1-hello"]["status"] == "ok"


def _bad_task(root, name, *, toml=None, solve=None, test=None):
    """A TB2 task in root/name, made from the tb2-partial fixture on the prebuilt base image (no
    build), with one file replaced."""
    d = shutil.copytree(FIXTURE_TASKS / "tb2-partial", root / name)
    shutil.rmtree(d / "environment")
    (d / "task.toml").write_text(toml or (d / "task.toml").read_text().replace(
        "[environment]", '[environment]\ndocker_image = "termrl-base:bookworm"'))
    if solve is not None:
        (d / "solution" / "solve.sh").write_text(solve)
    if test is not None:
        (d / "tests" / "test.sh").write_text(test)
    return d


# flaky: the oracle solves the task only before SWITCH (epoch seconds); the run that does so sleeps
# past SWITCH, so every later oracle run (fresh containers run one after the other) fails.
_FLAKY_SOLVE = """#!/bin/bash
now=$(date +%s)
if [ "$now" -lt SWITCH ]; then
  echo alpha > /app/a.txt; echo beta > /app/b.txt; sleep $((SWITCH + 1 - now)); fi
"""
# Before SWITCH, the CLI starts, the no-op run grades and the first oracle run begins: ~10 s on an
# idle 2-core machine; 45 s leaves room for a parallel validate and the rest of the suite.
FLAKY_MARGIN_S = 45


def test_validate_cli_gives_each_bad_task_its_verdict_and_fails(tmp_path):
    """One small bad task per verdict, validated in one CLI run: each gets its own status and the
    exit code is non-zero. Catches a verdict that never fires or is swapped for another (an
    oracle that fails after passing once called "oracle_fails", a no-op that earns reward called
    "ok", a harness crash counted as the task failing, a task's broken Dockerfile called an
    infrastructure error) and a CLI that exits 0 on bad tasks."""
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    _bad_task(tasks, "oracle-fails", solve="#!/bin/bash\necho alpha > /app/a.txt\n")  # half the work
    _bad_task(tasks, "noop-passes", test="#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    _bad_task(tasks, "harness-crash", test="#!/bin/bash\necho 'crashed before writing a reward'; exit 1\n")
    _bad_task(tasks, "malformed", toml="[verifier\ntimeout_sec = 3\n")
    build = shutil.copytree(FIXTURE_TASKS / "tb2-partial", tasks / "build-fails")  # its own Dockerfile
    (build / "environment" / "Dockerfile").write_text(
        "FROM termrl-base:bookworm\nRUN echo no such package >&2; exit 3\n")
    switch = int(time.time()) + FLAKY_MARGIN_S
    _bad_task(tasks, "flaky", solve=_FLAKY_SOLVE.replace("SWITCH", str(switch)))
    out = tmp_path / "v.json"
    r = subprocess.run([sys.executable, str(ROOT / "tasktool.py"), "validate", str(tasks), "--k", "2",
                        "--jobs", "6", "--json", str(out)], capture_output=True, text=True, timeout=600)
    rows = {row["task"]: row for row in json.loads(out.read_text())["tasks"]}
    status = {name: row["status"] for name, row in rows.items()}
    assert status == {"oracle-fails": "oracle_fails", "noop-passes": "noop_passes",
                      "harness-crash": "infra_error", "malformed": "malformed", "flaky": "flaky",
                      "build-fails": "build_fails"}, (status, r.stdout[-3000:])
    assert r.returncode == 1 and "0/6 tasks ok" in r.stdout, r.stdout + r.stderr
    assert rows["oracle-fails"]["oracle"] == [0.5] and rows["oracle-fails"]["noop"] == 0.0
    assert rows["flaky"]["oracle"] == [1.0, 0.0] and rows["flaky"]["noop"] == 0.0
    assert rows["noop-passes"]["noop"] == 1.0
    assert "reward.txt" in rows["harness-crash"]["error"] and "task.toml" in rows["malformed"]["error"]
    for name, row in rows.items():
        assert f"{name}: {row['status']}" in r.stdout  # each bad task's reason is printed


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "exception"])
def test_own_containers_removed_on_signal_or_crash(docker_env, how):
    code = ("import sys, time; sys.path.insert(0, %r); import env as E, generated_tasks as G; "
            "e = E.Env(warm=1);"
            "t = e.reset(G.generate_easy_tasks(1)[0]); e.warmup([t.task]); print(t.id, flush=True);"
            "sys.stdin.readline(); raise RuntimeError('crash')" % str(ROOT))
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        cid = child.stdout.readline().strip()
        pid_filter = {"label": f"termrl.pid={child.pid}"}
        # the episode's and the pool's
        assert cid and len(docker_env.client.api.containers(all=True, filters=pid_filter)) == 2
        if how == "exception":
            child.stdin.write("go\n")
            child.stdin.flush()
        else:
            child.send_signal(getattr(signal, how))
        assert child.wait(60) != 0
        assert not docker_env.client.api.containers(all=True, filters=pid_filter)
    finally:
        child.kill()
