"""Benchmark env.py: per-command round trip (persistent session vs a `docker exec` per command),
reset latency (cold container start vs warm pool) and grading (tests inline vs uploaded).
Targets: <= 2 ms per command, <= 50 ms warm reset.

    python bench/bench_env.py [--commands 300] [--resets 10]
"""
import argparse
import dataclasses
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import env as E  # noqa: E402
import tasks as T  # noqa: E402


def median_ms(fn, n):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), sorted(times)[int(0.9 * (n - 1))]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--commands", type=int, default=300)
    ap.add_argument("--resets", type=int, default=10)
    args = ap.parse_args()
    task = T.generate_easy_tasks(1)[0]
    rows = []
    with E.Env(warm=0) as env:
        term = env.reset(task)
        api = env.client.api
        assert term.run("echo hi").output == "hi\n"
        rows.append(("command: persistent session (Terminal.run)", *median_ms(lambda: term.run("echo hi"), args.commands)))

        def sdk_exec():
            ex = api.exec_create(term.id, ["bash", "-c", "echo hi"])
            api.exec_start(ex["Id"])
            api.exec_inspect(ex["Id"])  # the exit code, which an agent needs too
        rows.append(("command: docker exec per command (SDK)", *median_ms(sdk_exec, max(10, args.commands // 10))))
        cli = ["docker", "exec", term.id, "bash", "-c", "echo hi"]
        rows.append(("command: `docker exec` CLI per command", *median_ms(
            lambda: subprocess.run(cli, capture_output=True, check=True), max(10, args.commands // 20))))
        term.close()

        def cold():
            env.reset(task).close()
        rows.append(("reset: cold (create + start + attach + setup)", *median_ms(cold, args.resets)))
        # grading: small suites travel inside the one grading exec; big ones take 2 execs + an upload
        big = dataclasses.replace(task, tests={**task.tests, "data.bin": bytes(E.INLINE_TESTS_MAX)})
        for name, t in [("grade: tests inside the grading command (1 exec)", task),
                        ("grade: tests uploaded by put_archive (2 execs)", big)]:
            term = env.reset(t)
            rows.append((name, *median_ms(term.grade, args.resets)))
            term.close()
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
