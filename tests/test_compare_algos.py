"""bench/compare_algos.py's own parts, without training: --variant parsing, the line per variant
naming the keys that differ from the reference, which runs are run, resumed or summarised, and a
--no-run summary over finished run directories in a stable order."""
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import compare_algos  # noqa: E402
import config  # noqa: E402
from compare_algos import diff_lines, parse_variant, resolved, run_action  # noqa: E402

TINY = ROOT / "configs" / "tiny.yaml"


def test_a_variant_is_a_name_and_its_overrides_commas_inside_values_kept():
    assert parse_variant("lr-high=train.lr=5e-3,algo.gamma=0.9") == ("lr-high", ["train.lr=5e-3", "algo.gamma=0.9"])
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
                         "- **ipa-filter**: `train.filter_window` 4 (ipa: 0)"]  # seed and run_name are not differences
    grpo = lines[4]
    for key in ("algo.loss` ppo (ipa: ipa)", "algo.baseline` grpo", "algo.gamma` 1.0 (ipa: 0.95)",
                "algo.mismatch` token_tis", "algo.agg` token_mean", "algo.std_normalize` True"):
        assert key in grpo, grpo
    same = {"a": used["ipa"], "b": dict(used["ipa"])}
    assert diff_lines(same, "b") == ["- **a**: no key differs from b", "- **b**: the reference"]


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
        compare_algos.main(["--config", str(TINY), "--no-run", "--seeds", "1", "0", "1", "--set", f"run_name={name}",
                            "--set", "train.steps=1", "--variants", "mine", "ipa", "--variant",
                            "mine=algo.level=token,algo.loss=ipa,rollout.prefill_prob=0.0", "--reference", "ipa"])
        text = (out / "compare.md").read_text()
        assert "seeds [0, 1]" in text and "| step | mine | ipa |" in text
        assert "| 1 | 87.5% ± 17.7% (2) | 37.5% ± 17.7% (2) |" in text, text
        assert "- **mine**: `algo.level` token (ipa: chunk)\n- **ipa**: the reference" in text
        compare_algos.main(["--config", str(TINY), "--no-run", "--seeds", "0", "--set", f"run_name={name}",
                            "--set", "train.steps=1", "--variants", "ipa", "--variant", "mine=algo.level=token"])
        assert "| step | ipa | mine |" in (out / "compare.md").read_text()  # yours run after --variants
        with pytest.raises(SystemExit, match="unfinished"):
            compare_algos.main(["--config", str(TINY), "--no-run", "--seeds", "0", "--set", f"run_name={name}",
                                "--set", "train.steps=2", "--variants", "ipa"])
        with pytest.raises(SystemExit, match="unknown variant 'nope'"):
            compare_algos.main(["--config", str(TINY), "--no-run", "--variants", "nope"])
        with pytest.raises(SystemExit, match="name is taken"):
            compare_algos.main(["--config", str(TINY), "--no-run", "--variant", "ipa=train.lr=1"])
    finally:
        for d in made + [out]:
            shutil.rmtree(d, ignore_errors=True)
