"""GRPO against IPA, with and without chunk-level initialised resampling: the same config, tasks,
budget and seeds under each algorithm; held-out success at every eval step, mean and spread over
the seeds, as a markdown table (printed and written) and a PNG. The paper's claims it tests:
chunk-level IPA beats token-level GRPO-style training (its Fig. 10), and starting episodes from
expert chunks speeds learning (its Fig. 13).

    python bench/compare_algos.py                            # configs/tiny.yaml, seeds 0 1 2, 3 variants
    python bench/compare_algos.py --seeds 0 --set train.steps=2 --set eval.num_tasks=4   # a smoke test
    python bench/compare_algos.py --no-run                   # only summarise the runs already there

Each variant is `--set` overrides on top of --config (printed with the table); everything else
(model, SFT warm start, lr, steps, tasks, eval) is the config's, identical across variants.
Runs go to the config's out_dir under run_name <run_name>-<variant>-seed<S>; a run directory that
exists is never overwritten (train.py refuses), so rerun with --no-run to summarise it.
"""
import argparse
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import config  # noqa: E402
from demo_seeds import held_out  # noqa: E402

# The algorithm keys each variant sets; the config supplies the rest. GRPO is tiny-grpo.yaml's algo
# block: token PPO-clip, group-normalised advantages, no chunk discount, token-level truncated IS.
# The IPA variants keep the config's algo block (configs/tiny.yaml: IPA, Eq. 9) with loss ipa.
VARIANTS = {
    "grpo": ["algo.loss=ppo", "algo.baseline=grpo", "algo.std_normalize=true", "algo.negative_reward=0.0",
             "algo.gamma=1.0", "algo.mismatch=token_tis", "algo.agg=token_mean", "rollout.prefill_prob=0.0"],
    "ipa": ["algo.loss=ipa", "rollout.prefill_prob=0.0"],
    "ipa-prefill": ["algo.loss=ipa", "rollout.prefill_prob=0.5"],
    "ipa-prefill-refresh": ["algo.loss=ipa", "rollout.prefill_prob=0.5", "rollout.refresh_expert=true"],
}
DEFAULT_VARIANTS = ["grpo", "ipa", "ipa-prefill"]


def table(curves: dict) -> str:
    """Markdown: one row per eval step, one column per variant, 'mean ± sd (n seeds)'."""
    steps = sorted({s for runs in curves.values() for evals in runs for s in evals})
    lines = ["| step | " + " | ".join(curves) + " |", "|---:|" + "---:|" * len(curves)]
    for s in steps:
        cells = []
        for runs in curves.values():
            xs = [evals[s] for evals in runs if s in evals]
            sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
            cells.append(f"{statistics.mean(xs):.1%} ± {sd:.1%} ({len(xs)})" if xs else "-")
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(curves: dict, out: Path) -> str:
    """Mean held-out success per variant with a ±1 sd band and each seed's curve faint."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no PNG: matplotlib not installed (pip install matplotlib)"
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, runs in curves.items():
        steps = sorted({s for evals in runs for s in evals})
        xs = [[evals[s] for evals in runs if s in evals] for s in steps]
        mean = [statistics.mean(x) for x in xs]
        sd = [statistics.stdev(x) if len(x) > 1 else 0.0 for x in xs]
        line, = ax.plot(steps, mean, marker="o", label=f"{name} ({len(runs)} seeds)")
        ax.fill_between(steps, [m - d for m, d in zip(mean, sd)], [m + d for m, d in zip(mean, sd)],
                        color=line.get_color(), alpha=0.15)
        for evals in runs:
            ax.plot(sorted(evals), [evals[s] for s in sorted(evals)], color=line.get_color(), alpha=0.25, lw=0.8)
    ax.set_xlabel("RL step")
    ax.set_ylabel("held-out success")
    ax.set_ylim(-0.02, 1.02)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return f"plot: {out}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(ROOT / "configs" / "tiny.yaml"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, choices=list(VARIANTS))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="passed on to train.py for every variant (e.g. a shorter budget)")
    ap.add_argument("--out", default=None, help="where the table and PNG go (default: runs/compare-<run_name>)")
    ap.add_argument("--no-run", action="store_true", help="summarise existing runs only")
    args = ap.parse_args(argv)
    args.config = str(Path(args.config).resolve())  # train.py runs from the repository root
    base = config.load_config(args.config, args.set)
    out = Path(args.out or ROOT / "runs" / f"compare-{base.run_name}")
    curves, used = {}, {}
    for name in args.variants:
        curves[name] = []
        for seed in args.seeds:
            # the run's own keys go last: the variant's algorithm and the seed are what differ
            sets = args.set + VARIANTS[name] + [f"seed={seed}", f"run_name={base.run_name}-{name}-seed{seed}"]
            cfg = config.load_config(args.config, sets)  # a bad override fails here, before any run
            rcfg = config.rollout_cfg(cfg)
            used[name] = {**{f"algo.{k}": v for k, v in config.algo_cfg(cfg).__dict__.items()},
                          "rollout.prefill_prob": rcfg.prefill_prob, "rollout.refresh_expert": rcfg.refresh_expert}
            run_dir = ROOT / cfg.out_dir
            if not args.no_run:
                cmd = [sys.executable, str(ROOT / "train.py"), "--config", args.config] + [
                    a for kv in sets for a in ("--set", kv)]
                print("$", " ".join(cmd), flush=True)
                subprocess.run(cmd, check=True, cwd=ROOT)
            if not (run_dir / "metrics.jsonl").exists():
                raise SystemExit(f"{run_dir}/metrics.jsonl not found: run without --no-run first")
            evals = held_out(run_dir)["evals"]
            if not evals:
                raise SystemExit(f"{run_dir}: no eval logged (set eval.every or eval.at_start, and data.eval_tasks)")
            curves[name].append(evals)
    out.mkdir(parents=True, exist_ok=True)
    keys = sorted({k for u in used.values() for k in u})
    differ = [k for k in keys if len({repr(u.get(k)) for u in used.values()}) > 1]
    md = [f"Held-out success (mean ± sd over seeds {args.seeds}) by RL step; config {args.config}"
          + (f" with {' '.join(args.set)}" if args.set else "") + ".", "", table(curves), "",
          "Keys that differ between the variants:", "",
          "| key | " + " | ".join(used) + " |", "|---|" + "---|" * len(used)]
    md += [f"| {k} | " + " | ".join(str(u.get(k)) for u in used.values()) + " |" for k in differ]
    text = "\n".join(md) + "\n"
    (out / "compare.md").write_text(text)
    print("\n" + text)
    print(plot(curves, out / "compare.png"))
    print(f"table: {out / 'compare.md'}")


if __name__ == "__main__":
    main()
