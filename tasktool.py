"""tasktool.py — checks task folders and opens them: curation (`validate`) and a human shell (`shell`).

    python tasktool.py validate tasks/ [--k 3] [--json out.json]   # curation: oracle passes, no-op fails
    python tasktool.py shell tasks/<name>                          # a human shell in a task's container
"""
from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import json
import os
import re
import sys
import time
from pathlib import Path

from container import CAPS, LABEL, BuildError, InfraError
from env import Env
from generated_tasks import generate_easy_tasks, generate_multistep_tasks
from grading import Grade, grade
from hosts import HostsDown
from task_folders import Task, TaskError, load_task, oracle_commands, task_dirs


def run_oracle(env: Env, task: Task, noop: bool = False, trace_reads: bool = False) -> Grade:
    """One episode where the oracle's commands (or nothing) are typed into the terminal, then graded
    (trace_reads: Grade.image_reads says which of the image's files the tests read)."""
    with env.reset(task) as term:
        for cmd in ([] if noop else oracle_commands(task)):
            term.run(cmd, timeout=min(task.agent_timeout_s, 600))
        term.trace_reads = trace_reads
        return grade(term)


def validate_task(env: Env, path, k: int = 3, flake_runs: int = 0, load: int = 4) -> dict:
    """The paper's instance filter: the oracle passes k times in a row and doing nothing fails; then
    flake_runs more oracle episodes, `load` at a time, give the flake rate a 1-in-10 flake shows in."""
    row = {"task": Path(path).name if not isinstance(path, Task) else path.name, "status": "ok",
           "oracle": [], "noop": None, "build_s": None, "error": None, "flake_rate": None}
    try:
        task = path if isinstance(path, Task) else load_task(path)
        t0 = time.monotonic()
        env.image(task)
        row["build_s"] = round(time.monotonic() - t0, 2)
        g = run_oracle(env, task, noop=True)
        if g.infra_error:
            raise InfraError(f"no-op run: {g.infra_error}")
        row["noop"] = g.reward
        truth = []
        for i in range(k):
            g = run_oracle(env, task, trace_reads=i == 0)
            if i == 0:
                truth = [p for p in g.image_reads
                         if not any(fnmatch.fnmatch(p, x) for x in task.tests_read_ok)]
            if g.infra_error:
                raise InfraError(f"oracle run: {g.infra_error}")
            row["oracle"].append(g.reward)
            if g.tampered:
                row["status"], row["error"] = "oracle_flagged", (
                    f"the oracle's episode is flagged as tampering: {g.tampered}; list the paths its "
                    "solution must change in verifier_changes_ok, or set keep_agent_processes if its tests "
                    "need a service it started")
                return row
            if not g.passed and not task.keep_agent_processes and \
                    run_oracle(env, dataclasses.replace(task, keep_agent_processes=True)).passed:
                row["status"], row["error"] = "needs_service", (
                    "the oracle passes only when its tests run in the container of the processes it started "
                    "(tests that read files a service writes while they run; a service they only talk to "
                    "stays up by default): set keep_agent_processes: true; the agent's daemons then share "
                    "the tests' container (docs/grading-integrity.md)")
                return row
            if not g.passed:
                row["error"] = "oracle failed: " + g.output[-600:]
                break
        if not row["error"] and flake_runs:
            from concurrent.futures import ThreadPoolExecutor
            with ThreadPoolExecutor(load) as pool:
                grades = list(pool.map(lambda _: run_oracle(env, task), range(flake_runs)))
            failed = [g for g in grades if not g.passed]
            row["flake_rate"] = len(failed) / flake_runs
            if failed:
                row["error"] = (f"oracle failed {len(failed)} of {flake_runs} runs under load {load}: "
                                + (failed[0].infra_error or failed[0].output[-600:]))
        if row["error"]:
            row["status"] = "oracle_fails" if len(row["oracle"]) == 1 and not row["flake_rate"] else "flaky"
        elif row["noop"] and row["noop"] > 0:
            row["status"], row["error"] = "noop_passes", "doing nothing already earns reward"
        elif truth:
            row["status"], row["error"] = "truth_in_reach", (
                f"the tests read {', '.join(truth[:5])}: file(s) of the image that the agent can rewrite "
                "(the oracle left them as they were), so a verdict that depends on them can be forged; "
                "ship what the tests compare against in tests/ (copied in only at grading) or compute it in "
                "the tests, or list the task's inputs the tests may read in tests_read_ok "
                "(docs/grading-integrity.md)")
    except TaskError as e:
        row["status"], row["error"] = "malformed", str(e)
    except BuildError as e:  # the task's own Dockerfile: a defect of the task, with the build log's tail
        row["status"], row["error"] = "build_fails", str(e)
        if UNREACHABLE.search(str(e)):  # ... unless this machine could not reach a registry or mirror
            row["status"], row["error"] = "infra_error", (
                f"this machine could not reach a registry (or the network) while building: {e}; check its "
                "DNS, proxy and registry access (env.build_network), then validate again")
    except InfraError as e:
        row["status"], row["error"] = "infra_error", str(e)
    return row


# What a build prints when the network between this machine and a registry fails (a pull of FROM, or
# a RUN's download): the machine's fault, not the task's (tests/test_real_tasks.py).
UNREACHABLE = re.compile(r"dial tcp|no such host|i/o timeout|connection refused|TLS handshake timeout|"
                         r"Temporary failure (in name resolution|resolving)|Could not resolve host|"
                         r"network is unreachable|no route to host|Name or service not known", re.I)


def _validate_main(args) -> int:
    from concurrent.futures import ThreadPoolExecutor
    from tqdm import tqdm
    paths = task_dirs(args.tasks)
    if args.easy:
        paths += generate_easy_tasks(args.easy, split="train")
    if args.multistep:
        paths += generate_multistep_tasks(args.multistep, split="train")
    if not paths:
        print(f"no tasks found under {args.tasks}", file=sys.stderr)
        return 2
    with (Env(max_concurrent_starts=args.jobs, **_env_kwargs(args)) as env,
          ThreadPoolExecutor(args.jobs) as pool):
        rows = list(tqdm(pool.map(lambda p: validate_task(env, p, args.k, args.flake_runs, args.load), paths),
                         total=len(paths), desc="validate", unit="task"))
    w = max(len(r["task"]) for r in rows)
    print(f"\n{'task':<{w}}  {'status':<14} {'build_s':>7}  {'noop':>4}  {'flake':>5}  oracle")
    for r in rows:
        oracle = " ".join(f"{x:g}" for x in r["oracle"]) or "-"
        flake = f"{r['flake_rate']:.0%}" if r["flake_rate"] is not None else "-"
        print(f"{r['task']:<{w}}  {r['status']:<14} {r['build_s'] if r['build_s'] is not None else '-':>7}  "
              f"{r['noop'] if r['noop'] is not None else '-':>4}  {flake:>5}  {oracle}")
    bad = [r for r in rows if r["status"] != "ok"]
    for r in bad:
        print(f"\n{r['task']}: {r['status']}: {r['error']}")
    print(f"\n{len(rows) - len(bad)}/{len(rows)} tasks ok")
    if args.json:
        Path(args.json).write_text(json.dumps({"k": args.k, "tasks": rows}, indent=2))
        print(f"wrote {args.json}")
    return 1 if bad else 0


def _env_kwargs(args) -> dict:
    return {"build_network": args.build_network, "agent_network": args.agent_network,
            "grading_network": args.grading_network, "hosts": args.docker_host}


def _shell_main(args) -> int:
    task = load_task(args.task)
    with Env(**_env_kwargs(args)) as env:
        image = env.image(task)  # on the first live host, where the shell then runs
        net = env.network(task)
        spec = env.live_host().spec
    tls = spec.tls and ["--tlsverify", *[f"--tls{k}={spec.tls}/{f}" for k, f in
                                         [("cacert", "ca.pem"), ("cert", "cert.pem"), ("key", "key.pem")]]]
    cmd = ["docker", *(["-H", spec.url] if spec.url else []), *(tls or []),
           "run", "--rm", "-i" + ("t" if sys.stdin.isatty() else ""), "--network", net,
           *[f"-e{k}={v}" for k, v in task.env.items()],
           "--label", f"{LABEL}=1", "--cap-drop", "ALL", *[f"--cap-add={c}" for c in CAPS],
           "--memory", f"{task.memory_mb}m", "--pids-limit", str(task.pids), "-w", task.workdir,
           "--entrypoint", "bash", image]
    # the whole instruction, line by line as written (code blocks in it stay intact): the human
    # is here to do the task, and a cut-off instruction hides what the tests check
    instruction = "\n".join(f"#   {line}".rstrip() for line in task.instruction.strip().splitlines())
    print(f"# {task.name}:\n{instruction}\n# {' '.join(cmd)}", file=sys.stderr)
    os.execvp("docker", cmd)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("validate", help="build every task; check oracle passes k times and no-op fails")
    v.add_argument("tasks", help="a task dir, a dir of task dirs, or a task-list file")
    v.add_argument("--k", type=int, default=3, help="oracle runs that must all pass (determinism)")
    v.add_argument("--json", help="write the per-task results here")
    v.add_argument("--jobs", type=int, default=2, help="tasks validated in parallel")
    v.add_argument("--easy", type=int, default=0, help="also validate this many generated easy tasks")
    v.add_argument("--multistep", type=int, default=0,
                   help="also validate this many generated multi-step tasks")
    v.add_argument("--flake-runs", type=int, default=0,
                   help="after k passes, this many more oracle runs; a 1-in-10 flake needs ~30 to show")
    v.add_argument("--load", type=int, default=4,
                   help="the flake runs go this many at a time (concurrent load)")
    s = sub.add_parser("shell", help="open an interactive shell in a task's container")
    s.add_argument("task")
    for p in (v, s):
        p.add_argument("--build-network", default="default",
                       help="network of image builds: default (the daemon's), none, or a network name")
        p.add_argument("--agent-network", default="none",
                       help="network of the agent's container for tasks that allow_internet "
                            "(none: always offline)")
        p.add_argument("--grading-network", default="default",
                       help="network joined for grading, after the agent's processes are gone, "
                            "by tasks whose tests_need_network")
        p.add_argument("--docker-host", action="append", default=[], metavar="URL[,capacity=N][,tls=DIR]",
                       help="a Docker host for the containers "
                            "(repeatable; unix://, ssh://, or tcp:// with tls=); "
                            "default: DOCKER_HOST's daemon alone")
    args = ap.parse_args(argv)
    try:
        return _validate_main(args) if args.cmd == "validate" else _shell_main(args)
    except (TaskError, InfraError, HostsDown, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
