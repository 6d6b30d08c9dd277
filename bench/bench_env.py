"""Benchmark env.py: per-command round trip (persistent session vs a `docker exec` per command),
reset latency (cold container start vs warm pool) and grading (tests inline vs uploaded).
Targets: <= 2 ms per command, <= 50 ms warm reset. With --hosts, instead: episode start and reset
rates on one Docker host and on two (the second a dockerd beside the first, scripts/second_dockerd.py).

    python bench/bench_env.py [--commands 300] [--resets 10]
    python bench/bench_env.py --hosts 1 2 [--episodes 24] [--threads 8]
    python bench/bench_env.py --hang    # a second daemon that hangs (SIGSTOP) mid-rollout: the timeline
"""
import argparse
import os
import signal
import threading
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import env as E  # noqa: E402
import generated_tasks as G  # noqa: E402
import grading  # noqa: E402
from second_dockerd import Dockerd  # noqa: E402


def median_ms(fn, n):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), sorted(times)[int(0.9 * (n - 1))]


def grade_ms(env, task, setup: str, n: int) -> tuple[float, float]:
    """Median and p90 ms of grading.grade on n fresh episodes, each after the shell ran `setup`."""
    times = []
    for _ in range(n):
        with env.reset(task) as term:
            if setup:
                term.run(setup)
            t0 = time.perf_counter()
            grading.grade(term)
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), sorted(times)[int(0.9 * (n - 1))]


def host_rates(urls: list, tasks: list, episodes: int, threads: int) -> list:
    """Rows for one host list: cold starts (`episodes` resets at once on `threads` threads, held, then
    closed) and sustained reset → close cycles with a warm pool of 2 per host."""
    rows, n = [], len(urls)
    with E.Env(hosts=urls, warm=0) as env:
        with ThreadPoolExecutor(2 * n) as pool:  # the base image onto every host first (a load, not a start)
            for t in list(pool.map(env.reset, tasks[:2 * n])):
                t.close()
        env.host_stats()
        t0 = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            terms = list(pool.map(env.reset, [tasks[i % len(tasks)] for i in range(episodes)]))
        wall = time.perf_counter() - t0
        stats = env.host_stats()
        spread = " ".join(f"{h.name}:{sum(t.host is h for t in terms)}" for h in env._hosts.hosts)
        lat = " ".join(f"{h.name} {stats[f'hosts/{h.name}/start_s']:.2f}s" for h in env._hosts.hosts
                       if stats[f"hosts/{h.name}/start_s"] is not None)
        rows.append((f"{n} host(s): cold starts, {episodes} at once", f"{episodes / wall:.2f} /s",
                     f"{wall:.1f} s; spread {spread}; mean start {lat}"))
        t0 = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda t: t.close(), terms))
        rows.append((f"{n} host(s): removals", f"{episodes / (time.perf_counter() - t0):.2f} /s", ""))
    with E.Env(hosts=urls, warm=2) as env:
        env.warmup(tasks[:1])
        t0 = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda _: env.reset(tasks[0]).close(), range(episodes)))
        wall = time.perf_counter() - t0
        rows.append((f"{n} host(s): reset + close, warm pool 2/host", f"{episodes / wall:.2f} /s",
                     f"{wall:.1f} s"))
    return rows


def bench_hosts(args):
    tasks = G.generate_easy_tasks(8)
    second = Dockerd().start() if 2 in args.hosts else None
    try:
        rows = []
        for n in args.hosts:
            urls = (["unix:///var/run/docker.sock,name=main"]
                    + ([f"{second.url},name=second"] if n == 2 else []))
            rows += host_rates(urls, tasks, args.episodes, args.threads)
    finally:
        if second:
            second.remove()
    print(f"\n{'measurement':<46} {'rate':>10}  detail")
    for name, rate, detail in rows:
        print(f"{name:<46} {rate:>10}  {detail}")
    print(f"\n{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f} at the end "
          "(both daemons of the 2-host rows share this machine)")


def bench_hang():
    """Timeline of a rollout whose second host hangs (SIGSTOP: no refusal, no answer) mid-command."""
    import rollout as R  # costly (torch): only this mode needs episodes
    from policy import ScriptedPolicy
    import tiny
    tok = tiny.train_tokenizer(tiny.default_corpus(), 4096)
    second, t0, marks = Dockerd().start(), time.time(), []
    try:
        with E.Env(hosts=["unix:///var/run/docker.sock,capacity=2,name=main",
                          f"{second.url},capacity=2,name=second"]) as env, \
                ScriptedPolicy(tok, "fixed", latency_s=0.05, commands=["sleep 3; echo ok"]) as policy:
            sec, out = env._hosts.hosts[1], {}
            cfg = R.RolloutConfig(max_turns=4, num_workers=4, group_size=1, command_timeout_s=5)
            th = threading.Thread(target=lambda: out.update(
                t=R.collect(G.generate_easy_tasks(4), policy, env, cfg, progress=False)))
            th.start()
            while sum(t.host is sec and t.task is not None and not t.closed for t in list(env._terms)) < 2:
                time.sleep(0.05)
            time.sleep(1.0)
            marks.append((time.time(), "SIGSTOP to the second dockerd (2 episodes run there)"))
            os.kill(second.proc.pid, signal.SIGSTOP)
            th.join()
            marks.append((time.time(), "collect returned: " + ", ".join(t.finish_reason for t in out["t"])))
            os.kill(second.proc.pid, signal.SIGCONT)
            marks.append((time.time(), "SIGCONT"))
            while not sec.up:
                time.sleep(0.1)
            marks += [(t, f"Env: host {name} {what[:90]}") for t, name, what in env._hosts.events]
    finally:
        os.kill(second.proc.pid, signal.SIGCONT)
        second.remove()
    for t, what in sorted(marks):
        print(f"{t - t0:7.2f}  {what}")
    print(f"load average {os.getloadavg()[0]:.1f}; "
          "episodes running it again log a line each above (termrl.rollout)")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--commands", type=int, default=300)
    ap.add_argument("--resets", type=int, default=10)
    ap.add_argument("--hosts", type=int, nargs="+", choices=[1, 2],
                    help="start and reset rates on 1 and/or 2 Docker hosts (the second started here)")
    ap.add_argument("--episodes", type=int, default=24, help="--hosts: containers per measurement")
    ap.add_argument("--threads", type=int, default=8, help="--hosts: resets at once")
    ap.add_argument("--hang", action="store_true",
                    help="the timeline of a second host that hangs mid-rollout")
    args = ap.parse_args()
    if args.hang:
        return bench_hang()
    if args.hosts:
        return bench_hosts(args)
    task = G.generate_easy_tasks(1)[0]
    rows = []
    with E.Env(warm=0) as env:
        term = env.reset(task)
        api = env.client.api
        assert term.run("echo hi").output == "hi\n"
        rows.append(("command: persistent session (Terminal.run)",
                     *median_ms(lambda: term.run("echo hi"), args.commands)))

        def sdk_exec():
            ex = api.exec_create(term.id, ["bash", "-c", "echo hi"])
            api.exec_start(ex["Id"])
            api.exec_inspect(ex["Id"])  # the exit code, which an agent needs too
        rows.append(("command: docker exec per command (SDK)",
                     *median_ms(sdk_exec, max(10, args.commands // 10))))
        cli = ["docker", "exec", term.id, "bash", "-c", "echo hi"]
        rows.append(("command: `docker exec` CLI per command", *median_ms(
            lambda: subprocess.run(cli, capture_output=True, check=True), max(10, args.commands // 20))))
        term.close()

        def cold():
            env.reset(task).close()
        rows.append(("reset: cold (create + start + attach + setup)", *median_ms(cold, args.resets)))
        # grading a fresh episode (its reset not timed): the host writes the tests into the container
        rows.append(("grade: an episode's end, no process left", *grade_ms(env, task, "", args.resets)))
        # a server the agent left listening stays up: the tests run in a commit of the container beside it
        serve = ("nohup python3 -m http.server 8000 >/dev/null 2>&1 & "
                 "for _ in $(seq 100); do grep -q ' 0A ' /proc/net/tcp* && break; sleep 0.1; done")
        rows.append(("grade: a service left running (grading container)",
                     *grade_ms(env, task, serve, args.resets)))
        # the agent made /tests: rm and mkdir in the container, the tests in by put_archive
        rows.append(("grade: /tests left by the agent (rm, put_archive)",
                     *grade_ms(env, task, "mkdir /tests", args.resets)))
    with E.Env(warm=2) as env:
        env.warmup([task])
        warm_times = []
        for _ in range(args.resets):
            env.warmup([task])  # let the pool refill between resets, as it does between episodes
            t0 = time.perf_counter()
            term = env.reset(task)
            warm_times.append((time.perf_counter() - t0) * 1e3)
            term.close()
        rows.append(("reset: warm pool (setup only)", statistics.median(warm_times),
                     sorted(warm_times)[int(0.9 * (len(warm_times) - 1))]))
    print(f"\n{'measurement':<50} {'median ms':>10} {'p90 ms':>10}")
    for name, med, p90 in rows:
        print(f"{name:<50} {med:>10.2f} {p90:>10.2f}")
    print("\ntargets: persistent session <= 2 ms per command; warm reset <= 50 ms")


if __name__ == "__main__":
    main()
