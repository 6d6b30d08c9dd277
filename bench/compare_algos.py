"""GRPO against IPA and its ablations, or any variants of your own: the same config, tasks, budget
and seeds under each variant; held-out success at every eval step, mean and spread over the seeds,
as a markdown table (printed and written) and a PNG. The paper's claims it tests: chunk-level IPA
beats token-level training (its Fig. 10: "ipa" against "ipa-token", and against "grpo"), and
starting episodes from expert chunks speeds learning (its Fig. 13: "ipa-prefill"); "ipa-filter"
adds online difficulty filtering (train.filter_window).

    python bench/compare_algos.py                      # configs/tiny.yaml, seeds 0 1 2, 3 variants
    python bench/compare_algos.py --seeds 0 --set train.steps=2 --set eval.num_tasks=4   # a smoke test
    python bench/compare_algos.py --config configs/smollm2-multistep.yaml \
        --variants ipa ipa-token ipa-prefill ipa-filter grpo --sft-more 80
    python bench/compare_algos.py --variants ipa --variant lr-high=train.lr=5e-3,algo.gamma=0.9  # then yours
    python bench/compare_algos.py --no-run             # only summarise the runs that finished
    python bench/compare_algos.py --no-run --at-step 10   # the same tables at RL step 10's eval
    python bench/compare_algos.py --status             # each run: finished, running, stopped, not started

Each variant is `--set` overrides on top of --config: a built-in one (VARIANTS) or your own,
`--variant NAME=key=val,key=val` (repeatable). Everything else (model, SFT warm start, lr, steps,
tasks, eval) is the config's, identical across variants. The table ends with a line per variant
naming the keys where it differs from the reference (`--reference`, default the first variant).
Seeds run in increasing order, and within a seed: its SFT run, the variants in the order given,
then the control; so a comparison stopped early has whole seeds. The table and PNG are rewritten
as each run finishes (a seed not run yet reads -), so a long comparison shows what has landed.

Branching (when the config has SFT, sft.steps > 0): SFT runs once a seed, as run_name
<run_name>-sft<sft.steps>-seed<S> with train.steps=0 (its step-0 eval is the SFT-only policy's).
Each variant <run_name>-<variant>-seed<S> starts as a copy of that run's step-0 checkpoint (the
weights and SFT's AdamW state, hard links) and the logs as they were when it was saved, then
train.py --resume runs it under the variant's config: the RL phase an unbroken run of that config
would have, from one shared SFT. A variant may not change sft.*, model.* or data.* keys: those
would need an SFT of its own (--no-branch runs each variant's own SFT, as train.py alone does).

The control (--sft-more N): N more SFT steps from the same step-0 checkpoint (model.path set to
its model/; a fresh AdamW with sft.lr's warmup and cosine), no RL, then the held-out eval:
<run_name>-sftmore<N>-seed<S>. It is the row that asks whether RL's extra compute beats the same
compute spent on more SFT. With --sft-more-split rl those steps imitate the oracles of the rl split
(<run_name>-sftmore<N>-rl-seed<S>): the tasks a variant with train.generated_split=rl trains RL on,
with their verifier alone, shown to SFT with their solutions.

Every run goes to the config's out_dir; a comparison that was stopped (killed at any point) picks
up where it was: a finished run (summary.txt, its last checkpoint at train.steps) is summarised,
an unfinished one resumed with train.py --resume, a missing one branched (or run). The tables: held-
out success by RL step (mean ± sd), then at the final eval per row (SFT-only, each variant, the
control): each seed, mean, sd, and the paired per-seed difference to the SFT-only policy and to the
reference with its 95% t-interval over seeds; success by kind and turns per episode. --at-step N
gives those tables at the variants' eval of RL step N instead (compare-step<N>.md, beside compare.md).
"""
import argparse
import collections
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import config  # noqa: E402
import rundir  # noqa: E402
from generated_tasks import task_kind  # noqa: E402
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
    # token ratios, masks and credit
    "ipa-token": ["algo.loss=ipa", "rollout.prefill_prob=0.0", "algo.level=token"],
    "ipa-prefill": ["algo.loss=ipa", "rollout.prefill_prob=0.5"],
    "ipa-prefill-refresh": ["algo.loss=ipa", "rollout.prefill_prob=0.5", "rollout.refresh_expert=true"],
    "ipa-filter": ["algo.loss=ipa", "rollout.prefill_prob=0.0", "train.filter_window=4"],
}
DEFAULT_VARIANTS = ["grpo", "ipa", "ipa-prefill"]
IGNORED = ("run_name", "out_dir", "seed", "rollout.seed")  # what differs between any two runs by design
SFT_KEYS = ("sft.", "model.", "data.")  # a variant that sets one of these needs an SFT of its own
# two-sided 95% quantiles of Student's t by degrees of freedom (seeds - 1); the normal's past 10
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def parse_variant(text: str) -> tuple[str, list[str]]:
    """`NAME=key=val,key=val` -> (NAME, ["key=val", ...]). A comma splits only before the next
    `key=`, so a value may hold commas (`train.adam_betas=[0.9,0.99]`)."""
    name, sep, sets = text.partition("=")
    if not sep or not re.fullmatch(r"[\w.-]+", name) or not sets:
        raise ValueError(f"--variant {text!r}: expected NAME=key=val[,key=val...], "
                         f"e.g. lr-high=train.lr=5e-3")
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
    return {name: [(k, u.get(k), ref.get(k)) for k in sorted(set(u) | set(ref))
                   if repr(u.get(k)) != repr(ref.get(k))] for name, u in used.items()}


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


def branch(sft_dir: Path, run_dir: Path):
    """run_dir as train.py would leave it at the SFT-only start, from the finished SFT run sft_dir:
    its step-0 checkpoint (hard links: checkpoints are written whole and renamed, never changed in
    place) and its logs as they were when that checkpoint was saved, which --resume checks. Built
    beside run_dir and renamed into place, so a kill leaves either nothing or the whole branch."""
    ck = sft_dir / "checkpoints" / "step_000000"
    meta = json.loads((ck / "meta.json").read_text())
    tmp = run_dir.with_name(f".{run_dir.name}.branch")
    shutil.rmtree(tmp, ignore_errors=True)  # a branch cut short by a kill
    shutil.copytree(ck, tmp / "checkpoints" / ck.name, copy_function=os.link)
    (tmp / "checkpoints" / "latest").write_text(ck.name + "\n")
    for name, rec in meta.get("logs", {}).items():
        size = rec if isinstance(rec, int) else rec["size"]
        with open(sft_dir / name, "rb") as src, open(tmp / name, "wb") as dst:
            dst.write(src.read(size))
    os.rename(tmp, run_dir)


def train(sets: list, config_path: str, run_dir: Path, steps: int, sft_dir: Path | None = None) -> bool:
    """Bring one run to its end: summarise a finished one, resume a stopped one, branch a missing
    one from sft_dir's SFT-only start (when given) or run it. Whether it trained."""
    action = run_action(run_dir, steps)
    if action == "summarise":
        print(f"{run_dir}: finished, summarised", flush=True)
        return False
    if action == "run" and sft_dir is not None:
        if run_dir.exists():  # only a lock: no run was written yet
            shutil.rmtree(run_dir)
        branch(sft_dir, run_dir)
        print(f"{run_dir}: branched from {sft_dir}/checkpoints/step_000000", flush=True)
        action = "resume"
    cmd = [sys.executable, str(ROOT / "train.py"), "--config", config_path] + [
        a for kv in sets for a in ("--set", kv)] + (["--resume"] if action == "resume" else [])
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)
    return True


def final_eval(run_dir: Path, step: int | None = None) -> dict:
    """The run's held-out eval at RL step `step` (None: its last): success and its 95% interval
    (metrics.jsonl), its episodes (the valid ones of eval_trajectories.jsonl at that step's policy
    version), and from them [passed, episodes] by task kind (the task name's last part) and the turns
    of each episode."""
    h = held_out(run_dir)
    evals = h["evals"]
    if step is None:
        step = max(evals)
    elif step not in evals:
        raise SystemExit(f"{run_dir}: no held-out eval at RL step {step}; it has one at step "
                         f"{', '.join(map(str, sorted(evals)))} (eval.every sets which)")
    kinds, turns, episodes = collections.defaultdict(lambda: [0, 0]), [], []
    path = run_dir / "eval_trajectories.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        e = json.loads(line) if line.strip() else None
        if e and e["valid"] and e["policy_version"] == step:
            k = kinds[task_kind(e["task_name"])]
            k[0], k[1] = k[0] + (e["reward"] > 0), k[1] + 1
            turns.append(e["num_turns"])
            episodes.append(e)
    return {"step": step, "success": evals[step], "ci": h["cis"][step], "kinds": dict(kinds), "turns": turns,
            "episodes": episodes}


def paired(xs: list, refs: list) -> str:
    """Mean per-seed difference xs - refs in points with its 95% t-interval over the seeds."""
    def pts(v):  # differences that cancel read +0.0, not a rounding error's -0.0
        return f"{round(v, 1) + 0.0:+.1f}"
    d = [100 * (x - r) for x, r in zip(xs, refs)]
    if len(d) < 2:
        return pts(d[0]) if d else "-"
    mean, half = statistics.mean(d), T975.get(len(d) - 1, 1.96) * statistics.stdev(d) / len(d) ** 0.5
    return f"{pts(mean)} [{pts(mean - half)}, {pts(mean + half)}]"


def final_table(finals: dict, seeds: list, reference: str | None) -> str:
    """Markdown: a row per policy (name -> {seed: final_eval}) at its final eval: each seed, mean,
    sd, the paired difference to the SFT-only row and to the reference, mean turns; then success
    by kind, passed/episodes over all seeds."""
    base = "SFT-only" if "SFT-only" in finals else None
    cols = [c for c in (base, reference) if c]
    head = ["", *[f"seed {s}" for s in seeds], "mean", "sd", *[f"Δ vs {c} (95% CI)" for c in cols], "turns"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for name, runs in finals.items():
        xs = [runs[s]["success"] if s in runs else None for s in seeds]
        got = [x for x in xs if x is not None]
        sd = statistics.stdev(got) if len(got) > 1 else 0.0
        diffs = []
        for c in cols:
            common = [s for s in seeds if s in runs and s in finals[c]]
            diffs.append("" if c == name else paired([runs[s]["success"] for s in common],
                                                     [finals[c][s]["success"] for s in common]))
        turns = [t for r in runs.values() for t in r["turns"]]
        lines.append(f"| {name} | " + " | ".join("-" if x is None else f"{x:.1%}" for x in xs)
                     + f" | {statistics.mean(got):.1%} | {100 * sd:.1f} | " + " | ".join(diffs)
                     + f" | {statistics.mean(turns) if turns else 0:.2f} |")
    kinds = sorted({k for runs in finals.values() for r in runs.values() for k in r["kinds"]})
    lines += ["", "| kind | " + " | ".join(finals) + " |", "|---|" + "---:|" * len(finals)]
    for k in kinds:
        cells = [f"{sum(r['kinds'].get(k, [0, 0])[0] for r in runs.values())}/"
                 f"{sum(r['kinds'].get(k, [0, 0])[1] for r in runs.values())}" for runs in finals.values()]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def seed_rows(finals: dict, seeds: list) -> str:
    """Markdown: a row per seed and policy (name -> {seed: final_eval}) at its final eval: success
    with its 95% interval, mean turns, and each kind's passed episodes ("(of n)" when every kind of
    the row has n, else passed/episodes)."""
    kinds = sorted({k for runs in finals.values() for r in runs.values() for k in r["kinds"]})
    lines = [f"| seed | policy | held-out success [95% CI] | turns | {' '.join(kinds)} |",
             "|---:|---|---|---:|---|"]
    for s in seeds:
        for name, runs in finals.items():
            if s not in runs:
                continue
            r = runs[s]
            got = [r["kinds"].get(k, [0, 0]) for k in kinds]
            same = {n for _, n in got}
            cells = (" ".join(str(p) for p, _ in got) + f" (of {same.pop()})" if len(same) == 1
                     else " ".join(f"{p}/{n}" for p, n in got))
            ci = f" [{100 * r['ci'][0]:.1f}, {100 * r['ci'][1]:.1f}]" if r.get("ci") else ""
            turns = statistics.mean(r["turns"]) if r["turns"] else 0
            lines.append(f"| {s} | {name} | {r['success']:.1%}{ci} | {turns:.2f} | {cells} |")
    return "\n".join(lines)


def table(curves: dict) -> str:
    """Markdown: one row per eval step, one column per variant, 'mean ± sd (n seeds)'."""
    if not curves:
        return "No variant's run has finished yet."
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
    if not curves:  # the tables rewritten after a seed's SFT run, before any variant's
        return "no PNG yet: no variant's run has finished"
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
            ax.plot(sorted(evals), [evals[s] for s in sorted(evals)], color=line.get_color(), alpha=0.25,
                    lw=0.8)
    ax.set_xlabel("RL step")
    ax.set_ylabel("held-out success")
    ax.set_ylim(-0.02, 1.02)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return f"plot: {out}"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(ROOT / "configs" / "tiny.yaml"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--variants", nargs="+", default=None,
                    help=f"built-in ({', '.join(VARIANTS)}) or --variant names, in the order to run "
                         f"(default: {' '.join(DEFAULT_VARIANTS)}); every --variant runs too, after them")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=KEY=VAL[,KEY=VAL]",
                    help="a variant of your own: --set overrides on top of --config (repeatable)")
    ap.add_argument("--reference", default=None,
                    help="the variant the others are compared with (default: the first)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="passed on to train.py for every variant (e.g. a shorter budget)")
    ap.add_argument("--out", default=None,
                    help="where the table and PNG go (default: runs/compare-<run_name>)")
    ap.add_argument("--no-run", action="store_true",
                    help="summarise the finished runs only, leaving out the rest")
    ap.add_argument("--at-step", type=int, default=None, metavar="N",
                    help="the per-seed and paired tables at the variants' eval of RL step N instead of "
                         "their last (SFT-only and the control keep their one eval), into "
                         "compare-step<N>.md")
    ap.add_argument("--status", action="store_true",
                    help="say where each run stands (finished, running, stopped at a checkpoint, not "
                         "started); run and write nothing")
    ap.add_argument("--sft-more", type=int, default=0, metavar="N",
                    help="the control: N more SFT steps from each seed's SFT-only checkpoint, no RL "
                         "(0: none)")
    ap.add_argument("--sft-more-split", default="train", choices=["train", "rl"],
                    help="the generated split the control's oracle trajectories come from "
                         "(sft.generated_split): rl shows SFT the tasks a variant with "
                         "train.generated_split=rl gives RL, with their oracles (default: train)")
    ap.add_argument("--no-branch", action="store_true",
                    help="each variant runs its own SFT (train.py alone) instead of branching from "
                         "one a seed")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    names, variants, reference = pick_variants(args)
    seeds = sorted(set(args.seeds))
    args.config = str(Path(args.config).resolve())  # train.py runs from the repository root
    base = config.load_config(args.config, args.set)
    branching = branches(args, base)
    if bad := [(n, kv) for n in names for kv in variants[n] if branching and kv.startswith(SFT_KEYS)]:
        raise SystemExit(f"variant {bad[0][0]} sets {bad[0][1]}: a key of the SFT phase, which every variant "
                         f"shares when it branches from one SFT a seed; pass --no-branch to run its own SFT")
    if args.sft_more and not branching:
        raise SystemExit("--sft-more continues a seed's SFT checkpoint: it needs sft.steps > 0 and branching")
    out = Path(args.out or ROOT / "runs" / f"compare-{base.run_name}")
    curves, used = {n: [] for n in names}, {}
    control = control_row(args)
    finals = {**({"SFT-only": {}} if branching else {}), **{n: {} for n in names},
              **({control: {}} if args.sft_more else {})}
    for name in names:  # a bad override fails here, before any run
        try:
            used[name] = resolved(config.load_config(args.config, args.set + variants[name]))
        except config.ConfigError as e:
            raise SystemExit(f"variant {name}: {e}")

    def finished(row: str, seed: int, run_dir: Path, trained: bool):
        """A run's final eval into its row, and after a run that trained the tables rewritten: they
        grow as runs finish, so a program of many hours shows what has landed (its later seeds'
        cells read -); runs only summarised leave that to the end."""
        finals[row][seed] = final_eval(run_dir, args.at_step if row in curves else None)
        if trained:
            write_tables(args, out, seeds, curves, used, finals, reference, control, quiet=True)

    runs = plan(args, base, seeds, names, variants)
    if args.status:
        print(status(runs))
        return
    for row, seed, sets, run_dir, steps, sft_dir in runs:
        if args.no_run and (action := run_action(run_dir, steps)) != "summarise":
            # a program midway: its table from the runs that finished, each other cell -
            print(f"{run_dir}: {'not there' if action == 'run' else 'unfinished'}, left out (--no-run)",
                  flush=True)
            continue
        trained = train(sets, args.config, run_dir, steps, sft_dir)
        if row in curves:
            evals = held_out(run_dir)["evals"]
            if not evals:
                raise SystemExit(f"{run_dir}: no eval logged (set eval.every or eval.at_start, "
                                 f"and data.eval_tasks)")
            curves[row].append(evals)
        finished(row, seed, run_dir, trained)
    if not any(finals.values()):
        raise SystemExit("--no-run: no run of this comparison has finished yet; run it without --no-run")
    write_tables(args, out, seeds, curves, used, finals, reference, control)


def branches(args, base) -> bool:
    """Whether the variants branch from one SFT a seed: the config has SFT and --no-branch is not given."""
    return base.sft.steps > 0 and not args.no_branch


def plan(args, base, seeds: list, names: list, variants: dict) -> list[tuple]:
    """The comparison's runs in the order they run: (row, seed, train.py's --set overrides, run
    directory, train.steps, the SFT run a variant branches from or None). Within a seed: its SFT run
    (train.steps=0: its step-0 eval is the SFT-only policy's), the variants, the control. `base`: the
    config under args.set alone."""
    runs, branching = [], branches(args, base)
    for seed in seeds:
        sft_dir = None
        if branching:
            sets = args.set + [f"seed={seed}", "train.steps=0",
                               f"run_name={base.run_name}-sft{base.sft.steps}-seed{seed}"]
            sft_dir = ROOT / config.load_config(args.config, sets).out_dir
            runs.append(("SFT-only", seed, sets, sft_dir, 0, None))
        for name in names:
            # the run's own keys go last: the variant's keys and the seed are what differ
            sets = args.set + variants[name] + [f"seed={seed}", f"run_name={base.run_name}-{name}-seed{seed}"]
            cfg = config.load_config(args.config, sets)
            runs.append((name, seed, sets, ROOT / cfg.out_dir, cfg.train.steps, sft_dir))
        if args.sft_more:
            sets = control_sets(args, base.run_name, seed, sft_dir)
            run_dir = ROOT / config.load_config(args.config, sets).out_dir
            runs.append((control_row(args), seed, sets, run_dir, 0, None))
    return runs


def status(runs: list) -> str:
    """Where each run of plan() stands, one line each, and how many are finished: finished, running
    (its lock's writer alive), stopped at its newest checkpoint, or not started."""
    lines, done = [], 0
    for _, _, _, run_dir, steps, sft_dir in runs:
        action = run_action(run_dir, steps)
        done += action == "summarise"
        if action == "summarise":
            state = "finished"
        elif action == "run":
            state = "not started" + (f", branches from {sft_dir.name}" if sft_dir else "")
        else:
            ckpts = rundir.checkpoints(run_dir / "checkpoints")
            pid = rundir.live_writer(run_dir)
            state = ((f"running (process {pid})" if pid else "stopped")
                     + (f" at {ckpts[-1].name}" if ckpts else ", no checkpoint yet")
                     + f", ends at step_{steps:06d}")
        where = run_dir.relative_to(ROOT) if run_dir.is_relative_to(ROOT) else run_dir
        lines.append(f"{where}: {state}")
    return "\n".join(lines + [f"{done} of {len(runs)} runs finished"])


def control_row(args) -> str:
    """The control's row in the tables."""
    split = args.sft_more_split
    return f"sft-more {args.sft_more}" + ("" if split == "train" else f" on {split}")


def control_sets(args, run_name: str, seed: int, sft_dir: Path) -> list:
    """train.py's --set overrides of the seed's control: the same SFT recipe from the SFT-only
    checkpoint's weights, all --sft-more steps (no early stop), on --sft-more-split's oracles."""
    split = args.sft_more_split
    name = f"{run_name}-sftmore{args.sft_more}" + ("" if split == "train" else f"-{split}")
    return args.set + [f"seed={seed}", "train.steps=0", f"sft.steps={args.sft_more}",
                       "sft.stop_at_val_prob=0", f"sft.generated_split={split}",
                       f"model.path={sft_dir / 'checkpoints' / 'step_000000' / 'model'}",
                       f"run_name={name}-seed{seed}"]


def pick_variants(args) -> tuple[list, dict, str]:
    """(the variants to run in order, every variant's overrides by name, the reference)."""
    variants = dict(VARIANTS)
    try:
        for text in args.variant:
            name, sets = parse_variant(text)
            if name in variants:
                raise ValueError(f"--variant {name}: that name is taken ({' '.join(variants[name])}); "
                                 f"choose another")
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
    return names, variants, reference


def write_tables(args, out: Path, seeds: list, curves: dict, used: dict, finals: dict, reference: str,
                 control: str, quiet: bool = False):
    """compare.md (printed too, unless quiet) and compare.png."""
    out.mkdir(parents=True, exist_ok=True)
    finals = {name: runs for name, runs in finals.items() if runs}  # a row none of whose runs is there
    curves = {name: runs for name, runs in curves.items() if runs}
    differ = sorted({k for diffs in differences(used, reference).values() for k, _, _ in diffs})
    at = "each row's final eval" if args.at_step is None else f"each variant's eval of RL step {args.at_step}"
    md = [f"Held-out success (mean ± sd over seeds {seeds}) by RL step; config {args.config}"
          + (f" with {' '.join(args.set)}" if args.set else "") + ".", "", table(curves), "",
          f"At {at} (SFT-only: the seed's SFT run at step 0; the differences are paired by seed, in points):",
          "", final_table(finals, seeds, reference if reference in finals else None), "",
          "Each seed's rows:", "", seed_rows(finals, seeds), "",
          f"Where each variant differs from {reference}:", "", *diff_lines(used, reference),
          *([f"- **{control}**: {args.sft_more} more SFT steps from the seed's SFT-only checkpoint, no RL"
             + ("" if args.sft_more_split == "train" else f", on the {args.sft_more_split} split's oracles")]
            if control in finals else [])]
    if differ:  # one variant alone differs from nothing
        md += ["", "Keys that differ between the variants:", "",
               "| key | " + " | ".join(used) + " |", "|---|" + "---|" * len(used)]
        md += [f"| {k} | " + " | ".join(str(u.get(k)) for u in used.values()) + " |" for k in differ]
    text = "\n".join(md) + "\n"
    table_path = out / ("compare.md" if args.at_step is None else f"compare-step{args.at_step}.md")
    table_path.write_text(text)
    drawn = plot(curves, out / "compare.png")
    if not quiet:
        print("\n" + text + "\n" + drawn + f"\ntable: {table_path}")


if __name__ == "__main__":
    main()
