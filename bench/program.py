"""The multi-step evidence, run to the end in the background: a queue of training runs in priority
order, one at a time, each resumable. A finished run (summary.txt, its last checkpoint at
train.steps) is skipped, a stopped one resumed with train.py --resume, a missing one started:
compare_algos.run_action's rule. Kill it at any moment and start it again with the same command.

    nice -n 19 nohup python bench/program.py >> runs/program.log 2>&1 &    # start or resume
    python bench/program.py --list                                        # the queue, each job's state
    touch runs/program.stop                                               # stop after the current job

Run it from a worktree of a fixed commit, so code changed in the main checkout meanwhile does not
leak into a half-done series (the commit is logged at every start). A second driver on the same
runs/ is refused (runs/program.lock). A job that fails is logged and left for the next start; the
queue goes on with the next one.

The queue: the SFT curve of configs/smollm2-multistep.yaml (seed 0; the SFT budget against
val_oracle_prob and held-out success of the SFT-only policy: train.steps=0, whose step-0 eval is
that policy's), then the comparisons (bench/compare_algos.py) that branch RL recipes and the
continued-SFT control from per-seed SFT checkpoints.
"""
import argparse
import fcntl
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import config  # noqa: E402
from compare_algos import run_action  # noqa: E402

MULTISTEP = "configs/smollm2-multistep.yaml"
# SFT without early stop: the budget is the variable. The run name carries the budget, as
# compare_algos names its per-seed SFT runs, so a comparison at one of these budgets finds its
# seed-0 SFT run already done.
SFT_CURVE = [60, 150, 100, 30]  # the config's budget first: the headline's fallback start


def sft_job(steps: int, seed: int) -> tuple:
    sets = [f"sft.steps={steps}", "sft.stop_at_val_prob=0", "train.steps=0", f"seed={seed}",
            f"run_name=smollm2-multistep-sft{steps}-seed{seed}"]
    return ("train", MULTISTEP, sets)


JOBS = [sft_job(n, 0) for n in SFT_CURVE]


def log(msg: str):
    print(time.strftime("%Y-%m-%d %H:%M:%S"), msg, flush=True)


def train_job(cfg_path: str, sets: list) -> tuple[str, list | None]:
    """(the run's state, the command that moves it on, None when it is finished)."""
    cfg = config.load_config(ROOT / cfg_path, sets)
    action = run_action(ROOT / cfg.out_dir, cfg.train.steps)
    if action == "summarise":
        return f"{cfg.out_dir}: finished", None
    cmd = [sys.executable, "train.py", "--config", cfg_path] + [a for kv in sets for a in ("--set", kv)]
    return f"{cfg.out_dir}: {action}", cmd + (["--resume"] if action == "resume" else [])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--list", action="store_true", help="print the queue and each job's state; run nothing")
    args = ap.parse_args(argv)
    runs = ROOT / "runs"
    runs.mkdir(exist_ok=True)
    if args.list:
        for kind, cfg_path, sets in JOBS:
            print(train_job(cfg_path, sets)[0] if kind == "train" else f"compare {' '.join(sets)}")
        return
    lock = open(runs / "program.lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise SystemExit(f"another driver holds {runs / 'program.lock'}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    log(f"driver start: {ROOT} at {commit}, {len(JOBS)} jobs")
    failed = 0
    for kind, cfg_path, sets in JOBS:
        if (runs / "program.stop").exists():
            log("runs/program.stop is there: stopping before the next job (remove it to go on)")
            break
        if kind == "train":
            state, cmd = train_job(cfg_path, sets)
        else:  # a comparison resumes and skips its own runs
            state, cmd = f"compare {' '.join(sets)}", [sys.executable, "bench/compare_algos.py", *sets]
        if cmd is None:
            log(state + ", skipped")
            continue
        # each job's own output (progress bars included) in a file of its own: this log stays a list
        out = runs / "program.d" / (next((s.split("=", 1)[1] for s in sets if s.startswith("run_name=")),
                                         f"job{JOBS.index((kind, cfg_path, sets))}") + ".log")
        out.parent.mkdir(exist_ok=True)
        log(state + f": $ {' '.join(cmd)}  (output: {out})")
        t0 = time.time()
        with open(out, "a") as f:
            rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode
        log(f"exit {rc} after {(time.time() - t0) / 60:.1f} min (under load): {state}")
        failed += rc != 0
    log(f"driver end: {failed} job(s) failed")


if __name__ == "__main__":
    main()
