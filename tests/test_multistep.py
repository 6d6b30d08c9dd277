"""The multi-step generated family: every kind's oracle passes and doing nothing fails in a real
container, the deciding value is only in an earlier command's output, shortcuts fail, the splits
are disjoint, and a run config draws the family."""
import dataclasses
import re
import sys
from pathlib import Path

import pytest

import chat
import config
import generated_tasks as G
import grading
import tasktool
from task_folders import oracle_commands

ROOT = Path(__file__).resolve().parents[1]


def one_per_kind(split: str, seed: int = 0) -> list:
    return G.generate_multistep_tasks(len(G.MULTISTEP_KINDS), seed=seed, split=split)


def mentions(text: str, value: str) -> bool:
    """value appears in text as a whole word or path ("log" is not in "/app/logs")."""
    return re.search(rf"(?<!\w){re.escape(value)}(?!\w)", text) is not None


def test_every_kind_passes_oracle_k_times_and_fails_noop(docker_env):
    for split, k in [("heldout", 3), ("train", 1), ("rl", 1)]:
        for task in one_per_kind(split, seed=5):
            row = tasktool.validate_task(docker_env, task, k=k)
            assert row["status"] == "ok" and row["noop"] == 0.0 and row["oracle"] == [1.0] * k, row


def test_the_deciding_value_is_seen_in_an_earlier_output_before_the_oracle_types_it(docker_env):
    """The oracle's first command types none of the hidden values; each one it types later was
    printed by one of the commands before (so a model imitating it must read, then act)."""
    for task in one_per_kind("train", seed=7):
        cmds, outputs = oracle_commands(task), []
        assert len(cmds) >= 2, task.name
        with docker_env.reset(task) as term:
            for cmd in cmds:
                outputs.append(term.run(cmd).output)
            assert grading.grade(term).reward == 1.0, task.name
        for value in task.metadata["hidden"]:
            first = next(i for i, c in enumerate(cmds) if mentions(c, value))
            assert first >= 1 and any(mentions(out, value)
                                      for out in outputs[:first]), (task.name, value, outputs)


def test_a_tasks_files_carry_one_fixed_time_whenever_an_episode_starts(docker_env):
    """`ls -l` (chmod's inspection) prints each file's time: set at the episode's start, it would
    put the wall clock into the oracle trajectories SFT imitates and the observations a policy acts
    on, so two runs of one config would train on different tokens. Every file a task's setup makes,
    and every member of archive's tarball, carries G.SETUP_MTIME instead."""
    for task in one_per_kind("train", seed=3) + G.generate_easy_tasks(len(G.EASY_KINDS), seed=3):
        with docker_env.reset(task) as term:
            times = term.run("find /app -printf '%T@ %p\\n'").output.split("\n")[:-1]
            if G.task_kind(task.name) == "archive":
                times += term.run("mkdir /tmp/x && tar -xzf /app/bundle.tar.gz -C /tmp/x && "
                                  "find /tmp/x -mindepth 1 -printf '%T@ %p\\n'").output.split("\n")[:-1]
        assert times and all(t.startswith(f"{G.SETUP_MTIME}.0000000000 /") for t in times), \
            (task.name, times)


# A shortcut per kind that acts without reading the deciding value (or on all candidates at once).
SHORTCUTS = {
    "grep": "cat /app/box/* > /app/found.txt",
    "longest": "ls /app/logs > /app/answer.txt",
    "config": "for v in $(sed -n 's/.* = //p' /app/settings.conf); do mkdir -p /app/$v; done",
    "pointer": "cat /app/docs/* > /app/current.txt",
    "chain": "grep -h answer /app/clues/* | cut -d' ' -f2 > /app/answer.txt",
    "missing": "bash /app/run.sh > /app/output.txt",
    "chmod": "chmod +x /app/bin/*; for f in /app/bin/*; do $f; done > /app/out.txt",
    "crlf": "for f in /app/scripts/*; do sed -i 's/\\r$//' $f; bash $f; done > /app/result.txt",
    "archive": "mkdir -p /app/unpacked && tar -xzf /app/bundle.tar.gz -C /app/unpacked && "
               "echo \"files: $(tar -tzf /app/bundle.tar.gz | wc -l)\" > /app/tally.txt",
    "locate": "mkdir -p /app/found && find /app/tree -name '*.bak' -exec mv {} /app/found/ \\;",
}


def test_shortcuts_and_another_tasks_oracle_fail(docker_env):
    """No fixed command sequence solves a kind: a shortcut that skips the inspection fails, and so
    does the oracle of another task of the same kind whose deciding value differs."""
    assert set(SHORTCUTS) == set(G.MULTISTEP_KINDS)
    tasks = G.generate_multistep_tasks(6 * len(G.MULTISTEP_KINDS), seed=11)
    for task in tasks[:len(G.MULTISTEP_KINDS)]:
        kind = task.metadata["kind"]
        other = next(t for t in tasks if t.metadata["kind"] == kind
                     and t.metadata["hidden"][-1] != task.metadata["hidden"][-1])
        for cmds in ([SHORTCUTS[kind]], oracle_commands(other)):
            with docker_env.reset(task) as term:
                for cmd in cmds:
                    term.run(cmd)
                g = grading.grade(term)
            assert g.infra_error is None and g.reward == 0.0, (task.name, cmds, g.output)


def test_no_hidden_value_is_in_the_instruction():
    for split in G.SPLITS:
        for task in G.generate_multistep_tasks(300, seed=2, split=split):
            hidden = task.metadata["hidden"]
            assert hidden and len(oracle_commands(task)) >= 2, task.name
            for value in hidden:
                assert not mentions(task.instruction, value), (task.name, value)


def test_a_generated_tasks_kind_is_read_back_from_its_name_alone():
    """Trajectories and evals carry a task's name, not its metadata: task_kind gives the kind the
    generator drew, for every kind of both families."""
    for tasks in (G.generate_multistep_tasks(len(G.MULTISTEP_KINDS), seed=4, split="rl"),
                  G.generate_easy_tasks(12, seed=4)):
        assert all(G.task_kind(t.name) == t.metadata["kind"] for t in tasks)


def test_splits_share_no_name_word_or_number_and_are_deterministic():
    tasks = {s: G.generate_multistep_tasks(300, seed=0, split=s) for s in G.SPLITS}
    train = tasks["train"]
    assert [(t.instruction, t.setup, t.solution) for t in train] == \
        [(t.instruction, t.setup, t.solution) for t in G.generate_multistep_tasks(300, seed=0)]
    assert all({t.metadata["kind"] for t in ts} == set(G.MULTISTEP_KINDS) for ts in tasks.values())

    def words(tasks):
        return set(re.findall(r"[a-z]+", " ".join(t.instruction + t.setup + t.solution for t in tasks)))
    vocab = {s: set(G._EASY_WORDS[s]) | set(G._EASY_NAMES[s]) for s in G.SPLITS}
    for a in G.SPLITS:
        assert vocab[a] & words(tasks[a]), a
        for b in set(G.SPLITS) - {a}:
            assert not vocab[b] & words(tasks[a]), (a, b)
            # a count, printed number or script constant of one split is new to its kind in another
            for kind in G.MULTISTEP_KINDS:
                got = [{x for t in tasks[s] if t.metadata["kind"] == kind for x in t.metadata["numbers"]}
                       for s in (a, b)]
                assert not got[0] & got[1], (a, b, kind)
    def counts(split, kinds=("longest", "archive")):  # line and file counts
        return {x for t in tasks[split] if t.metadata["kind"] in kinds for x in t.metadata["numbers"]}
    assert max(counts("train")) < 10 <= min(counts("heldout"))  # one digit in training, two held out
    assert max(counts("heldout")) < min(counts("rl")) <= max(counts("rl")) < 100  # rl: two, past held-out
    assert min(min(counts(s, ["archive"])) for s in G.SPLITS) >= 3  # never a guessable 1 or 2 files
    assert sum(bool(t.metadata["numbers"]) for t in train) >= 5 * 30
    assert {t.solution for t in G.generate_multistep_tasks(30, seed=1)} != {t.solution for t in train[:30]}


def test_a_run_config_draws_the_family_it_names():
    cfg = config.load_config(ROOT / "configs" / "smollm2-multistep.yaml")
    train, held = G.load_task_sets(cfg)
    assert {t.metadata["family"] for t in train + held} == {"multistep"}
    assert len(held) == cfg.eval.num_tasks  # held-out tasks share instructions with train tasks, not values
    assert {t.metadata["kind"] for t in held} == set(G.MULTISTEP_KINDS)
    assert not {(t.instruction, t.solution) for t in held} & {(t.instruction, t.solution) for t in train}
    cfg = config.load_config(ROOT / "configs" / "smollm2-multistep.yaml",
                             ["data.generated_kinds=[crlf,chain]"])
    assert {t.metadata["kind"] for t in G.load_task_sets(cfg)[0]} == {"crlf", "chain"}
    for override, needle in [("data.generated_family=hard", "'data.generated_family' is 'hard'"),
                             ("data.generated_kinds=[create]",
                              "unknown kinds ['create'] of the multistep family")]:
        with pytest.raises(config.ConfigError, match=re.escape(needle)):
            config.load_config(ROOT / "configs" / "smollm2-multistep.yaml", [override])



def bash_call(cmd: str) -> dict:
    return {"role": "assistant", "content": "", "tool_call": {"name": "bash", "arguments": {"command": cmd}}}


def test_multistep_choices_classes_picks_against_a_real_listing(docker_env):
    """bench/multistep_choices.py reads the listing a real container printed: the oracle's pick is
    "right", the listing's first (when wrong) and another file are told apart, a made-up name is
    "not listed" (a listed name miscopied too), and an episode that never listed is "no pick"."""
    sys.path.insert(0, str(ROOT / "bench"))
    from multistep_choices import choice, listing
    for kind in ("longest", "crlf", "chmod"):
        task = G.generate_multistep_tasks(1, seed=11, split="heldout", kinds=[kind])[0]
        inspect, act = oracle_commands(task)[:2]
        with docker_env.reset(task) as term:
            shown = chat.tool_message(term.run(inspect))
        names, right = listing(kind, shown["content"])
        assert right.rsplit(".", 1)[0] == task.metadata["hidden"][0], (kind, shown)
        stems = [n.rsplit(".", 1)[0] for n in names]
        start = [{"role": "user", "content": task.instruction}, bash_call(inspect), shown]
        picks = {"right": right.rsplit(".", 1)[0], "not listed": "nosuchname",
                 "other listed": next(s for s in stems[1:] if s != right.rsplit(".", 1)[0])}
        if names[0] != right:
            picks["first listed"] = stems[0]
        for want, stem in picks.items():
            cmd = act.replace(picks["right"], stem)
            assert choice(kind, start + [bash_call(cmd)]) == want, (kind, cmd, shown)
        assert choice(kind, start[:1] + [bash_call(act)]) == "no pick"
        if kind == "chmod":  # a listed name miscopied with a space is not the listed file
            assert choice(kind, start + [bash_call(act.replace("/app/bin/", "/app/bin/ "))]) == "not listed"


def test_own_episodes_counts_a_runs_real_episodes_by_kind_window_and_pick(docker_env, tiny_tokenizer,
                                                                         tmp_path, capsys):
    """bench/own_episodes.py on a trajectories.jsonl that rollout.write_jsonl wrote from episodes
    played in real containers: the oracle's pass and pick right, a policy that submits at once
    fails with no pick, each in the window of the RL step its policy version sampled; a kind not
    drawn in a window is told from one that failed; episodes from expert prefixes count apart; and
    --groups lists a kind's groups in step order with their prefix and last commands."""
    import rollout
    from policy import ScriptedPolicy
    sys.path.insert(0, str(ROOT / "bench"))
    import own_episodes
    tasks = [G.generate_multistep_tasks(1, seed=3, split="rl", kinds=[k])[0] for k in ("chmod", "grep")]
    rcfg = rollout.RolloutConfig(max_turns=4, num_workers=2)
    with ScriptedPolicy(tiny_tokenizer, "oracle") as oracle:
        passed = rollout.collect(tasks, oracle, docker_env, rcfg, group_size=1, progress=False)
    with ScriptedPolicy(tiny_tokenizer, "fixed", commands=()) as noop:
        failed = rollout.collect(tasks, noop, docker_env, rcfg, group_size=1, progress=False)
    chmod = [t for t in passed if G.task_kind(t.task_name) == "chmod"]
    # RL steps 1, 3, 4, 6; at step 7 one chmod group with a pass and a failure
    mixed = [dataclasses.replace(t, group_id=chmod[0].group_id)
             for t in chmod + [t for t in failed if G.task_kind(t.task_name) == "chmod"]]
    # at step 8 chmod from expert prefixes: the no-op submits after the oracle's first k commands
    with ScriptedPolicy(tiny_tokenizer, "fixed", commands=()) as noop:
        prefilled = rollout.collect(tasks[:1], noop, docker_env, dataclasses.replace(rcfg, prefill_prob=1.0),
                                    group_size=2, progress=False)
    assert all(t.prefill_k > 0 for t in prefilled)
    for version, trajs in ((0, passed), (2, failed), (3, passed), (5, chmod), (6, mixed), (7, prefilled)):
        for t in trajs:
            t.policy_version = version
        rollout.write_jsonl(trajs, tmp_path / "trajectories.jsonl")
    own_episodes.main([str(tmp_path), "--window", "2"])
    table = capsys.readouterr().out
    assert "| kind | steps 1-2 | steps 3-4 | steps 5-6 | steps 7-8 |" in table, table
    right, half = "1 of 1 (1 / 0 / 0 / 0 / 0)", "1 of 2 (1 / 0 / 0 / 0 / 1)"
    assert f"| chmod | {right} | {half} | {right} | {half} |" in table, table
    assert "| grep | 1 of 1 | 1 of 2 | - | - |" in table, table  # not drawn in steps 5-8
    # the prefilled episodes apart from the policy's own: what passed them may be the expert's turns
    won = sum(t.reward > 0 for t in prefilled)
    assert f"| chmod, prefilled | - | - | - | {won} of 2 (" in table, table
    # groups passed whole, mixed, failed whole: the mixed one is step 7's; the prefilled one apart
    assert "| chmod | 3 | 1 | 1 |" in table and "| grep | 2 | 0 | 1 |" in table, table
    whole = "1 | 0 | 0" if won == 2 else "0 | 1 | 0" if won else "0 | 0 | 1"
    assert f"| chmod, prefilled | {whole} |" in table, table
    # --groups: each chmod group in step order, its prefix, passes and its episodes' last commands
    own_episodes.main([str(tmp_path), "--groups", "chmod"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "-chmod |" in line]
    assert [r.split(" | ")[0] for r in rows] == ["| 1", "| 3", "| 4", "| 6", "| 7", "| 8"], rows
    oracle = [c.replace("|", "\\|") for c in oracle_commands(tasks[0])]
    assert rows[0].endswith(f"| 0 | 1 of 1 | `{oracle[-1]}` (1) |"), rows
    assert rows[1].endswith("| 0 | 0 of 1 | no command (1) |"), rows
    assert f"| 0 | 1 of 2 | `{oracle[-1]}` (1); no command (1) |" in rows[4], rows
    k = prefilled[0].prefill_k  # one anchor a group: the no-op's last command is the prefix's last
    assert rows[5].endswith(f"| {k} | {won} of 2 | `{oracle[k - 1]}` (2) |"), rows
    with pytest.raises(SystemExit, match="--groups copy: .* no group of that kind; its kinds: chmod, grep"):
        own_episodes.main([str(tmp_path), "--groups", "copy"])
    with pytest.raises(SystemExit, match="not there"):
        own_episodes.main([str(tmp_path / "sft-only")])
    with pytest.raises(SystemExit, match="curate_trajectories.jsonl: not there"):  # the log it was told
        own_episodes.main([str(tmp_path), "--log", "curate_trajectories.jsonl"])


def test_pick_probe_scores_the_oracles_own_turn_as_the_trainer_does(docker_env, tiny_model_dir):
    """bench/pick_probe.py, on oracle trajectories played in real containers: the right candidate
    is the oracle's own deciding turn, token for token; the others differ from it in the file name
    alone; and a candidate's score is the sum of the log-probs the trainer computes for that turn
    (learner.policy_logprobs, a different code path), so the probe scores what training sees."""
    import dataclasses
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    import learner
    import rollout
    from policy import ScriptedPolicy
    sys.path.insert(0, str(ROOT / "bench"))
    from pick_probe import decisions, score, summarise
    cfg = config.load_config(ROOT / "configs" / "tiny.yaml", ["rollout.max_turns=4"])
    rcfg = dataclasses.replace(config.rollout_cfg(cfg), prefill_prob=0.0, group_redundancy=0)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    fmt = chat.ChatFormat(tok, tools=rcfg.tools, template_kwargs=rcfg.chat_template_kwargs)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    for kind in ("longest", "crlf", "chmod"):
        tasks = G.generate_multistep_tasks(2, seed=3, split="heldout", kinds=[kind])
        with ScriptedPolicy(tok, "oracle", template_kwargs=rcfg.chat_template_kwargs, tools=rcfg.tools) as o:
            played = [t for t in rollout.collect(tasks, o, docker_env, rcfg, group_size=1, progress=False)
                      if t.valid and t.reward > 0]
        got = decisions(kind, played, fmt)
        assert len(got) == len(played) == 2, (kind, [t.finish_reason for t in played])
        lp = learner.policy_logprobs(model, rollout.make_batch(played, tok.pad_token_id or 0), 1 << 16)
        for t, row, (prefix, cands, right, first) in zip(played, lp, got):
            own = t.token_ids[len(prefix):len(prefix) + len(cands[right])]
            assert cands[right] == own and first == 0 and len(cands) >= 3, kind
            texts = [fmt.decode(c) for c in cands]
            assert len(set(texts)) == len(texts) and all(
                len(set(x.split()) ^ set(texts[right].split())) in (0, 2) for x in texts), texts
            want = row[len(prefix):len(prefix) + len(own)].sum().item()
            assert abs(score(model, prefix, [cands[right]])[0] - want) < 1e-3, kind
    s = summarise([([0.0, -1.0, -2.0], 0, 0), ([-3.0, 0.0, -1.0], 2, 0), ([0.0, -5.0], 1, 0)])
    assert (s["n"], round(s["right"], 3), s["first"]) == (3, 0.333, 0.5) and 0 < s["p_right"] < 1
