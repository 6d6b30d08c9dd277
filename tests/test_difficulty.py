"""Online difficulty filtering (difficulty.py): which tasks sit out, for how long, what a
checkpoint keeps of it, the zero_adv_frac metric; and a short real run with the filter on. The
curation before RL step 1 (train.curate_k): which tasks it keeps, and a real run of it, refused
and resumed."""
import json
import os
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from difficulty import DifficultyFilter, moderate, step_tasks, zero_adv_frac
from generated_tasks import generate_multistep_tasks

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class T:
    name: str


TASKS = [T(n) for n in ("easy", "hard", "mid", "other")]


def test_always_and_never_solved_tasks_sit_out_after_the_window_and_come_back():
    f = DifficultyFilter(window=3, sit_out=2)
    for step in range(3):  # easy always solved, hard never, mid both ways
        assert f.sitting_out(step) == set()
        f.record(step, [("easy", True), ("hard", False), ("mid", step % 2 == 0)])
    # decided at step 2 (its third episode): out at steps 3 and 4, drawn again at 5
    assert f.sitting_out(3) == f.sitting_out(4) == {"easy", "hard"}
    tasks, n_out, fell_back = f.draw(TASKS, 3, 4, seed=0)
    assert {t.name for t in tasks} <= {"mid", "other"} and n_out == 2 and not fell_back
    assert tasks == step_tasks([T("mid"), T("other")], 3, 4, 0)  # the epoch stream over those left
    f.record(3, [("mid", False)])
    f.record(4, [("mid", True)])  # mid's window is now 1, 0, 1: mixed, it stays
    assert f.sitting_out(5) == set()
    assert "easy" in {t.name for t in f.draw(TASKS, 5, 8, seed=0)[0]}
    # back, and still always solved: its latest 3 episodes decide again at once
    f.record(5, [("easy", True), ("hard", True)])
    assert f.sitting_out(6) == {"easy"}


def test_several_episodes_a_step_fill_the_window_and_a_mixed_group_never_benches():
    f = DifficultyFilter(window=4, sit_out=1)
    f.record(0, [("a", False)] * 4 + [("b", True), ("b", False), ("b", True), ("b", True)])
    assert f.sitting_out(1) == {"a"} and f.sitting_out(2) == set()
    # episodes of one step arrive in any order: the window is the same
    g, h = DifficultyFilter(3, 2), DifficultyFilter(3, 2)
    g.record(0, [("c", True), ("c", False), ("c", True), ("c", True)])
    h.record(0, [("c", True), ("c", True), ("c", True), ("c", False)])
    assert g.state() == h.state()


def test_all_sitting_out_falls_back_to_every_task_and_off_is_step_tasks():
    f = DifficultyFilter(window=1, sit_out=3)
    f.record(0, [(t.name, False) for t in TASKS])
    tasks, n_out, fell_back = f.draw(TASKS, 1, 2, seed=7)
    assert n_out == 4 and fell_back and tasks == step_tasks(TASKS, 1, 2, 7)
    off = DifficultyFilter(window=0, sit_out=3)
    off.record(0, [(t.name, False) for t in TASKS])
    assert off.state() == {"recent": {}, "benched": {}}
    assert all(off.draw(TASKS, s, 3, 1) == (step_tasks(TASKS, s, 3, 1), 0, False) for s in range(6))


def test_a_draw_by_kind_meets_every_kind_once_in_every_len_kinds_draws():
    """train.draw_by_kind on the real multi-step rl split (10 kinds of 9 or 8 tasks): every window
    of len(kinds) consecutive draws holds each kind once, across step boundaries; each kind's own
    tasks all come before any comes again; the stream is the seed's, and the difficulty filter's
    draw keeps it over the tasks not sitting out. A plain draw is unchanged by the key's existence."""
    tasks = generate_multistep_tasks(83, seed=1, split="rl")
    kind = {t.name: t.metadata["kind"] for t in tasks}
    n_kinds = len(set(kind.values()))
    stream = [t.name for s in range(50) for t in step_tasks(tasks, s, 4, 1, by_kind=True)]
    assert stream == [t.name for t in step_tasks(tasks, 0, 200, 1, by_kind=True)]  # steps cut one stream
    for i in range(len(stream) - n_kinds + 1):
        assert len({kind[name] for name in stream[i:i + n_kinds]}) == n_kinds, i
    for k in set(kind.values()):
        mine, size = [n for n in stream if kind[n] == k], sum(v == k for v in kind.values())
        assert all(len(set(mine[e:e + size])) == len(mine[e:e + size]) for e in range(0, len(mine), size)), k
    assert stream != [t.name for s in range(50) for t in step_tasks(tasks, s, 4, 2, by_kind=True)]
    # the plain draw is the per-epoch permutation runs made before the key existed
    plain = [tasks[random.Random(f"1-{i // 83}").sample(range(83), 83)[i % 83]].name for i in range(200)]
    assert [t.name for t in step_tasks(tasks, 0, 200, 1)] == plain != stream
    f = DifficultyFilter(window=1, sit_out=5, by_kind=True)
    f.record(0, [(t.name, True) for t in tasks if t.metadata["kind"] == "locate"])
    drawn = [t for s in range(1, 4) for t in f.draw(tasks, s, 9, seed=1)[0]]
    assert all(len({t.metadata["kind"] for t in drawn[i:i + 9]}) == 9 for i in range(len(drawn) - 8))
    assert "locate" not in {t.metadata["kind"] for t in drawn}


def test_async_lag_reads_only_decisions_the_trainer_has_surely_recorded():
    """Under train.mode async the producer draws step s while the trainer may or may not have
    recorded steps s-1-lag+1 .. s-1: those decisions must not change the draw."""
    f = DifficultyFilter(window=1, sit_out=2, lag=1)
    f.record(0, [("easy", True)])
    assert f.sitting_out(1) == set()              # drawn before step 0 was surely recorded
    assert f.sitting_out(2) == f.sitting_out(3) == {"easy"} and f.sitting_out(4) == set()


def test_state_round_trips_through_a_checkpoint_file(tmp_path):
    f = DifficultyFilter(window=2, sit_out=3)
    for step in range(4):
        f.record(step, [("easy", True), ("hard", False), ("mid", step % 2 == 1)])
    torch.save({"difficulty": f.state()}, tmp_path / "trainer.pt")
    g = DifficultyFilter(window=2, sit_out=3)
    g.load(torch.load(tmp_path / "trainer.pt", weights_only=True)["difficulty"])
    assert g.state() == f.state() and g.recent == f.recent and g.benched == f.benched
    for step in range(4, 10):  # the two go on alike, draw for draw
        assert g.draw(TASKS, step, 3, 0) == f.draw(TASKS, step, 3, 0)
        outcome = [("easy", step % 3 == 0), ("mid", True)]
        f.record(step, outcome)
        g.record(step, outcome)
    g.load({})  # a checkpoint from before the filter: empty
    assert g.state() == {"recent": {}, "benched": {}}


def test_zero_adv_frac_on_hand_built_rewards():
    outcomes = [(0, 1.0), (0, 1.0),   # all solved: no contrast
                (1, 0.0), (1, 0.0),   # all failed
                (2, 1.0), (2, 0.0),   # mixed
                (3, 0.5), (3, 0.5)]   # graded, equal
    assert zero_adv_frac(outcomes, "grpo") == zero_adv_frac(outcomes, "rloo") == 3 / 4
    assert zero_adv_frac(outcomes, "none") == 1 / 4  # IPA, absolute returns: only group 1 has no success
    assert zero_adv_frac([], "grpo") == 0.0
    assert zero_adv_frac([(5, 0.0)], "none") == 1.0 and zero_adv_frac([(5, 0.0)], "grpo") == 1.0


def test_curation_keeps_the_tasks_both_solved_and_failed_in_first_seen_order():
    kept, counts = moderate([("a", True), ("b", False), ("c", True), ("b", True), ("a", True),
                             ("c", False), ("d", False), ("d", False)])
    assert kept == ["b", "c"] and counts == {"a": [2, 2], "b": [1, 2], "c": [1, 2], "d": [0, 2]}
    assert moderate([]) == ([], {}) and moderate([("a", True)]) == ([], {"a": [1, 1]})


def test_a_short_run_with_the_filter_on_logs_and_resumes_it(tiny_model_dir, tmp_path):
    """A real run (no SFT: the tiny model solves nothing) on 3 train tasks, 2 a step, window 1:
    every task played sits out the next 2 steps, and the metrics say it each step. Run to 2 steps
    and resumed to 3, it draws at step 3 what a 3-step run does: the filter's state came back from
    the checkpoint."""
    overrides = ["model.build_tiny=false", f"model.path={tiny_model_dir}", "engine.kind=hf", "sft.steps=0",
                 "data.num_generated_train=3", "train.tasks_per_step=2", "train.group_size=1",
                 "rollout.max_turns=1", "rollout.max_tokens_per_turn=16", "eval.num_tasks=0",
                 "checkpoint.every=1", "plot=false", "tensorboard=false",
                 "train.filter_window=1", "train.filter_sit_out=2"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}

    def run(out, steps, *extra):
        cmd = [sys.executable, "train.py", "--config", "configs/tiny.yaml", *extra] + sum(
            (["--set", o] for o in overrides + [f"out_dir={out}", f"train.steps={steps}"]), [])
        p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
        return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
                if r["phase"] == "rl"]

    whole = run(tmp_path / "whole", 3)
    assert all(r["success"] == 0.0 for r in whole)  # the premise: every task is never solved
    assert [r["zero_adv_frac"] for r in whole] == [1.0, 1.0, 1.0]  # IPA, no success in any group
    # step 1 plays 2 of the 3 tasks; both sit out step 2, which plays the third alone (twice);
    # at step 3 all three sit out: the draw falls back to all of them, and says so
    assert [r["tasks_sitting_out"] for r in whole] == [0, 2, 3]
    assert [r["filter_fell_back"] for r in whole] == [False, False, True]
    assert len(set(whole[1]["tasks"])) == 1 and whole[1]["tasks"][0] not in whole[0]["tasks"]
    part = tmp_path / "part"
    run(part, 2)
    resumed = run(part, 3, "--resume")
    assert [(r["step"], r["tasks"], r["tasks_sitting_out"]) for r in resumed] == \
        [(r["step"], r["tasks"], r["tasks_sitting_out"]) for r in whole]
    state = torch.load(part / "checkpoints" / "step_000003" / "trainer.pt", weights_only=False)["difficulty"]
    assert state == torch.load(tmp_path / "whole" / "checkpoints" / "step_000003" / "trainer.pt",
                               weights_only=False)["difficulty"]


def _harbor_task(root: Path, name: str, test_sh: str):
    """A Harbor task folder whose verifier is `test_sh` (it writes /logs/verifier/reward.txt)."""
    d = root / name
    for sub in ("environment", "solution", "tests"):
        (d / sub).mkdir(parents=True)
    (d / "environment" / "Dockerfile").write_text("FROM termrl-base:bookworm\nWORKDIR /app\n")
    (d / "solution" / "solve.sh").write_text("#!/bin/bash\ntrue\n")
    (d / "tests" / "test.sh").write_text("#!/bin/bash\n" + test_sh + "\n")
    (d / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 30.0\n')
    (d / "instruction.md").write_text("Submit when you are done.\n")


def test_a_curated_run_draws_the_tasks_both_solved_and_failed_and_resumes_on_its_choice(
        tiny_model_dir, tmp_path):
    """train.curate_k, on real task folders whatever the policy does: `coin` passes an episode half
    the time, `never` none. The start policy plays curate_k episodes of each of RL's first draws
    before step 1; RL then draws `coin` alone, and the choice is in metrics.jsonl with every task's
    count. Resumed from a later checkpoint it plays nothing again and draws `coin` still; with no
    task kept the run stops saying which keys to change. curate_k 1 is refused: one episode cannot
    be both solved and failed."""
    import config
    tasks = tmp_path / "tasks"
    _harbor_task(tasks, "coin", "echo $((RANDOM % 2)) > /logs/verifier/reward.txt")  # 16 alike: 2^-15
    _harbor_task(tasks, "never", "echo 0 > /logs/verifier/reward.txt")
    out = tmp_path / "run"
    sets = ["model.build_tiny=false", f"model.path={tiny_model_dir}", "engine.kind=hf", "sft.steps=0",
            f"data.train_tasks={tasks}", "data.eval_tasks=", "train.tasks_per_step=2", "train.group_size=1",
            "rollout.max_turns=1", "rollout.max_tokens_per_turn=16", "checkpoint.every=1", "plot=false",
            "tensorboard=false", "train.curate_k=16", "train.curate_tasks=5"]  # more than there are
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}

    def run(out, steps, *extra):
        cmd = [sys.executable, "train.py", "--config", "configs/tiny.yaml", *extra] + sum(
            (["--set", o] for o in sets + [f"out_dir={out}", f"train.steps={steps}"]), [])
        return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)

    def records(out, phase):
        return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
                if r["phase"] == phase]

    p = run(out, 2)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    (curated,) = records(out, "curate")
    assert (curated["k"], curated["tried"], curated["kept"]) == (16, 2, ["coin"])
    assert curated["counts"]["never"] == [0, 16] and 0 < curated["counts"]["coin"][0] < 16
    played = (out / "curate_trajectories.jsonl").read_text().splitlines()
    assert sorted(json.loads(r)["task_name"] for r in played) == ["coin"] * 16 + ["never"] * 16
    assert [r["tasks"] for r in records(out, "rl")] == [["coin", "coin"]] * 2
    p = run(out, 3, "--resume")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert (out / "curate_trajectories.jsonl").read_text().splitlines() == played
    assert len(records(out, "curate")) == 1
    assert [r["tasks"] for r in records(out, "rl")] == [["coin", "coin"]] * 3
    (tasks / "coin").rename(tmp_path / "coin")  # `never` alone: nothing to keep
    p = run(tmp_path / "none", 1)
    assert p.returncode == 1 and "raise train.curate_k or train.curate_tasks" in p.stderr, p.stderr[-3000:]
    with pytest.raises(config.ConfigError, match="train.curate_k is 1"):
        config.load_config(ROOT / "configs" / "tiny.yaml", ["train.curate_k=1"])
