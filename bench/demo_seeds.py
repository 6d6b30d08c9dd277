"""The CPU demo over several seeds: held-out success at the SFT-only start and at each eval of RL,
per seed, then the mean and spread of the gain: the demo table of docs/results.md, as it prints it.

    python bench/demo_seeds.py                      # seeds 0 1 2 of configs/tiny.yaml (~13 min each)
    python bench/demo_seeds.py --seeds 0 1 --config configs/tiny.yaml --set train.steps=4
    python bench/demo_seeds.py --no-run             # only summarise runs/<name>-seed<S> already there

After the table, from every seed's eval_trajectories.jsonl: success by task kind and turns per
episode (mean and distribution) at the first and the last eval, all seeds together.
"""
import argparse
import collections
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import config  # noqa: E402
from generated_tasks import task_kind  # noqa: E402


def held_out(run_dir: Path) -> dict:
    """Eval success and its 95% interval by RL step and where SFT stopped (metrics.jsonl), and the
    last process's wall time (summary.txt)."""
    evals, cis, sft = {}, {}, []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("phase") == "eval":
            evals[rec["step"]], cis[rec["step"]] = rec["success"], rec.get("success_ci")
        elif rec.get("phase") == "sft":
            sft.append(rec)
    last = max((r.get("restart", 0) for r in sft), default=0)
    sft = [r for r in sft if r.get("restart", 0) == last]  # the attempt RL started from
    val = [r for r in sft if "val_oracle_prob" in r]
    stop = (f"{val[-1]['step'] + 1} steps ({val[-1]['val_oracle_prob']:.3f})" if val  # steps log from 0
            else f"{sft[-1]['step'] + 1} steps" if sft else "no SFT")
    summary = run_dir / "summary.txt"
    m = re.search(r"wall ([\d.]+) min", summary.read_text()) if summary.exists() else None
    return {"evals": evals, "cis": cis, "sft_stop": stop, "wall_s": float(m.group(1)) * 60 if m else None}


def table(rows: list[dict]) -> str:
    """The demo table (markdown): one row per seed, then the means and the gain's sd.
    Gains are in points, from the unrounded successes."""
    steps = sorted(set().union(*(r["evals"] for r in rows)))
    later = [s for s in steps if s != steps[0]]
    head = ["seed", "SFT stopped after (val_oracle_prob)", "SFT-only start", *[f"RL step {s}" for s in later],
            "gain", "wall"]
    pct = lambda x: f"{x:.1%}" if x is not None else "-"  # noqa: E731
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        ev = r["evals"]
        wall = f"{r['wall_s'] / 60:.1f} min" if r["wall_s"] else "-"
        lines.append(f"| {r['seed']} | {r['sft_stop']} | " + " | ".join(pct(ev.get(s)) for s in steps)
                     + f" | {100 * r['gain']:+.1f} | {wall} |")
    gains = [r["gain"] for r in rows]
    sd = statistics.stdev(gains) if len(gains) > 1 else 0.0
    means = [statistics.mean(r["evals"][s] for r in rows if s in r["evals"]) for s in steps]
    lines.append("| mean (sd) | | " + " | ".join(pct(m) for m in means)
                 + f" | {100 * statistics.mean(gains):+.1f} ({100 * sd:.1f}) | |")
    return "\n".join(lines)


def episodes(run_dirs: list[Path]) -> str:
    """Success by kind and turns per episode at the first and the last eval, over all run_dirs (in
    sync mode an eval episode's policy_version is its RL step). The kind is the task name's last part."""
    at = collections.defaultdict(list)  # "first" | "last" -> episodes
    for d in run_dirs:
        eps = [json.loads(line) for line in (d / "eval_trajectories.jsonl").read_text().splitlines()
               if line.strip()]
        eps = [e for e in eps if e["valid"]]
        if eps:
            versions = sorted({e["policy_version"] for e in eps})
            for when, v in (("first", versions[0]), ("last", versions[-1])):
                at[when] += [e for e in eps if e["policy_version"] == v]
    kinds = sorted({task_kind(e["task_name"]) for eps in at.values() for e in eps})
    lines = ["| kind | first eval | last eval |", "|---|---|---|"]
    for k in kinds:
        cells = []
        for when in ("first", "last"):
            ks = [e for e in at[when] if task_kind(e["task_name"]) == k]
            cells.append(f"{sum(e['reward'] > 0 for e in ks)}/{len(ks)}")
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    for when in ("first", "last"):
        turns = collections.Counter(e["num_turns"] for e in at[when])
        n = sum(turns.values())
        mean = sum(t * c for t, c in turns.items()) / max(1, n)
        lines.append(f"\nturns per episode at the {when} eval: mean {mean:.2f} over {n} episodes; "
                     + ", ".join(f"{t}: {c}" for t, c in sorted(turns.items())))
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(ROOT / "configs" / "tiny.yaml"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="passed on to train.py")
    ap.add_argument("--no-run", action="store_true", help="summarise existing runs only")
    args = ap.parse_args(argv)
    base = config.load_config(args.config, args.set)
    rows, dirs = [], []
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
            raise SystemExit(f"{run_dir}: fewer than two evals logged "
                             "(is eval.at_start on and the run finished?)")
        first, last = min(h["evals"]), max(h["evals"])
        rows.append({"seed": seed, **h, "gain": h["evals"][last] - h["evals"][first]})
        dirs.append(run_dir)
    print()
    print(table(rows))
    print()
    print(episodes(dirs))


if __name__ == "__main__":
    main()
