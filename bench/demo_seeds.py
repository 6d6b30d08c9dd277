"""The CPU demo over several seeds: held-out success at the SFT-only start and at the end of RL,
per seed, then the mean and spread of the gain (the figure the README reports).

    python bench/demo_seeds.py                      # seeds 0 1 2 of configs/tiny.yaml (~13 min each)
    python bench/demo_seeds.py --seeds 0 1 --config configs/tiny.yaml --set train.steps=4
    python bench/demo_seeds.py --no-run             # only summarise runs/<name>-seed<S> already there
"""
import argparse
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import config  # noqa: E402


def held_out(run_dir: Path) -> dict:
    """Eval success by RL step (metrics.jsonl) and the last process's wall time (summary.txt)."""
    evals = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("phase") == "eval":
            evals[rec["step"]] = rec["success"]
    summary = run_dir / "summary.txt"
    m = re.search(r"wall ([\d.]+) min", summary.read_text()) if summary.exists() else None
    return {"evals": evals, "wall_s": float(m.group(1)) * 60 if m else None}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(ROOT / "configs" / "tiny.yaml"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="passed on to train.py")
    ap.add_argument("--no-run", action="store_true", help="summarise existing runs only")
    args = ap.parse_args(argv)
    base = config.load_config(args.config, args.set)
    rows = []
    for seed in args.seeds:
        name = f"{base.run_name}-seed{seed}"
        run_dir = Path(config.load_config(args.config, args.set + [f"run_name={name}"]).out_dir)
        if not args.no_run:
            # the seed's own keys go last: a --set run_name=X names the series, it must not merge its runs
            cmd = [sys.executable, str(ROOT / "train.py"), "--config", args.config] + [
                a for kv in args.set + [f"seed={seed}", f"run_name={name}"] for a in ("--set", kv)]
            print("$", " ".join(cmd), flush=True)
            subprocess.run(cmd, check=True, cwd=ROOT)
        if not (run_dir / "metrics.jsonl").exists():
            raise SystemExit(f"{run_dir}/metrics.jsonl not found: run without --no-run first")
        h = held_out(run_dir)
        if len(h["evals"]) < 2:
            raise SystemExit(f"{run_dir}: fewer than two evals logged (is eval.at_start on and the run finished?)")
        first, last = min(h["evals"]), max(h["evals"])
        rows.append((seed, h["evals"][first], h["evals"][last], last, h["wall_s"]))
    print(f"\n{'seed':>4} {'start':>7} {'end':>7} {'gain':>7} {'steps':>5} {'wall':>7}")
    for seed, s, e, steps, wall in rows:
        w = f"{wall / 60:.1f}m" if wall else "-"
        print(f"{seed:>4} {s:>7.1%} {e:>7.1%} {e - s:>+7.1%} {steps:>5} {w:>7}")
    gains = [e - s for _, s, e, _, _ in rows]
    spread = statistics.stdev(gains) if len(gains) > 1 else 0.0
    print(f"mean gain {statistics.mean(gains):+.1%} (sd {spread:.1%}, min {min(gains):+.1%}, max {max(gains):+.1%}) "
          f"over {len(gains)} seeds; start {statistics.mean(r[1] for r in rows):.1%} -> "
          f"end {statistics.mean(r[2] for r in rows):.1%}")


if __name__ == "__main__":
    main()
