"""How an RL run's own episodes fared over its steps: for each kind of task it drew, the episodes
that passed of those it sampled, in windows of --window RL steps; and on the kinds where the answer
is a file picked out of a listing (bench/multistep_choices.py), what the policy picked.

    python bench/own_episodes.py runs/gemma3-multistep-ipa-rl-split-seed0 --window 10
    python bench/own_episodes.py runs/gemma3-multistep-ipa-rl-split-seed0 --groups archive

Held-out success says where a policy ended; this says what RL's reward saw on the way there: a
kind learnt, left alone or lost, and picks that drift to a shortcut (the listing's first file) or
to names the listing does not have. A second table counts each kind's groups (one task's episodes
of one step) that passed whole, mixed, or failed whole: only a mixed group sets a success beside a
failure of the same task, and a near-deterministic policy makes few of them. An episode belongs to
RL step policy_version + 1, the weights that sampled its first turn (train.mode sync: every turn
of step s is sampled by version s - 1). An episode that started from an expert prefix
(rollout.prefill_prob) counts under "KIND, prefilled": the expert's turns, not the policy's, may have
passed it. --groups KIND lists that kind's groups one by one instead: when each came, from which
expert prefix, how many passed, and the last command its episodes ran (what a kind's failures do).
"""
import argparse
import collections
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from generated_tasks import task_kind  # noqa: E402
from multistep_choices import CLASSES, LISTED, choice  # noqa: E402


def row_kind(row: dict) -> tuple[str, bool]:
    """The table row of a trajectories.jsonl row: (its task's kind, whether an expert prefix
    started it)."""
    return task_kind(row["task_name"]), bool(row.get("prefill_k"))


def label(key: tuple[str, bool]) -> str:
    return key[0] + (", prefilled" if key[1] else "")


def windows(rows: list, width: int) -> dict:
    """{(first step, last step): {row_kind: {"passed", "episodes", and per pick class a count}}}, in step
    order, from trajectories.jsonl rows; an episode that did not run (valid false) is left out."""
    out = collections.defaultdict(lambda: collections.defaultdict(collections.Counter))
    last = max((r["policy_version"] + 1 for r in rows), default=0)
    for r in rows:
        if not r["valid"]:
            continue
        step = r["policy_version"] + 1
        lo = (step - 1) // width * width + 1
        got = out[(lo, min(lo + width - 1, last))][key := row_kind(r)]
        got["episodes"] += 1
        got["passed"] += (r["reward"] or 0.0) > 0
        if (kind := key[0]) in LISTED:
            got[choice(kind, r["messages"])] += 1
    return {w: dict(out[w]) for w in sorted(out)}


def groups_of(rows: list) -> dict:
    """{(policy_version, group_id, row_kind): its rows} over trajectories.jsonl rows: a group is one
    task's episodes sampled at one RL step; an episode that did not run is left out."""
    groups = collections.defaultdict(list)
    for r in rows:
        if r["valid"]:
            groups[(r["policy_version"], r["group_id"], row_kind(r))].append(r)
    return groups


def group_outcomes(rows: list) -> dict:
    """{row_kind: Counter of "all passed", "mixed", "all failed"} over the groups (groups_of)."""
    out = collections.defaultdict(collections.Counter)
    for (_, _, kind), group in groups_of(rows).items():
        passed = [(r["reward"] or 0.0) > 0 for r in group]
        out[kind]["all passed" if all(passed) else "all failed" if not any(passed) else "mixed"] += 1
    return dict(out)


def last_command(messages: list) -> str | None:
    """The last bash command an episode ran, the expert prefix's included; None if it ran none."""
    calls = [m["tool_call"] for m in messages if m["role"] == "assistant" and m.get("tool_call")]
    cmds = [c["arguments"].get("command", "") for c in calls if c["name"] == "bash"]
    return cmds[-1] if cmds else None


def kind_groups(rows: list, kind: str) -> list[dict]:
    """The groups (groups_of) of one kind in step order: {"step", "task", "k" (the expert prefix's
    commands, 0 for none), "passed", "episodes", "last" (a Counter of the episodes' last_command)}."""
    return [{"step": version + 1, "task": group[0]["task_name"], "k": group[0].get("prefill_k") or 0,
             "passed": sum((r["reward"] or 0.0) > 0 for r in group), "episodes": len(group),
             "last": collections.Counter(last_command(r["messages"]) for r in group)}
            for (version, _, (of, _)), group in sorted(groups_of(rows).items()) if of == kind]


def groups_table(rows: list, kind: str, where: Path) -> str:
    """Markdown: a row per group of `kind` (kind_groups), its two commonest last commands."""
    got = kind_groups(rows, kind)
    if not got:
        drawn = sorted({task_kind(r["task_name"]) for r in rows})
        raise SystemExit(f"--groups {kind}: {where} has no group of that kind; its kinds: {', '.join(drawn)}")
    lines = ["| step | task | prefix k | passed | last command (episodes) |", "|---:|---|---:|---|---|"]
    for g in got:
        common = g["last"].most_common()
        cells = [("no command" if cmd is None else f"`{cmd}`".replace("|", "\\|")) + f" ({n})"
                 for cmd, n in common[:2]]
        rest = sum(n for _, n in common[2:])
        lines.append(f"| {g['step']} | {g['task']} | {g['k']} | {g['passed']} of {g['episodes']} | "
                     + "; ".join(cells) + (f"; {rest} other" if rest else "") + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="RL run directories with a trajectories.jsonl")
    ap.add_argument("--window", type=int, default=10, help="RL steps a column sums over")
    ap.add_argument("--log", default="trajectories.jsonl",
                    help="the run's episodes to read: curate_trajectories.jsonl for its start policy's "
                         "curation (train.curate_k), one group a task")
    ap.add_argument("--groups", metavar="KIND", default=None,
                    help="instead of the tables: each group of this kind in step order, with its expert "
                         "prefix, episodes passed and the last commands its episodes ran")
    args = ap.parse_args(argv)
    if args.window < 1:
        raise SystemExit(f"--window {args.window}: it must be 1 or more RL steps")
    for run in args.runs:
        path = run / args.log
        if not path.exists():
            raise SystemExit(f"{path}: not there; an RL run writes trajectories.jsonl (train.steps > 0) "
                             f"and, with train.curate_k, curate_trajectories.jsonl; an SFT-only run neither")
        rows = [json.loads(line) for line in path.open()]
        if args.groups:
            print(f"\n{run.name}: the {args.groups} groups\n\n" + groups_table(rows, args.groups, path))
            continue
        got = windows(rows, args.window)
        cols = [f"step {a}" if a == b else f"steps {a}-{b}" for a, b in got]
        print(f"\n{run.name}: episodes passed of those sampled, by kind (-: none drawn); picks as "
              f"right / first listed / other listed / not listed / no pick\n\n| kind | " + " | ".join(cols)
              + " |\n|---|" + "---|" * len(cols))
        for kind in sorted({k for w in got.values() for k in w}):
            cells = []
            for w in got.values():
                c = w.get(kind)
                cells.append("-" if c is None else f"{c['passed']} of {c['episodes']}" + (
                    " (" + " / ".join(str(c[k]) for k in CLASSES) + ")" if kind[0] in LISTED else ""))
            print(f"| {label(kind)} | " + " | ".join(cells) + " |")
        print("\n| kind | groups passed whole | mixed | failed whole |\n|---|---:|---:|---:|")
        for kind, c in sorted(group_outcomes(rows).items()):
            print(f"| {label(kind)} | {c['all passed']} | {c['mixed']} | {c['all failed']} |")


if __name__ == "__main__":
    main()
