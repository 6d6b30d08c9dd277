"""bench/compare_algos.py: --variant parsing, the line per variant naming the keys that differ from
the reference, which runs are run, resumed or summarised, a --no-run summary over finished run
directories in a stable order, the final table's paired intervals, and (slow) a real comparison
killed twice and resumed, its variants branched from one SFT checkpoint."""
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import kill_group_when

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import compare_algos  # noqa: E402
import config  # noqa: E402
from compare_algos import diff_lines, parse_variant, resolved, run_action  # noqa: E402

TINY = ROOT / "configs" / "tiny.yaml"


def test_a_variant_is_a_name_and_its_overrides_commas_inside_values_kept():
    assert parse_variant("lr-high=train.lr=5e-3,algo.gamma=0.9") == (
        "lr-high", ["train.lr=5e-3", "algo.gamma=0.9"])
    assert parse_variant("betas=train.adam_betas=[0.9,0.99], train.lr=1e-3") == (
        "betas", ["train.adam_betas=[0.9,0.99]", "train.lr=1e-3"])
    for bad in ("noequals", "name=", "=train.lr=1", "x=train.lr"):
        with pytest.raises(ValueError, match="--variant"):
            parse_variant(bad)


def test_each_ablation_differs_from_ipa_in_one_key_and_grpo_lists_its_keys():
    used = {n: resolved(config.load_config(TINY, compare_algos.VARIANTS[n] + [f"seed={i}", f"run_name=r{i}"]))
            for i, n in enumerate(["ipa", "ipa-token", "ipa-prefill", "ipa-filter", "grpo"])}
    lines = diff_lines(used, "ipa")
    assert lines[:4] == ["- **ipa**: the reference",
                         "- **ipa-token**: `algo.level` token (ipa: chunk)",
                         "- **ipa-prefill**: `rollout.prefill_prob` 0.5 (ipa: 0.0)",
                         "- **ipa-filter**: `train.filter_window` 4 (ipa: 0)"]  # not seed nor run_name
    grpo = lines[4]
    for key in ("algo.loss` ppo (ipa: ipa)", "algo.baseline` grpo", "algo.gamma` 1.0 (ipa: 0.95)",
                "algo.mismatch` token_tis", "algo.agg` token_mean", "algo.std_normalize` True"):
        assert key in grpo, grpo
    same = {"a": used["ipa"], "b": dict(used["ipa"])}
    assert diff_lines(same, "b") == ["- **a**: no key differs from b", "- **b**: the reference"]


@pytest.mark.parametrize("recipe", ["ipa", "ipa-lr1e-4", "ipa-successes", "ipa-rl-split", "ipa-rl-kinds",
                                    "ipa-rl-kinds-rloo"])
def test_the_programs_one_key_rows_differ_from_its_headline_recipe_in_one_key(recipe):
    """bench/program.py builds compare_algos arguments: they parse, the headline recipe is the
    reference, and its token-level and prefilled rows differ from it in one key each."""
    import program
    args = compare_algos.parse_args(program.onekey(["0"], recipe))
    names, variants, reference = compare_algos.pick_variants(args)
    assert reference == recipe and names[0] == recipe and len([n for n in names if n.startswith("grpo")]) == 3
    for text in args.variant:  # each key once: a reader of the logged command sees the value used
        keys = [kv.split("=", 1)[0] for kv in compare_algos.parse_variant(text)[1]]
        assert len(keys) == len(set(keys)), text
    ipa = ROOT / "configs" / "smollm2-multistep-ipa.yaml"
    used = {n: resolved(config.load_config(ipa, variants[n] + [f"run_name={n}"])) for n in names[:3]}
    assert diff_lines(used, recipe)[1:] == [
        f"- **{names[1]}**: `algo.level` token ({recipe}: chunk)",
        f"- **{names[2]}**: `rollout.prefill_prob` 0.5 ({recipe}: 0.0)"]
    head = compare_algos.parse_args(program.headline(["0", "1", "2"], recipe))
    assert compare_algos.pick_variants(head)[0] == [recipe] and head.sft_more == program.CONTROL_STEPS


def program_comparisons() -> list:
    """compare_algos' parsed arguments of each comparison bench/program.py queues, in its order."""
    import program
    return [compare_algos.parse_args(args) for kind, what, _ in program.JOBS
            if kind == "compare" and (args := what())]


def test_the_programs_recipes_differ_from_the_published_ipa_in_their_own_keys():
    """Each recipe differs from the published IPA in its own keys; the program's first recipes job
    runs those that draw the train split, a later one all of them."""
    import program
    recipe_jobs = [compare_algos.pick_variants(a)[0] for a in program_comparisons()
                   if a.out == "runs/compare-multistep-recipes"]
    assert recipe_jobs[:2] == [["ipa", "ipa-lr1e-4", "ipa-successes"], list(program.RECIPES)]
    ipa = ROOT / "configs" / "smollm2-multistep-ipa.yaml"
    names, variants, _ = compare_algos.pick_variants(compare_algos.parse_args(program.recipes(["0"])))
    used = {n: resolved(config.load_config(ipa, variants[n] + [f"run_name={n}"])) for n in names}
    assert diff_lines(used, "ipa")[1:] == [
        "- **ipa-rl-split**: `train.generated_split` rl (ipa: train)",
        "- **ipa-rl-split-successes**: `algo.negative_reward` 0.0 (ipa: -1.0); `train.generated_split` rl "
        "(ipa: train)",
        "- **ipa-rl-split-curated**: `algo.negative_reward` 0.0 (ipa: -1.0); `train.curate_k` 8 (ipa: 0); "
        "`train.curate_tasks` 160 (ipa: 0); `train.generated_split` rl (ipa: train)",
        "- **ipa-rl-split-successes-bykind**: `algo.negative_reward` 0.0 (ipa: -1.0); `train.draw_by_kind` "
        "True (ipa: False); `train.generated_split` rl (ipa: train)",
        "- **ipa-rl-kinds**: `train.generated_kinds` ['config', 'crlf', 'longest'] (ipa: []); "
        "`train.generated_split` rl (ipa: train)",
        "- **ipa-rl-kinds-rloo**: `algo.baseline` rloo (ipa: none); `train.generated_kinds` ['config', "
        "'crlf', 'longest'] (ipa: []); `train.generated_split` rl (ipa: train)",
        "- **ipa-rl-kinds-successes**: `algo.negative_reward` 0.0 (ipa: -1.0); `train.generated_kinds` "
        "['config', 'crlf', 'longest'] (ipa: []); `train.generated_split` rl (ipa: train)",
        "- **ipa-lr1e-4**: `train.lr` 0.0001 (ipa: 2e-05)",
        "- **ipa-successes**: `algo.negative_reward` 0.0 (ipa: -1.0); `rollout.group_size` 2 (ipa: 8); "
        "`train.group_size` 2 (ipa: 8); `train.tasks_per_step` 16 (ipa: 4)"]


def test_rl_on_the_rl_split_gets_the_control_that_shows_sft_those_tasks_and_grpo_draws_them_too():
    """RL drawing the rl split is read against SFT on that split's oracles (the same steps from the
    same checkpoint, a run name of its own), and its GRPO rows draw the rl split as it does."""
    import program
    ipa = ROOT / "configs" / "smollm2-multistep-ipa.yaml"
    for recipe, split in [("ipa", "train"), ("ipa-lr1e-4", "train"), ("ipa-rl-split-successes", "rl"),
                          ("ipa-rl-kinds", "rl")]:  # a headline's control
        assert compare_algos.parse_args(program.headline(["0"], recipe)).sft_more_split == split, recipe
        # the one-key rows are read against the recipe on their start, not against more SFT
        assert compare_algos.parse_args(program.onekey(["0"], recipe)).sft_more == 0, recipe
    args = compare_algos.parse_args(program.same_tasks_control(["0"]))
    names, variants, _ = compare_algos.pick_variants(args)
    assert names == ["ipa-rl-split", "ipa-rl-split-successes", "ipa-rl-split-curated"]
    assert args.sft_more_split == "rl"
    split, successes, curated = (resolved(config.load_config(ipa, variants[n])) for n in names)
    assert {k for k in successes if successes[k] != split[k]} == {"algo.negative_reward"}
    assert {k for k in curated if curated[k] != successes[k]} == {"train.curate_k", "train.curate_tasks"}
    sft_dir = ROOT / "runs" / "smollm2-multistep-sft250-seed0"
    control = config.load_config(ipa, compare_algos.control_sets(args, "smollm2-multistep", 0, sft_dir))
    assert (control.sft.generated_split, control.train.steps, control.run_name) == (
        "rl", 0, "smollm2-multistep-sftmore200-rl-seed0")
    assert Path(control.model.path) == sft_dir / "checkpoints" / "step_000000" / "model"
    args.sft_more_split = "train"  # the usual control keeps its name
    usual = config.load_config(ipa, compare_algos.control_sets(args, "smollm2-multistep", 0, sft_dir))
    assert (usual.sft.generated_split, usual.run_name) == ("train", "smollm2-multistep-sftmore200-seed0")
    for recipe, kinds, k in [("ipa-rl-split", [], 0), ("ipa-rl-kinds", ["config", "crlf", "longest"], 0),
                             ("ipa-rl-split-curated", [], 8)]:
        names, variants, _ = compare_algos.pick_variants(compare_algos.parse_args(
            program.onekey(["0"], recipe)))
        grpo = [n for n in names if n.startswith("grpo")]
        assert len(grpo) == 3 and all(n.endswith(recipe.removeprefix("ipa")) for n in grpo), names
        drawn = [config.load_config(ipa, variants[n]).train for n in grpo]
        assert all((t.generated_split, t.generated_kinds, t.curate_k) == ("rl", kinds, k) for t in drawn)


def _finished(run_dir: Path, steps: int, evals: dict):
    """A run directory as train.py leaves a finished run (the files compare_algos reads)."""
    ck = run_dir / "checkpoints" / f"step_{steps:06d}"
    ck.mkdir(parents=True)
    (ck / "trainer.pt").write_bytes(b"")
    (run_dir / "checkpoints" / "latest").write_text(ck.name + "\n")
    (run_dir / "metrics.jsonl").write_text("".join(
        json.dumps({"phase": "eval", "step": s, "success": x}) + "\n" for s, x in evals.items()))
    (run_dir / "summary.txt").write_text("wall 1.0 min\n")


def test_finished_runs_are_summarised_stopped_ones_resumed_missing_ones_run(tmp_path):
    d = tmp_path / "r"
    assert run_action(d, 3) == "run"
    d.mkdir()
    (d / "writer.lock").write_text("")  # a claim, nothing written yet
    assert run_action(d, 3) == "run"
    (d / "metrics.jsonl").write_text("")  # stopped before its first checkpoint
    assert run_action(d, 3) == "resume"
    shutil.rmtree(d)
    _finished(d, 3, {0: 0.5})
    assert run_action(d, 3) == "summarise"
    assert run_action(d, 5) == "resume"  # train.steps raised since: --resume continues it
    (d / "summary.txt").unlink()  # killed after its last checkpoint, before the summary
    assert run_action(d, 3) == "resume"
    (d / "checkpoints" / "latest").write_text("step_000009\n")  # names a checkpoint cut short
    assert run_action(d, 3) == "resume"


def test_no_run_summarises_finished_runs_in_a_stable_order(capsys):
    name = f"cmptest{os.getpid()}"
    runs = ROOT / "runs"
    made = [runs / f"{name}-{v}-seed{s}" for v in ("ipa", "mine") for s in (0, 1)]
    out = runs / f"compare-{name}"
    try:
        for i, d in enumerate(made):
            _finished(d, 1, {0: 0.25, 1: 0.25 + 0.25 * i})
        compare_algos.main(["--config", str(TINY), "--no-run", "--seeds", "1", "0", "1",
                            "--set", f"run_name={name}", "--set", "train.steps=1",
                            "--variants", "mine", "ipa",
                            "--variant", "mine=algo.level=token,algo.loss=ipa,rollout.prefill_prob=0.0",
                            "--reference", "ipa"])
        text = (out / "compare.md").read_text()
        assert "seeds [0, 1]" in text and "| step | mine | ipa |" in text
        assert "| 1 | 87.5% ± 17.7% (2) | 37.5% ± 17.7% (2) |" in text, text
        assert "- **mine**: `algo.level` token (ipa: chunk)\n- **ipa**: the reference" in text
        compare_algos.main(["--config", str(TINY), "--no-run", "--seeds", "0", "--set", f"run_name={name}",
                            "--set", "train.steps=1", "--variants", "ipa",
                            "--variant", "mine=algo.level=token"])
        assert "| step | ipa | mine |" in (out / "compare.md").read_text()  # yours run after --variants
        compare_algos.main(["--config", str(TINY), "--no-run", "--seeds", "0", "--set", f"run_name={name}",
                            "--set", "train.steps=1", "--variants", "ipa"])
        assert "Keys that differ" not in (out / "compare.md").read_text()  # one variant: no empty table
        (made[3] / "summary.txt").unlink()  # mine, seed 1: stopped after its last checkpoint
        capsys.readouterr()
        # a program midway: the table of the runs that finished
        compare_algos.main(["--config", str(TINY), "--no-run", "--seeds", "0", "1", "2",
                            "--set", f"run_name={name}", "--set", "train.steps=1",
                            "--variants", "ipa", "mine", "--variant", "mine=algo.level=token"])
        printed, text = capsys.readouterr().out, (out / "compare.md").read_text()
        assert f"{made[3]}: unfinished, left out (--no-run)" in printed
        assert f"{runs / f'{name}-ipa-seed2'}: not there, left out (--no-run)" in printed
        assert "| ipa | 25.0% | 50.0% | - | 37.5% |" in text, text
        assert "| mine | 75.0% | - | - | 75.0% |" in text, text
        with pytest.raises(SystemExit, match="no run of this comparison has finished"):
            compare_algos.main(["--config", str(TINY), "--no-run", "--seeds", "0",
                                "--set", f"run_name={name}", "--set", "train.steps=2", "--variants", "ipa"])
        with pytest.raises(SystemExit, match="variant mine: .*rollout.top_p"):  # before ipa's unfinished run
            compare_algos.main(["--config", str(TINY), "--no-run", "--seeds", "0",
                                "--set", f"run_name={name}", "--set", "train.steps=2",
                                "--variants", "ipa", "mine", "--variant", "mine=rollout.top_p=2"])
        with pytest.raises(SystemExit, match="unknown variant 'nope'"):
            compare_algos.main(["--config", str(TINY), "--no-run", "--variants", "nope"])
        with pytest.raises(SystemExit, match="name is taken"):
            compare_algos.main(["--config", str(TINY), "--no-run", "--variant", "ipa=train.lr=1"])
    finally:
        for d in made + [out]:
            shutil.rmtree(d, ignore_errors=True)


def test_at_step_gives_the_tables_at_that_eval_beside_the_final_ones(capsys):
    """--at-step N: each variant's row at its eval of RL step N (success, interval, kinds, turns), in
    compare-step<N>.md; compare.md keeps the final evals; a step never evaluated is refused, naming
    the steps that were."""
    name = f"cmpstep{os.getpid()}"
    runs = ROOT / "runs"
    made = [runs / f"{name}-ipa-seed{s}" for s in (0, 1)]
    out = runs / f"compare-{name}"
    args = ["--config", str(TINY), "--no-run", "--seeds", "0", "1", "--set", f"run_name={name}",
            "--set", "train.steps=2", "--variants", "ipa"]
    try:
        for s, d in enumerate(made):
            _finished(d, 2, {0: 0.25, 1: 0.5 + 0.25 * s, 2: 1.0})
            (d / "eval_trajectories.jsonl").write_text("".join(json.dumps(
                {"task_name": f"t{i}-{kind}", "valid": True, "policy_version": step, "reward": float(passed),
                 "num_turns": turns}) + "\n"
                for step, passed, turns in ((1, s == 1, 3), (2, True, 2))
                for i, kind in enumerate(("copy", "count"))))
        compare_algos.main(args)
        compare_algos.main(args + ["--at-step", "1"])
        final, at1 = (out / "compare.md").read_text(), (out / "compare-step1.md").read_text()
        assert "At each row's final eval" in final and "| ipa | 100.0% | 100.0% | 100.0% |" in final, final
        assert "At each variant's eval of RL step 1" in at1, at1
        assert "| ipa | 50.0% | 75.0% | 62.5% | 17.7 |" in at1, at1
        assert "| 0 | ipa | 50.0% | 3.00 | 0 0 (of 1) |" in at1, at1
        assert "| 1 | ipa | 75.0% | 3.00 | 1 1 (of 1) |" in at1, at1
        assert "| 0 | ipa | 100.0% | 2.00 | 1 1 (of 1) |" in final, final
        with pytest.raises(SystemExit, match="no held-out eval at RL step 3; it has one at step 0, 1, 2"):
            compare_algos.main(args + ["--at-step", "3"])
    finally:
        for d in made + [out]:
            shutil.rmtree(d, ignore_errors=True)


def test_status_says_where_each_run_stands_and_runs_nothing(capsys):
    """--status lists the comparison's runs in the order they run: the seed's SFT run, the variants,
    the control; each finished, running (a live process holds its lock), stopped at its newest
    checkpoint, or not started (a variant branches from its seed's SFT run). A lock file naming a
    process that started after it was written (a reused pid) is not a writer. Nothing is written."""
    name = f"cmpstatus{os.getpid()}"
    runs = ROOT / "runs"
    sft, ipa, mine, more = (runs / f"{name}-{r}-seed0" for r in ("sft3", "ipa", "mine", "sftmore4"))
    argv = ["--config", str(TINY), "--seeds", "0", "--set", f"run_name={name}", "--set", "sft.steps=3",
            "--set", "train.steps=2", "--variants", "ipa", "mine", "--variant", "mine=algo.level=token",
            "--sft-more", "4", "--status"]
    holder = None
    try:
        _finished(sft, 0, {0: 0.5})
        _finished(ipa, 1, {0: 0.5})
        (ipa / "summary.txt").unlink()  # stopped after its first RL step
        hold = ("import sys, time, rundir; from pathlib import Path; rundir.RunLock(Path(sys.argv[1])); "
                "print('held', flush=True); time.sleep(60)")
        holder = subprocess.Popen([sys.executable, "-c", hold, str(ipa)], cwd=ROOT, stdout=subprocess.PIPE,
                                  text=True)
        assert holder.stdout.readline() == "held\n"
        def written():
            return sorted(p for d in (sft, ipa, mine, more) if d.exists() for p in d.rglob("*"))
        before = written()
        compare_algos.main(argv)
        assert capsys.readouterr().out.splitlines() == [
            f"runs/{sft.name}: finished",
            f"runs/{ipa.name}: running (process {holder.pid}) at step_000001, ends at step_000002",
            f"runs/{mine.name}: not started, branches from {sft.name}",
            f"runs/{more.name}: not started",
            "1 of 4 runs finished"]
        holder.kill()
        holder.wait()
        compare_algos.main(argv)
        assert f"runs/{ipa.name}: stopped at step_000001, ends at step_000002" in capsys.readouterr().out
        lock = ipa / "writer.lock"  # names this live process, but was written before it started
        lock.write_text(f"{os.getpid()} {socket.gethostname()}\n")
        os.utime(lock, (0, 0))
        compare_algos.main(argv)
        assert f"runs/{ipa.name}: stopped at step_000001" in capsys.readouterr().out
        assert written() == before
        assert not (runs / f"compare-{name}").exists()
    finally:
        if holder:
            holder.kill()
        for d in (sft, ipa, mine, more):
            shutil.rmtree(d, ignore_errors=True)


def test_the_final_table_pairs_seeds_and_gives_a_t_interval():
    def fe(x, kinds=None, turns=(2,)):
        return {"step": 2, "success": x, "kinds": kinds or {}, "turns": list(turns)}
    finals = {"SFT-only": {0: fe(0.5, {"copy": [1, 2]}), 1: fe(0.25), 2: fe(0.5)},
              "ipa": {0: fe(0.75, {"copy": [2, 2]}, (3, 4)), 1: fe(0.5), 2: fe(0.5)},
              "sft-more 8": {0: fe(0.5), 1: fe(0.5)}}
    text = compare_algos.final_table(finals, [0, 1, 2], "ipa")
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines()}
    # ipa - SFT-only per seed: +25, +25, 0 points: mean 16.7, sd 14.4, t(2) 4.303 -> ±35.9
    # turns: every episode of every seed, (3 + 4 + 2 + 2) / 4
    assert rows["ipa"] == ("| ipa | 75.0% | 50.0% | 50.0% | 58.3% | 14.4 | +16.7 [-19.2, +52.5] |  "
                           "| 2.75 |"), text
    assert rows["SFT-only"].endswith("| 50.0% | 25.0% | 50.0% | 41.7% | 14.4 |  | -16.7 [-52.5, +19.2] "
                                     "| 2.00 |")
    # a row without seed 2 is paired on the seeds it has: +0 and +25, t(1) 12.706
    assert "| sft-more 8 | 50.0% | 50.0% | - | 50.0% | 0.0 | +12.5 [-146.3, +171.3] |" in rows["sft-more 8"]
    assert "| copy | 1/2 | 2/2 | 0/0 |" in text
    # differences that cancel read +0.0, not the -0.0 of a rounding error's sign
    assert compare_algos.paired([0.725, 0.725], [0.7375, 0.7125]) == "+0.0 [-15.9, +15.9]"


def test_the_curve_table_before_any_variant_finished_says_so():
    """compare.md is rewritten once a seed's SFT run lands, before any variant's: no empty table."""
    assert compare_algos.table({}) == "No variant's run has finished yet."
    assert compare_algos.table({"ipa": [{0: 0.5, 10: 0.75}]}).splitlines() == [
        "| step | ipa |", "|---:|---:|", "| 0 | 50.0% ± 0.0% (1) |", "| 10 | 75.0% ± 0.0% (1) |"]


def test_the_seed_rows_give_each_runs_interval_turns_and_kinds():
    """Each seed's row of each policy, as docs/results.md tabulates them: the final eval's success
    with its 95% interval, mean turns, and the passed episodes of each kind (of their count when
    every kind has as many, else passed/episodes); a seed a row lacks is left out."""
    def fe(x, ci, kinds, turns):
        return {"step": 20, "success": x, "ci": ci, "kinds": kinds, "turns": turns}
    finals = {"SFT-only": {0: fe(0.5, [0.2, 0.8], {"copy": [1, 2], "count": [1, 2]}, [2, 3, 3, 4]),
                           1: fe(0.75, [0.3, 0.95], {"copy": [2, 2], "count": [1, 2]}, [2, 2, 2, 2])},
              "ipa": {0: fe(0.25, [0.05, 0.7], {"copy": [1, 3], "count": [0, 1]}, [5, 5, 5, 5])}}
    text = compare_algos.seed_rows(finals, [0, 1])
    assert text.splitlines() == [
        "| seed | policy | held-out success [95% CI] | turns | copy count |",
        "|---:|---|---|---:|---|",
        "| 0 | SFT-only | 50.0% [20.0, 80.0] | 3.00 | 1 1 (of 2) |",
        "| 0 | ipa | 25.0% [5.0, 70.0] | 5.00 | 1/3 0/1 |",
        "| 1 | SFT-only | 75.0% [30.0, 95.0] | 2.00 | 2 1 (of 2) |"], text


@pytest.mark.slow
def test_a_comparison_killed_twice_resumes_and_branches_from_the_sft_checkpoint(tiny_model_dir, tmp_path):
    """A real comparison on the tiny model (one SFT, two variants branched from it, the sft-more
    control), SIGKILLed (its whole process group) once during a variant's RL and once during the
    control's SFT, then started again with the same command: every run finishes, the SFT run is not
    run again (its logs and summary untouched), each variant's step-0 weights are the SFT run's
    step-0 weights and its logs start with the SFT's records, RL moved them from there, and the
    control starts from the same checkpoint. The table holds each run as it finishes."""
    from safetensors.torch import load_file
    model = tmp_path / "tiny"
    shutil.copytree(tiny_model_dir, model)
    name = f"cmpkill{os.getpid()}"
    runs = ROOT / "runs"
    overrides = [f"run_name={name}", "model.build_tiny=false", f"model.path={model}",
                 "sft.steps=2", "sft.num_tasks=4", "sft.batch_size=4", "sft.val_tasks=2",
                 "sft.stop_at_val_prob=0",
                 "train.steps=2", "train.tasks_per_step=2", "train.group_size=2", "rollout.max_turns=3",
                 "rollout.max_tokens_per_turn=64", "eval.num_tasks=2", "eval.samples=1", "eval.every=0",
                 "checkpoint.every=1", "algo.negative_reward=-1.0"]  # every RL step moves the weights
    cmd = [sys.executable, "bench/compare_algos.py", "--config", str(TINY), "--seeds", "0",
           "--variants", "ipa", "ipa-token", "--sft-more", "2"] + sum((["--set", o] for o in overrides), [])
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    sft, ipa, token, more = (runs / f"{name}-{r}-seed0" for r in ("sft2", "ipa", "ipa-token", "sftmore2"))
    made = [sft, ipa, token, more, runs / f"compare-{name}"]

    def killed_once(until):
        """Start the comparison, SIGKILL its process group once until() holds."""
        with open(tmp_path / "killed.log", "a") as f:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        kill_group_when(proc, until, tmp_path / "killed.log")

    try:
        killed_once(lambda: (ipa / "checkpoints" / "step_000001").exists())
        assert not (ipa / "summary.txt").exists(), "the kill came too late to test resuming"
        sft_logs = {p.name: p.read_bytes() for p in sft.glob("*.jsonl")}
        sft_summary = (sft / "summary.txt").stat().st_mtime_ns
        killed_once(lambda: (more / "metrics.jsonl").exists())
        assert not (more / "summary.txt").exists()
        table = (runs / f"compare-{name}" / "compare.md").read_text()  # written as each run finished
        assert "| ipa-token |" in table and "| sft-more 2 |" not in table, table
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        assert f"{sft}: finished, summarised" in done.stdout and f"{ipa}: finished, summarised" in done.stdout
        assert {p.name: p.read_bytes() for p in sft.glob("*.jsonl")} == sft_logs  # not run again
        assert (sft / "summary.txt").stat().st_mtime_ns == sft_summary
        for d in (sft, ipa, token, more):
            assert (d / "summary.txt").exists(), d
        step0 = load_file(sft / "checkpoints" / "step_000000" / "model" / "model.safetensors")
        sft_records = [json.loads(line) for line in (sft / "metrics.jsonl").read_text().splitlines()]
        sft_records = [r for r in sft_records if r.get("phase") == "sft"]
        assert len(sft_records) == 2
        for d in (ipa, token):
            w0 = load_file(d / "checkpoints" / "step_000000" / "model" / "model.safetensors")
            assert w0.keys() == step0.keys() and all(w0[k].equal(step0[k]) for k in w0)
            w2 = load_file(d / "checkpoints" / "step_000002" / "model" / "model.safetensors")
            assert any(not w2[k].equal(step0[k]) for k in w2), f"{d}: RL did not move the weights"
            records = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
            assert [r for r in records if r.get("phase") == "sft"] == sft_records  # no SFT of its own
            assert [r["step"] for r in records if r.get("phase") == "rl"] == [1, 2]  # each step once
            assert sorted(r["step"] for r in records if r.get("phase") == "eval") == [0, 2]
        control = yaml.safe_load((more / "config.yaml").read_text())  # as train.py ran it
        assert Path(control["model"]["path"]) == sft / "checkpoints" / "step_000000" / "model"
        assert control["sft"]["steps"] == 2 and control["train"]["steps"] == 0
        table = (runs / f"compare-{name}" / "compare.md").read_text()
        for row in ("| SFT-only |", "| ipa |", "| ipa-token |", "| sft-more 2 |"):
            assert row in table, table
        # each run's own row, with the interval its last eval logged
        log = (runs / f"{name}-ipa-seed0" / "metrics.jsonl").read_text().splitlines()
        low, high = [r for r in map(json.loads, log) if r.get("phase") == "eval"][-1]["success_ci"]
        assert "| 0 | ipa | " in table and f" [{100 * low:.1f}, {100 * high:.1f}] |" in table, table
    finally:
        for d in made:
            shutil.rmtree(d, ignore_errors=True)
        for d in runs.glob(f"{name}-*"):  # a run moved aside when the kill came before its checkpoint
            shutil.rmtree(d, ignore_errors=True)


def test_the_programs_gemma_rows_are_the_smollm2_ones_with_only_the_model_changed():
    """Gemma's SFT runs (configs/gemma3-multistep.yaml) and its train-split IPA jobs (the IPA config
    with Gemma's keys on top: the headline's three seeds, then the recipes' seed 0) resolve to the
    same settings as each other's SFT, and to SmolLM2's but where Gemma's config differs from
    SmolLM2's: the model, and the keys that change no step of training (tests/test_gemma3.py names
    them). Its rl-split job, the first of its RL jobs, is its headline IPA on the other split."""
    import program
    jobs = program_comparisons()
    gemma_outs = [a.out for a in jobs if a.out.startswith("runs/compare-gemma3-")]
    assert gemma_outs[0] == "runs/compare-gemma3-multistep-rlsplit", gemma_outs
    gemma_jobs = [a for a in jobs if a.out in ("runs/compare-gemma3-multistep-recipes",
                                               "runs/compare-gemma3-multistep-headline")]
    assert [args.seeds for args in gemma_jobs] == [[int(s) for s in program.SEEDS], [0]]
    kind, path, sets = program.sft_job(60, 0, "gemma3-multistep")
    curve = resolved(config.load_config(ROOT / path, sets))
    ipa = ROOT / "configs" / "smollm2-multistep-ipa.yaml"
    smollm2_sft = resolved(config.load_config(ROOT / program.MULTISTEP, sets))
    model_keys = sorted(k for k in curve if curve[k] != smollm2_sft.get(k))  # the same run_name in `sets`
    assert model_keys == ["model.fetch", "model.path", "sft.val_every", "train.micro_batch_tokens"]
    for args in gemma_jobs:
        names, variants, _ = compare_algos.pick_variants(args)
        gemma = resolved(config.load_config(ipa, args.set + variants["ipa"]))
        smollm2 = resolved(config.load_config(ipa, variants["ipa"]))
        assert sorted(k for k in gemma if gemma[k] != smollm2.get(k)) == model_keys
        sft = {k: v for k, v in gemma.items() if k.startswith(("sft.", "model.", "data."))}
        assert sft == {k: v for k, v in curve.items() if k in sft}
    # IPA on the rl split: Gemma's headline IPA with the split alone changed, its control on that split
    (rl,) = [a for a in jobs if a.out == "runs/compare-gemma3-multistep-rlsplit"]
    assert rl.seeds == [0] and rl.sft_more_split == "rl"
    names, variants, _ = compare_algos.pick_variants(rl)
    split = resolved(config.load_config(ipa, rl.set + variants["ipa-rl-split"]))
    assert {k for k in split if split[k] != gemma.get(k)} == {"train.generated_split"}


def test_gemmas_seeds_run_its_best_seed_0_recipe_with_that_recipes_controls(tmp_path, monkeypatch):
    """Gemma's rows on seeds 0 1 2 are its published IPA on the train split while that is at least
    as good on seed 0 (or nothing finished), with the continued SFT on the train split; a recipe
    on the rl split once one ends above it, read against SFT on the rl split's oracles."""
    import program
    monkeypatch.setattr(program, "ROOT", tmp_path)
    runs, g = tmp_path / "runs", program.GEMMA
    _finished(runs / f"{g}-sft150-seed0", 0, {0: 0.78})
    for recipe, success, best in [(None, None, "ipa"), ("ipa", 0.80, "ipa"), ("ipa-rl-split", 0.80, "ipa"),
                                  ("ipa-rl-split-successes", 0.85, "ipa-rl-split-successes")]:
        if recipe:
            _finished(runs / f"{g}-{recipe}-seed0", program.RL_STEPS, {0: 0.78, 20: success})
        args = compare_algos.parse_args(program.headline(program.SEEDS, prefix=g))
        split = "train" if best == "ipa" else "rl"
        assert (args.out, args.seeds, args.sft_more_split) == (f"runs/compare-{g}-headline", [0, 1, 2], split)
        assert compare_algos.pick_variants(args)[0] == [best], recipe
        assert "sft.steps=150" in args.set  # from Gemma's own plateau


def test_gemmas_one_key_rows_follow_its_headline_from_its_own_best_recipe_and_grpo_lr(tmp_path, monkeypatch):
    """Gemma's one-key rows come after its headline's seeds and before SmolLM2's jobs: first the
    rows that need no sweep on seeds 0 1 2, then GRPO's lrs on seed 0, then every row on seeds 0 1
    2; they branch from its own plateau with its keys, vary its own best seed-0 recipe, and its
    seeds 1 2 take GRPO at the lr that did best on Gemma's seed 0, not SmolLM2's."""
    import program
    comparisons = program_comparisons()
    outs = [a.out for a in comparisons]
    g_onekey = "runs/compare-gemma3-multistep-onekey"
    assert outs.index(g_onekey) > outs.index("runs/compare-gemma3-multistep-headline")
    assert outs.index(g_onekey) < outs.index("runs/compare-multistep-onekey")
    jobs = [a for a in comparisons if a.out == g_onekey]
    assert [(a.seeds, len([n for n in compare_algos.pick_variants(a)[0] if n.startswith("grpo")]))
            for a in jobs] == [([0, 1, 2], 0), ([0], 3), ([0, 1, 2], 3)]  # no seed-0 GRPO run yet: all 3
    assert compare_algos.pick_variants(jobs[0])[0] == compare_algos.pick_variants(jobs[1])[0][:3]
    monkeypatch.setattr(program, "ROOT", tmp_path)
    runs, g = tmp_path / "runs", program.GEMMA
    _finished(runs / f"{g}-sft250-seed0", 0, {0: 0.85})
    _finished(runs / f"{g}-ipa-rl-split-successes-seed0", program.RL_STEPS, {0: 0.85, 20: 0.9})
    suffix = "-rl-split-successes"
    for lr, success in [("grpo-lr5e-6", 0.8), ("grpo", 0.85), ("grpo-lr1e-4", 0.9)]:
        if lr == "grpo-lr1e-4":  # a sweep not finished decides nothing: its best may be still running
            assert len(compare_algos.pick_variants(compare_algos.parse_args(
                program.onekey(program.SEEDS, prefix=g)))[0]) == 6
        _finished(runs / f"{g}-{lr}{suffix}-seed0", program.RL_STEPS, {0: 0.85, 20: success})
        smollm2 = runs / f"smollm2-multistep-{lr}{suffix}-seed0"
        _finished(smollm2, program.RL_STEPS, {0: 0.85, 20: 1.0 - success})
    sweep = compare_algos.parse_args(program.onekey(["0"], prefix=g))
    names, variants, reference = compare_algos.pick_variants(sweep)
    assert (sweep.out, reference) == (g_onekey, "ipa-rl-split-successes")
    assert names == ["ipa-rl-split-successes", f"ipa{suffix}-token", f"ipa{suffix}-prefill",
                     f"grpo-lr5e-6{suffix}", f"grpo{suffix}", f"grpo-lr1e-4{suffix}"]
    assert "sft.steps=250" in sweep.set and "model.path=out/gemma3-270m" in sweep.set
    seeds = compare_algos.parse_args(program.onekey(program.SEEDS, prefix=g))
    assert compare_algos.pick_variants(seeds)[0] == names[:3] + [f"grpo-lr1e-4{suffix}"]


def test_gemmas_by_kind_rows_differ_from_its_headline_in_the_draw_alone(tmp_path, monkeypatch):
    """Between Gemma's headline and its one-key rows, its headline recipe on seeds 0 1 2 against the
    same drawing kind by kind: one key apart, the headline's runs, start and control shared."""
    import program
    outs = [a.out for a in program_comparisons()]
    g_bykind = "runs/compare-gemma3-multistep-bykind"
    assert (outs.index("runs/compare-gemma3-multistep-headline") < outs.index(g_bykind)
            < outs.index("runs/compare-gemma3-multistep-onekey"))
    monkeypatch.setattr(program, "ROOT", tmp_path)
    runs, g = tmp_path / "runs", program.GEMMA
    _finished(runs / f"{g}-sft250-seed0", 0, {0: 0.85})
    _finished(runs / f"{g}-ipa-rl-split-successes-seed0", program.RL_STEPS, {0: 0.85, 20: 0.9})
    args = compare_algos.parse_args(program.by_kind(program.SEEDS, prefix=g))
    head = compare_algos.parse_args(program.headline(program.SEEDS, prefix=g))
    names, variants, reference = compare_algos.pick_variants(args)
    assert names == ["ipa-rl-split-successes", "ipa-rl-split-successes-bykind"] == [reference, names[1]]
    assert (args.seeds, args.set, args.sft_more, args.sft_more_split) == (
        head.seeds, head.set, head.sft_more, head.sft_more_split)
    ipa = ROOT / "configs" / "smollm2-multistep-ipa.yaml"
    used = {n: resolved(config.load_config(ipa, args.set + variants[n] + [f"run_name={n}"])) for n in names}
    assert diff_lines(used, reference)[1:] == [
        "- **ipa-rl-split-successes-bykind**: `train.draw_by_kind` True (ipa-rl-split-successes: False)"]
    assert variants[names[0]] == compare_algos.pick_variants(head)[1][names[0]]


def test_a_by_kind_headline_is_the_one_key_reference_its_by_kind_runs_and_grpo_drawing_as_it_does(tmp_path,
                                                                                                  monkeypatch):
    """With Gemma's headline recipe drawing kind by kind, its one-key rows take the by-kind job's
    runs (the same name and keys) as their reference, each row differs from it in its one key, and
    GRPO draws the tasks as it does; its by-kind job stays the plain draw against the by-kind one."""
    import program
    monkeypatch.setattr(program, "ROOT", tmp_path)
    g, plain = program.GEMMA, "ipa-rl-split-successes"
    best = f"{plain}-bykind"
    assert program.by_kind(program.SEEDS, best, g) == program.by_kind(program.SEEDS, plain, g)
    by_kind = compare_algos.parse_args(program.by_kind(["0"], plain, g))
    by_kind_variants = compare_algos.pick_variants(by_kind)[1]
    args = compare_algos.parse_args(program.onekey(["0"], best, g))
    names, variants, reference = compare_algos.pick_variants(args)
    assert reference == best and variants[best] == by_kind_variants[best]
    assert names == [best, f"{best}-token", f"{best}-prefill", "grpo-lr5e-6-rl-split-successes-bykind",
                     "grpo-rl-split-successes-bykind", "grpo-lr1e-4-rl-split-successes-bykind"]
    ipa = ROOT / "configs" / "smollm2-multistep-ipa.yaml"
    used = {n: resolved(config.load_config(ipa, args.set + variants[n] + [f"run_name={n}"])) for n in names}
    assert diff_lines(used, best)[1:3] == [
        f"- **{best}-token**: `algo.level` token ({best}: chunk)",
        f"- **{best}-prefill**: `rollout.prefill_prob` 0.5 ({best}: 0.0)"]
    for n in names[3:]:
        assert used[n]["train.draw_by_kind"] and used[n]["train.generated_split"] == "rl", n
        assert used[n]["algo.loss"] == "ppo", n
    assert args.sft_more == 0


def test_more_seeds_go_to_the_recipes_that_held_on_seed_0(tmp_path, monkeypatch):
    """The program's recipes on seeds 1 2 leave out a recipe whose seed-0 run ended 10 points or more
    below its SFT-only start; one that ended near it, and one not finished, stay."""
    import program
    monkeypatch.setattr(program, "ROOT", tmp_path)
    runs = tmp_path / "runs"
    _finished(runs / "smollm2-multistep-sft250-seed0", 0, {0: 0.85})
    _finished(runs / "smollm2-multistep-sft60-seed0", 0, {0: 0.70})
    _finished(runs / "smollm2-multistep-ipa-seed0", program.RL_STEPS, {0: 0.85, 20: 0.85})
    _finished(runs / "smollm2-multistep-ipa-rl-split-seed0", program.RL_STEPS, {0: 0.85, 20: 0.7625})
    _finished(runs / "smollm2-multistep-ipa-rl-kinds-seed0", program.RL_STEPS, {0: 0.85, 20: 0.75})
    kept = program.held_recipes()
    assert kept[:2] == ["ipa", "ipa-rl-split"] and "ipa-rl-kinds" not in kept
    assert set(program.RECIPES) - set(kept) == {"ipa-rl-kinds"}
    names = compare_algos.pick_variants(compare_algos.parse_args(program.recipes(["1", "2"], kept)))[0]
    assert names == kept


def test_decisions_given_on_the_command_line_stand_in_for_the_runs_they_are_read_from(tmp_path, monkeypatch,
                                                                                        capsys):
    """On an empty runs/, the program's own example (its docstring) lists Gemma's by-kind and seed-0
    one-key jobs from the plateau and recipe it gives; without them, from the config's 60 SFT steps
    and the published IPA. A model, budget, recipe or job it does not know is refused, naming what
    it takes."""
    import program
    monkeypatch.setattr(program, "ROOT", tmp_path)

    def listed(argv: list) -> list:
        monkeypatch.setattr(program, "DECIDED", {"plateau": {}, "best": {}})
        program.main(["--list", *argv])
        lines = capsys.readouterr().out.splitlines()
        jobs = [compare_algos.parse_args(shlex.split(line.split("compare_algos.py ", 1)[1]))
                for line in lines if "compare_algos.py " in line]
        # each comparison's runs, indented under it, ending with its count (--status)
        counts = [line for line in lines if line.startswith("    ") and line.endswith(" runs finished")]
        assert [c.split(" of ")[1] for c in counts] == [
            f"{len(a.seeds) * (1 + len(compare_algos.pick_variants(a)[0]) + (a.sft_more > 0))} runs finished"
            for a in jobs], lines
        return jobs

    doc = program.__doc__.replace("\\\n", " ")  # the example's continued line, as a shell reads it
    (example,) = [shlex.split(line.split("program.py", 1)[1]) for line in doc.splitlines()
                  if "python bench/program.py --plateau" in line]
    g = f"runs/compare-{program.GEMMA}"
    for argv, steps, best in [(example, 250, "ipa-rl-split-successes"), (["--jobs", "7", "8"], 60, "ipa")]:
        jobs = listed(argv)
        assert [a.out for a in jobs] == [f"{g}-bykind", f"{g}-onekey"], argv
        for args in jobs:
            assert f"sft.steps={steps}" in args.set and "model.path=out/gemma3-270m" in args.set
            assert compare_algos.pick_variants(args)[0][0] == best
    for bad, says in [(["--plateau", "gemma3-multistep=100"], "one of 60, 150, 250"),
                      (["--best", "qwen=ipa"], "one of smollm2-multistep, gemma3-multistep"),
                      (["--best", "gemma3-multistep=grpo"], "ipa-rl-split-successes"),
                      (["--jobs", "3", "99"], f"numbered 0 to {len(program.JOBS) - 1}")]:
        with pytest.raises(SystemExit):
            listed(bad)
        assert says in capsys.readouterr().err, bad
