"""GRPO against IPA and its ablations, or any variants of your own: the same config, tasks, budget
and seeds under each variant; held-out success at every eval step, mean and spread over the seeds,
as a markdown table (printed and written) and a PNG. The paper's claims it tests: chunk-level IPA
beats token-level training (its Fig. 10: "ipa" against "ipa-token", and against "grpo"), and
starting episodes from expert chunks speeds learning (its Fig. 13: "ipa-prefill"); "ipa-filter"
adds online difficulty filtering (train.filter_window).

    python bench/compare_algos.py                            # configs/tiny.yaml, seeds 0 1 2, 3 variants
    python bench/compare_algos.py --seeds 0 --set train.steps=2 --set eval.num_tasks=4   # a smoke test
    python bench/compare_algos.py --config configs/smollm2-multistep.yaml --variants ipa ipa-token ipa-prefill ipa-filter grpo
    python bench/compare_algos.py --variants ipa --variant lr-high=train.lr=5e-3,algo.gamma=0.9   # ipa, then yours
    python bench/compare_algos.py --no-run                   # only summarise the runs already there

Each variant is `--set` overrides on top of --config: a built-in one (VARIANTS) or your own,
`--variant NAME=key=val,key=val` (repeatable). Everything else (model, SFT warm start, lr, steps,
tasks, eval) is the config's, identical across variants. The table ends with a line per variant
naming the keys where it differs from the reference (`--reference`, default the first variant).
Variants run in the order given, seeds in increasing order. Runs go to the config's out_dir under
run_name <run_name>-<variant>-seed<S>; a comparison that was stopped picks up where it was: a
finished run (summary.txt, its last checkpoint at train.steps) is summarised, an unfinished one
resumed with train.py --resume, a missing one run.
"""
import argparse
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import config  # noqa: E402
import rundir  # noqa: E402
from demo_seeds import held_out  # noqa: E402

# The keys each variant sets; the config supplies the rest. GRPO is tiny-grpo.yaml's algo block:
# token PPO-clip, group-normalised advantages, no chunk discount, token-level truncated IS (it
# differs from "ipa" in several keys; the table names them). The IPA variants keep the config's
# algo block (configs/tiny.yaml: IPA, Eq. 9) with loss ipa, and each ablation differs from "ipa"
# in one key.
VARIANTS = {
    "grpo": ["algo.loss=ppo", "algo.baseline=grpo", "algo.std_normalize=true", "algo.negative_reward=0.0",
             "algo.gamma=1.0", "algo.mismatch=token_tis", "algo.agg=token_mean", "rollout.prefill_prob=0.0"],
    "ipa": ["algo.loss=ipa", "rollout.prefill_prob=0.0"],
    "ipa-token": ["algo.loss=ipa", "rollout.prefill_prob=0.0", "algo.level=token"],  # token ratios, masks, credit
    "ipa-prefill": ["algo.loss=ipa", "rollout.prefill_prob=0.5"],
    "ipa-prefill-refresh": ["algo.loss=ipa", "rollout.prefill_prob=0.5", "rollout.refresh_expert=true"],
    "ipa-filter": ["algo.loss=ipa", "rollout.prefill_prob=0.0", "train.filter_window=4"],
}
DEFAULT_VARIANTS = ["grpo", "ipa", "ipa-prefill"]
IGNORED = ("run_name", "out_dir", "seed", "rollout.seed")  # what differs between any two runs by design


def parse_variant(text: str) -> tuple[str, list[str]]:
    """`NAME=key=val,key=val` -> (NAME, ["key=val", ...]). A comma splits only before the next
    `key=`, so a value may hold commas (`train.adam_betas=[0.9,0.99]`)."""
    name, sep, sets = text.partition("=")
    if not sep or not re.fullmatch(r"[\w.-]+", name) or not sets:
        raise ValueError(f"--variant {text!r}: expected NAME=key=val[,key=val...], e.g. lr-high=train.lr=5e-3")
    pairs = re.split(r",(?=\s*[\w.]+=)", sets)
    if bad := [p for p in pairs if "=" not in p]:
        raise ValueError(f"--variant {text!r}: {bad[0]!r} is not key=val")
    return name, [p.strip() for p in pairs]


def resolved(cfg) -> dict:
    """Every setting a run uses, flat ("algo.gamma": 0.95, ...): the run config and the rollout /
    algo sections as their dataclasses fill them in, less what differs by design (IGNORED)."""
    flat = {}

    def walk(d, prefix):
        for k, v in d.items():
            if isinstance(v, dict) and k not in ("tiny", "extra", "rollout", "algo"):
                walk(v, prefix + k + ".")
            elif k not in ("rollout", "algo"):  # the raw sections: their dataclasses' values below
                flat[prefix + k] = v
    walk(config.config_to_dict(cfg), "")
    flat.update({f"rollout.{k}": v for k, v in vars(config.rollout_cfg(cfg)).items()})
    flat.update({f"algo.{k}": v for k, v in vars(config.algo_cfg(cfg)).items()})
    return {k: v for k, v in flat.items() if k not in IGNORED}


def differences(used: dict, reference: str) -> dict:
    """Per variant, [(key, its value, the reference's)] where they differ, in key order."""
    ref = used[reference]
    return {name: [(k, u.get(k), ref.get(k)) for k in sorted(set(u) | set(ref)) if repr(u.get(k)) != repr(ref.get(k))]
            for name, u in used.items()}


def diff_lines(used: dict, reference: str) -> list[str]:
    """A markdown line per variant saying which keys differ from the reference's."""
    out = []
    for name, diffs in differences(used, reference).items():
        if name == reference:
            out.append(f"- **{name}**: the reference")
        else:
            said = "; ".join(f"`{k}` {v} ({reference}: {r})" for k, v, r in diffs)
            out.append(f"- **{name}**: " + (said or f"no key differs from {reference}"))
    return out


def run_action(run_dir: Path, steps: int) -> str:
    """What a comparison does with one run: "summarise" a finished one (train.py wrote summary.txt
    and its last checkpoint is at train.steps), "resume" one that was stopped (train.py --resume
    continues from its newest intact checkpoint, or starts over when it has none), "run" a new one."""
    if not run_dir.is_dir() or not any(p.name != rundir.LOCK for p in run_dir.iterdir()):
        return "run"
    try:
        latest = rundir.latest_checkpoint(run_dir / "checkpoints")
    except RuntimeError:  # `latest` names a checkpoint cut short: --resume falls back past it
        latest = None
    done = latest is not None and int(latest.name.split("_")[1]) >= steps
    return "summarise" if done and (run_dir / "summary.txt").exists() else "resume"


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
    ap.add_argument("--variants", nargs="+", default=None,
                    help=f"built-in ({', '.join(VARIANTS)}) or --variant names, in the order to run "
                         f"(default: {' '.join(DEFAULT_VARIANTS)}); every --variant runs too, after them")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=KEY=VAL[,KEY=VAL]",
                    help="a variant of your own: --set overrides on top of --config (repeatable)")
    ap.add_argument("--reference", default=None, help="the variant the others are compared with (default: the first)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="passed on to train.py for every variant (e.g. a shorter budget)")
    ap.add_argument("--out", default=None, help="where the table and PNG go (default: runs/compare-<run_name>)")
    ap.add_argument("--no-run", action="store_true", help="summarise existing runs only")
    args = ap.parse_args(argv)
    variants = dict(VARIANTS)
    try:
        for text in args.variant:
            name, sets = parse_variant(text)
            if name in variants:
                raise ValueError(f"--variant {name}: that name is taken ({' '.join(variants[name])}); choose another")
            variants[name] = sets
    except ValueError as e:
        raise SystemExit(str(e))
    mine = [n for n in variants if n not in VARIANTS]
    names = list(dict.fromkeys((args.variants or DEFAULT_VARIANTS) + mine))  # the order given, once each
    if unknown := [n for n in names if n not in variants]:
        raise SystemExit(f"unknown variant {unknown[0]!r}; built in: {', '.join(VARIANTS)}"
                         + (f"; yours: {', '.join(mine)}" if mine else ""))
    reference = args.reference or names[0]
    if reference not in names:
        raise SystemExit(f"--reference {reference!r} is not among the variants run ({' '.join(names)})")
    seeds = sorted(set(args.seeds))
    args.config = str(Path(args.config).resolve())  # train.py runs from the repository root
    base = config.load_config(args.config, args.set)
    out = Path(args.out or ROOT / "runs" / f"compare-{base.run_name}")
    curves, used = {}, {}
    for name in names:
        curves[name] = []
        for seed in seeds:
            # the run's own keys go last: the variant's keys and the seed are what differ
            sets = args.set + variants[name] + [f"seed={seed}", f"run_name={base.run_name}-{name}-seed{seed}"]
            try:
                cfg = config.load_config(args.config, sets)  # a bad override fails here, before any run
            except config.ConfigError as e:
                raise SystemExit(f"variant {name}: {e}")
            used.setdefault(name, resolved(cfg))
            run_dir = ROOT / cfg.out_dir
            action = run_action(run_dir, cfg.train.steps)
            if action != "summarise" and args.no_run:
                raise SystemExit(f"{run_dir}: {'not there' if action == 'run' else 'unfinished'}: run without --no-run first")
            if action != "summarise":
                cmd = [sys.executable, str(ROOT / "train.py"), "--config", args.config] + [
                    a for kv in sets for a in ("--set", kv)] + (["--resume"] if action == "resume" else [])
                print("$", " ".join(cmd), flush=True)
                subprocess.run(cmd, check=True, cwd=ROOT)
            else:
                print(f"{run_dir}: finished, summarised", flush=True)
            evals = held_out(run_dir)["evals"]
            if not evals:
                raise SystemExit(f"{run_dir}: no eval logged (set eval.every or eval.at_start, and data.eval_tasks)")
            curves[name].append(evals)
    out.mkdir(parents=True, exist_ok=True)
    differ = sorted({k for diffs in differences(used, reference).values() for k, _, _ in diffs})
    md = [f"Held-out success (mean ± sd over seeds {seeds}) by RL step; config {args.config}"
          + (f" with {' '.join(args.set)}" if args.set else "") + ".", "", table(curves), "",
          f"Where each variant differs from {reference}:", "", *diff_lines(used, reference), "",
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
