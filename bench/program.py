"""The multi-step evidence, run to the end in the background: a queue of training runs in priority
order, one at a time, each resumable. A finished run (summary.txt, its last checkpoint at
train.steps) is skipped, a stopped one resumed with train.py --resume, a missing one started:
compare_algos.run_action's rule. Kill it at any moment and start it again with the same command.

    nice -n 19 nohup python bench/program.py >> runs/program.log 2>&1 &    # start or resume
    python bench/program.py --list                                        # the queue, each run's state
    touch runs/program.stop                                               # stop after the current job

The plateau and the best recipe are read from a model's finished seed-0 runs. Where those are gone
(an emptied runs/) or run on another machine, give the decisions docs/results.md records instead,
and the jobs to run (their numbers in --list):

    python bench/program.py --plateau gemma3-multistep=250 \\
        --best gemma3-multistep=ipa-rl-split-successes --jobs 7 8

Run it from a worktree of a fixed commit, so code changed in the main checkout meanwhile does not
leak into a half-done series (the commit is logged at every start). A second driver on the same
runs/ is refused (runs/program.lock). A job that fails is logged and left for the next start; the
queue goes on with the next one.

The queue, most informative first (every RL row starts from its seed's SFT plateau, the headline's
recipe is the recipes' best on seed 0, and every RL row is read against its seed's SFT-only policy
and control); runs whose seed-0 figures docs/results.md already holds come last, reproducing them:
1. the CPU demo's control, 3 seeds (runs/compare-demo): short, and independent of the rest.
2. the plateau of the SFT curve of configs/smollm2-multistep.yaml, seed 0 (SFT_CURVE[0], without
   early stop, train.steps=0: val_oracle_prob every 5 steps and the SFT-only policy's held-out
   eval, its step-0 eval). The plateau budget is the curve's best held-out success (fewer steps on
   a tie) among the curve runs finished; while none has, the config's 60.
3. the second real model's SFT curve, Gemma 3 270M (configs/gemma3-multistep.yaml), seed 0
   (MODELS: 60, 150 and 250 steps): whether SFT leaves it failures on the train tasks, where RL's
   reward comes from, and whether RL adds where SmolLM2's seed-0 rows in docs/results.md show it
   does not; then, seed 0, from its plateau, its published IPA and IPA from successes alone on the
   rl split, and the latter on the rl tasks its start both passes and fails (train.curate_k),
   against SFT on that split's oracles (runs/compare-gemma3-multistep-rlsplit); its best seed-0
   recipe on seeds 0 1 2 (runs/compare-gemma3-multistep-headline), each seed with the control on
   the split that recipe draws (control_split); that recipe drawing its tasks kind by kind, seeds
   0 1 2 (runs/compare-gemma3-multistep-bykind); that recipe's one-key rows (as in 5): token level
   and prefilled starts on seeds 0 1 2, GRPO's lrs on seed 0, GRPO on seeds 1 2
   (runs/compare-gemma3-multistep-onekey); then the published IPA on the train
   split with its control (runs/compare-gemma3-multistep-recipes).
4. the RL recipes that draw the train tasks on seed 0, from the plateau, with the control of
   CONTROL_STEPS more SFT steps from the same checkpoint (runs/compare-multistep-recipes): IPA as
   the paper gives it (configs/smollm2-multistep-ipa.yaml), a 5x lr, the CPU configs'
   successes-only loss.
5. the headline: the recipe with the best seed-0 held-out success (the published IPA on a tie, or
   while none has finished) on seeds 0 1 2, each with its control (runs/compare-multistep-headline);
   the one-key variants of that recipe on seed 0 (token level, prefilled starts) and GRPO at 3 lrs,
   without a control (runs/compare-multistep-onekey); the rl split's recipes against its own control,
   CONTROL_STEPS SFT steps on its oracles (runs/compare-multistep-rlsplit); then seeds 1 2 of the
   one-key rows, GRPO at its best seed-0 lr.
6. the recipes on the rl split (tasks SFT never imitated; on its least-solved kinds alone, with a
   group baseline or from successes alone) on seed 0; seeds 1 2 of the recipes that held
   (held_recipes); the SFT curve's budgets under its plateau.
"""
import argparse
import contextlib
import fcntl
import io
import shlex
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import config  # noqa: E402
import compare_algos  # noqa: E402
from compare_algos import VARIANTS, final_eval, run_action  # noqa: E402

MULTISTEP = "configs/smollm2-multistep.yaml"
IPA = "configs/smollm2-multistep-ipa.yaml"
# SFT without early stop: the budget is the variable. The run name carries the budget, as
# compare_algos names its per-seed SFT runs, so the comparisons find the curve's seed-0 run of
# their budget done.
# 250 first: the plateau of the curve in docs/results.md ("The SFT curve"), where every row starts;
# the budgets under it reproduce that curve, last in the queue. Below 60 the runs'
# val_oracle_prob, scored every 5 steps from step 0, shows the rise.
SFT_CURVE = [250, 60, 150, 100]
# The control's SFT steps: the RL phase's wall time in SFT steps. On the idle Xeon a multi-step RL
# step of 32 episodes takes ~95 s and an SFT step of 8 trajectories 8-10 s (docs/results.md "Where
# SmolLM2's time goes"), so 20 RL steps ~ 200 SFT steps. Each run's summary logs its wall time.
CONTROL_STEPS = 200
RL_STEPS = 20  # configs/smollm2-multistep-ipa.yaml's train.steps: a run with them all has finished
GRPO_LRS = {"grpo-lr5e-6": 5e-6, "grpo": None, "grpo-lr1e-4": 1e-4}  # None: the config's 2e-5
SEEDS = ["0", "1", "2"]


# Each model's rows: run names start with its prefix. (the config of its SFT runs, its SFT budgets,
# its keys on top of the IPA config: the second real model's are where configs/gemma3-multistep.yaml
# differs from SmolLM2's configs/smollm2-multistep.yaml, so its RL rows branch from its curve's
# runs as they were trained: tests/test_compare_algos.py::test_the_programs_gemma_rows_are_...)
# Gemma's curve goes as far as SmolLM2's, to where held-out success stops rising (docs/results.md
# "Gemma 3 270M"): its RL rows must start from the best SFT-only policy.
MODELS = {
    "smollm2-multistep": (MULTISTEP, SFT_CURVE, []),
    "gemma3-multistep": ("configs/gemma3-multistep.yaml", [60, 150, 250],
                         ["model.path=out/gemma3-270m", "model.fetch=python scripts/get_gemma3.py",
                          "sft.val_every=20", "train.micro_batch_tokens=4096", "run_name=gemma3-multistep"]),
}


def sft_job(steps: int, seed: int, prefix: str = "smollm2-multistep") -> tuple:
    sets = [f"sft.steps={steps}", "sft.stop_at_val_prob=0", "train.steps=0", f"seed={seed}",
            f"run_name={prefix}-sft{steps}-seed{seed}"]
    return ("train", MODELS[prefix][0], sets)


# decisions given on the command line (--plateau, --best), by model: they stand in for the finished
# seed-0 runs they are otherwise read from (tests/test_compare_algos.py::test_decisions_given_...)
DECIDED = {"plateau": {}, "best": {}}


def finished_success(runs: dict, steps: int) -> dict:
    """{key: final held-out success} of those runs ({key: run name under runs/}) that finished
    their `steps` RL steps."""
    return {key: final_eval(ROOT / "runs" / name)["success"] for key, name in runs.items()
            if run_action(ROOT / "runs" / name, steps) == "summarise"}


def plateau(prefix: str = "smollm2-multistep") -> int:
    """The SFT budget of the model's curve with the best held-out success of its SFT-only policy."""
    if prefix in DECIDED["plateau"]:
        return DECIDED["plateau"][prefix]
    got = finished_success({n: f"{prefix}-sft{n}-seed0" for n in MODELS[prefix][1]}, 0)
    if not got:
        log("no SFT curve run finished: the headline starts from the config's 60 SFT steps")
        return 60
    best = max(got, key=lambda n: (got[n], -n))
    log("SFT curve, held-out success: " + ", ".join(f"{n}: {x:.1%}" for n, x in sorted(got.items()))
        + f"; plateau {best}")
    return best


# a recipe's keys that choose RL's tasks: its GRPO rows take them too
TASK_KEYS = ("train.generated_split=", "train.generated_kinds=", "train.curate_k=", "train.curate_tasks=",
             "train.draw_by_kind=")


def grpo_variants(seeds: list, keys: list = (), suffix: str = "",
                  prefix: str = "smollm2-multistep") -> tuple[list, list]:
    """(names, --variant arguments) of GRPO at each lr (seed 0), or at the model's best seed-0 lr
    (more seeds) once all of seed 0's have finished, named with `suffix`, with `keys` on top: the
    headline recipe's TASK_KEYS, so GRPO draws the tasks it does."""
    lrs = {f"{name}{suffix}": lr for name, lr in GRPO_LRS.items()}
    if seeds != ["0"]:
        got = finished_success({name: f"{prefix}-{name}-seed0" for name in lrs}, RL_STEPS)
        if len(got) == len(lrs):
            best = max(got, key=got.get)
            lrs = {best: lrs[best]}
    out = []
    for name, lr in lrs.items():
        if name != "grpo":
            out += ["--variant", f"{name}=" + ",".join(VARIANTS["grpo"] + list(keys)
                                                       + ([f"train.lr={lr}"] if lr else []))]
    return list(lrs), out


# the rl split's kinds RL solves least (under 90% of ipa-rl-split's seed-0 episodes), alone, so
# each kind meets ~3x the groups a run; held-out keeps every kind
RL_KINDS = ["train.generated_split=rl", "train.generated_kinds=[config,crlf,longest]"]
# the by_kind job's one key: every kind once in each len(kinds) draws
BY_KIND = ["train.draw_by_kind=true"]
RECIPES = {  # IPA as published (the config), and the recipes tried beside it: keys on top of "ipa"
    "ipa": [],
    # RL on tasks SFT never imitated, with their verifier alone: the rl split's names, words and
    # numbers (two-digit counts, as held-out has), where a policy that solves the train tasks still
    # fails (docs/results.md "RL from the SFT plateau")
    "ipa-rl-split": ["train.generated_split=rl"],
    # the same from its successes alone (R = 0 on failures): with R = -1 a failure pushes down the
    # steps it shares with the successes, which on the rl split cost Gemma what it did right
    # (docs/results.md "Gemma 3 270M")
    "ipa-rl-split-successes": ["train.generated_split=rl", "algo.negative_reward=0.0"],
    # the same on the rl tasks its start both passes and fails in 8 episodes (of RL's first 160
    # draws): the paper's moderate-difficulty filter. A near-deterministic start repeats one episode
    # a group, and most groups pass whole or fail whole; only a mixed group sets a success beside a
    # failure of the same task (docs/results.md "Gemma 3 270M")
    "ipa-rl-split-curated": ["train.generated_split=rl", "algo.negative_reward=0.0", "train.curate_k=8",
                             "train.curate_tasks=160"],
    # the same drawing its tasks kind by kind, each kind once in every ten draws: under the plain
    # draw a kind left out for ten steps broke from 2 of the headline's 3 starts (docs/results.md
    # "The headline recipe on three seeds"). by_kind runs it beside the plain draw, under this name
    "ipa-rl-split-successes-bykind": ["train.generated_split=rl", "algo.negative_reward=0.0", *BY_KIND],
    "ipa-rl-kinds": RL_KINDS,
    # with a leave-one-out group baseline: a failure counts against its group's successes, and a
    # group that never succeeds pushes nothing down (without it, failures' R = -1 took the policy
    # apart there: docs/results.md "RL from the SFT plateau")
    "ipa-rl-kinds-rloo": RL_KINDS + ["algo.baseline=rloo"],
    # learning from its successes alone (R = 0 on failures: nothing is pushed down), since pushing
    # failures down took the policy apart there with or without that baseline
    "ipa-rl-kinds-successes": RL_KINDS + ["algo.negative_reward=0.0"],
    "ipa-lr1e-4": ["train.lr=1e-4"],  # 5x the lr: no KL term holds it (algo.kl_coef 0)
    # the CPU configs' loss: failures carry no value (R = 0), 16 tasks x 2 episodes a step
    "ipa-successes": ["algo.negative_reward=0.0", "train.tasks_per_step=16", "train.group_size=2"],
}


TRAIN_SPLIT_RECIPES = [n for n, keys in RECIPES.items() if "train.generated_split=rl" not in keys]
# the recipes on the rl split, read against SFT on its oracles
RL_SPLIT_RECIPES = ["ipa-rl-split", "ipa-rl-split-successes", "ipa-rl-split-curated"]


def held_recipes() -> list:
    """The published IPA and the recipes whose seed-0 run did not end 10 points or more (8 of 80
    held-out episodes) below its SFT-only start: one that did came apart (docs/results.md "RL from
    the SFT plateau"), and more seeds of it would not say more. A recipe not finished is kept."""
    start = finished_success({"sft": f"smollm2-multistep-sft{plateau()}-seed0"}, 0).get("sft", 0.0)
    got = finished_success({name: f"smollm2-multistep-{name}-seed0" for name in RECIPES}, RL_STEPS)
    return ["ipa"] + [n for n in RECIPES if n != "ipa" and round(start - got.get(n, start), 6) < 0.1]


def best_recipe(prefix: str = "smollm2-multistep") -> str:
    """The recipe whose seed-0 run of the model ended with the best held-out success; "ipa" on a
    tie or before any has finished; on a tie without it, the one RECIPES lists first."""
    if prefix in DECIDED["best"]:
        return DECIDED["best"][prefix]
    got = finished_success({name: f"{prefix}-{name}-seed0" for name in RECIPES}, RL_STEPS)
    if not got:
        return "ipa"
    best = max(got, key=lambda n: (got[n], n == "ipa"))
    log(f"{prefix} recipes on seed 0, held-out success: "
        + ", ".join(f"{n}: {x:.1%}" for n, x in got.items()) + f"; the headline's: {best}")
    return best


def recipe_variant(recipe: str, change: str = "", keys: list = ()) -> list:
    """The --variant argument of a recipe (its keys on top of "ipa", the config's IPA), or of its
    one-key variant recipe-change with `keys` on top; none for "ipa" itself, compare_algos' own."""
    name = f"{recipe}-{change}" if change else recipe
    if name == "ipa":
        return []
    # a key set again later keeps its first place and takes the later value: the logged command shows
    # each key once, at the value the run uses
    sets = {kv.split("=", 1)[0]: kv for kv in VARIANTS["ipa"] + RECIPES[recipe] + list(keys)}
    return ["--variant", f"{name}=" + ",".join(sets.values())]


def compare(out: str, seeds: list, variants: list, extra: list = (),
            prefix: str = "smollm2-multistep", control: bool = True) -> list:
    """compare_algos' arguments for the model's rows (from its SFT plateau, with the control unless
    `control` is false), its table in runs/compare-multistep-<out> (SmolLM2) or
    runs/compare-<prefix>-<out>."""
    sets = [a for kv in MODELS[prefix][2] for a in ("--set", kv)]
    more = ["--sft-more", str(CONTROL_STEPS)] if control else []
    return ["--config", IPA, "--seeds", *seeds, "--variants", *variants, *extra, *sets,
            *more, "--set", f"sft.steps={plateau(prefix)}",
            "--out", f"runs/compare-{prefix.removeprefix('smollm2-')}-{out}"]


def recipes(seeds: list, names: list = ()) -> list:
    """The published IPA against the other recipes (`names` of RECIPES, or all)."""
    names = list(names or RECIPES)
    extra = [a for name in names for a in recipe_variant(name)]
    return compare("recipes", seeds, names, extra)


def control_split(recipe: str) -> list:
    """compare_algos' --sft-more-split for a recipe's control: SFT on the oracles of the split its RL
    draws. For a recipe on the rl split that is SFT shown the very tasks RL meets, the control that
    says whether RL's reward taught what their oracles would."""
    return ["--sft-more-split", "rl"] if "train.generated_split=rl" in RECIPES[recipe] else []


def headline(seeds: list, best: str | None = None, prefix: str = "smollm2-multistep") -> list:
    """The model's best seed-0 recipe on `seeds`, each seed with its control (control_split)."""
    best = best or best_recipe(prefix)
    return compare("headline", seeds, [best], recipe_variant(best) + control_split(best), prefix)


def same_tasks_control(seeds: list, prefix: str = "smollm2-multistep") -> list:
    """The recipes that draw the rl split (RL_SPLIT_RECIPES) against SFT on that split's oracles."""
    names = RL_SPLIT_RECIPES
    return compare("rlsplit", seeds, names, [a for n in names for a in recipe_variant(n)]
                   + control_split(names[0]), prefix)


def by_kind(seeds: list, best: str | None = None, prefix: str = "smollm2-multistep") -> list:
    """The model's headline recipe against the same with its tasks drawn kind by kind
    (train.draw_by_kind), each seed's runs and control shared with the headline's: whether a kind RL
    does not draw for many steps is one it breaks (docs/results.md "The headline recipe on three
    seeds"). From a by-kind best, the same two rows: its plain draw and itself."""
    best = (best or best_recipe(prefix)).removesuffix("-bykind")
    return compare("bykind", seeds, [best, f"{best}-bykind"],
                   recipe_variant(best) + recipe_variant(best, "bykind", BY_KIND)
                   + ["--reference", best] + control_split(best), prefix)


def onekey(seeds: list, best: str | None = None, prefix: str = "smollm2-multistep",
           grpo: bool = True) -> list:
    """The model's headline recipe against one key changed: token level, prefilled starts; and GRPO
    (several keys) unless `grpo` is false. A one-key variant of a recipe other than "ipa" is named
    recipe-change. Without a control: each row is read against the recipe on the same start, and
    the headline's and by-kind jobs already set that recipe beside more SFT; 200 SFT steps a seed
    go to RL rows."""
    best = best or best_recipe(prefix)
    keys = [k for k in RECIPES[best] if k.startswith(TASK_KEYS)]
    grpo, extra = (grpo_variants(seeds, keys, best.removeprefix("ipa") if keys else "", prefix)
                   if grpo else ([], []))
    changed = {"token": ["algo.level=token"], "prefill": ["rollout.prefill_prob=0.5"]}
    if best == "ipa":
        names = ["ipa", "ipa-token", "ipa-prefill"]
    else:
        names = [best] + [f"{best}-{k}" for k in changed]
        extra = recipe_variant(best) + [a for k, keys in changed.items()
                                        for a in recipe_variant(best, k, keys)] + extra
    return compare("onekey", seeds, names + grpo, extra + ["--reference", best], prefix, control=False)


def demo_control() -> list:
    """The CPU demo (configs/smollm2-cpu.yaml: 10 SFT steps, 6 RL steps) beside its control: 6 RL
    steps of 32 easy episodes take ~50 s each on the idle Xeon, an easy SFT step ~5 s: 40 steps
    stay under RL's wall time, so the control never has more time than RL."""
    return ["--config", "configs/smollm2-cpu.yaml", "--seeds", *SEEDS, "--variants", "ipa",
            "--sft-more", "40", "--out", "runs/compare-demo"]


# a job: ("train", config, sets), or ("compare", a function of no arguments giving compare_algos'
# arguments when the job starts, what it reads of earlier runs being there by then)
GEMMA = "gemma3-multistep"
JOBS = [("compare", demo_control, []), sft_job(SFT_CURVE[0], 0)] + [
    sft_job(n, 0, GEMMA) for n in MODELS[GEMMA][1]] + [
    # Gemma's RL from its own plateau, seed 0, whether it adds where SmolLM2 did not: first the
    # rl split's recipes against SFT on that split's oracles. Its SFT never showed it the rl
    # split's file names, nor held-out's, so there its own episodes fail as held-out ones do, by a
    # name copied wrong, where the train tasks' names pass (docs/results.md "Gemma 3 270M"; the
    # order: tests/test_compare_algos.py::test_the_programs_gemma_rows_are_...)
    ("compare", lambda: same_tasks_control(["0"], prefix=GEMMA), []),
    # Gemma's best seed-0 recipe on seeds 0 1 2, each with its control, next: the model whose RL
    # recipes part ways on seed 0 (the published IPA comes apart, successes alone holds:
    # docs/results.md "Gemma 3 270M")
    ("compare", lambda: headline(SEEDS, prefix=GEMMA), []),
    # a kind the plain draw leaves out for many steps can break unseen (docs/results.md "The
    # headline recipe on three seeds"): the same recipe drawing every kind every few steps, on the
    # same starts (the order: tests/test_compare_algos.py::test_gemmas_by_kind_rows_differ_*)
    ("compare", lambda: by_kind(SEEDS, prefix=GEMMA), []),
    # the paper's claims one key at a time there, where a key can take RL apart or not: from
    # Gemma's headline recipe, IPA's two keys on seeds 0 1 2 first (three starts for the rows that
    # need no sweep), then GRPO's lrs swept on seed 0, then GRPO at its best seed-0 lr on seeds 1 2
    ("compare", lambda: onekey(SEEDS, prefix=GEMMA, grpo=False), []),
    ("compare", lambda: onekey(["0"], prefix=GEMMA), []),
    ("compare", lambda: onekey(SEEDS, prefix=GEMMA), []),
    ("compare", lambda: compare("recipes", ["0"], ["ipa"], prefix=GEMMA), []),
    ("compare", lambda: recipes(["0"], TRAIN_SPLIT_RECIPES), []),
    ("compare", lambda: headline(SEEDS), []),
    ("compare", lambda: onekey(["0"]), []),
    ("compare", lambda: same_tasks_control(["0"]), []),
    ("compare", lambda: onekey(SEEDS), []),
    # from here on, seed-0 rows docs/results.md already holds come back (all but SmolLM2's by-kind
    # draw): the recipes on the rl split
    ("compare", lambda: recipes(["0"]), []),
    ("compare", lambda: recipes(SEEDS, held_recipes()), []),
] + [sft_job(n, 0) for n in SFT_CURVE[1:]]  # last: a change of plateau would move no row after it


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


def decision(ap: argparse.ArgumentParser, flag: str, given: str) -> tuple:
    """(model, value) of a --plateau MODEL=STEPS (one of the model's SFT curve budgets) or --best
    MODEL=RECIPE (one of RECIPES), or an argparse error naming what is wrong and what it takes."""
    model, _, value = given.partition("=")
    if model not in MODELS:
        ap.error(f"{flag} {given}: the model before '=' is one of {', '.join(MODELS)}")
    choices = MODELS[model][1] if flag == "--plateau" else list(RECIPES)
    value = int(value) if flag == "--plateau" and value.isdigit() else value
    if value not in choices:
        ap.error(f"{flag} {given}: after '{model}=' comes one of {', '.join(map(str, choices))}")
    return model, value


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--list", action="store_true", help="print the queue and each run's state; run nothing")
    ap.add_argument("--plateau", action="append", default=[], metavar="MODEL=STEPS",
                    help="the model's SFT budget for its RL rows, in place of its seed-0 SFT curve's best")
    ap.add_argument("--best", action="append", default=[], metavar="MODEL=RECIPE",
                    help="the model's headline recipe, in place of its recipes' best seed-0 run")
    ap.add_argument("--jobs", type=int, nargs="+", metavar="I",
                    help="run (or --list) only these jobs, by their numbers in --list")
    args = ap.parse_args(argv)
    for flag, given in [("--plateau", args.plateau), ("--best", args.best)]:
        for g in given:
            model, value = decision(ap, flag, g)
            DECIDED[flag.removeprefix("--")][model] = value
    wanted = set(args.jobs or range(len(JOBS)))
    if wanted - set(range(len(JOBS))):
        ap.error(f"--jobs {' '.join(map(str, args.jobs))}: the jobs are numbered 0 to {len(JOBS) - 1}"
                 " (--list)")
    jobs = [(i, job) for i, job in enumerate(JOBS) if i in wanted]
    runs = ROOT / "runs"
    runs.mkdir(exist_ok=True)
    if args.list:
        for i, (kind, what, sets) in jobs:
            if kind == "train":
                print(f"{i}: " + train_job(what, sets)[0])
                continue
            print(f"{i}: compare_algos.py " + shlex.join(what()), flush=True)
            with contextlib.chdir(compare_algos.ROOT), contextlib.redirect_stdout(io.StringIO()) as said:
                compare_algos.main([*what(), "--status"])  # from the repository root, as the driver runs it
            print(textwrap.indent(said.getvalue(), "    "), end="")
        return
    lock = open(runs / "program.lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise SystemExit(f"another driver holds {runs / 'program.lock'}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    log(f"driver start: {ROOT} at {commit}, jobs {' '.join(map(str, sorted(wanted)))} of {len(JOBS)}"
        + "".join(f"; {what} {m}: {v} (given)" for what, got in DECIDED.items() for m, v in got.items()))
    failed = 0
    for i, (kind, what, sets) in jobs:
        if (runs / "program.stop").exists():
            log("runs/program.stop is there: stopping before the next job (remove it to go on)")
            break
        if kind == "train":
            state, cmd = train_job(what, sets)
        else:  # a comparison resumes and skips its own runs
            state, cmd = f"job {i}: compare", [sys.executable, "bench/compare_algos.py", *what()]
        if cmd is None:
            log(state + ", skipped")
            continue
        # each job's own output (progress bars included) in a file of its own: this log stays a list
        out = runs / "program.d" / (next((s.split("=", 1)[1] for s in sets if s.startswith("run_name=")),
                                         f"job{i}") + ".log")
        out.parent.mkdir(exist_ok=True)
        log(state + f": $ {shlex.join(cmd)}  (output: {out})")
        t0 = time.time()
        with open(out, "a") as f:
            rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode
        log(f"exit {rc} after {(time.time() - t0) / 60:.1f} min (under load): {state}")
        failed += rc != 0
    log(f"driver end: {failed} job(s) failed")


if __name__ == "__main__":
    main()
