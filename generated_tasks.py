"""generated_tasks.py — procedurally generated task families, and a run's train / eval task sets.

The family of very easy tasks the tiny CPU demo trains on (one command each, held-out split with
disjoint names and words), and `load_task_sets`, which turns a run config's `data:` section into
the train and eval tasks (generated, or loaded from folders by task_folders.py).
"""
from __future__ import annotations

import random

from task_folders import BASE_IMAGE, Task, load_tasks

# --- The generated family of very easy tasks (for the tiny CPU demo) -----------------------------

# The held-out split draws names and words from disjoint lists and uses other counts.
_EASY_WORDS = {
    "train": ["apple", "river", "stone", "cloud", "green", "tiger", "lemon", "piano", "sugar", "happy",
              "orange", "silver", "window", "garden", "rocket", "pencil", "yellow", "castle"],
    "heldout": ["mango", "ocean", "ember", "frost", "violet", "zebra", "cherry", "violin", "honey", "brave",
                "purple", "golden", "mirror", "forest", "planet", "marker", "indigo", "palace"],
}
_EASY_NAMES = {
    "train": ["notes", "data", "log", "items", "list", "report", "todo", "words", "draft", "info"],
    "heldout": ["memo", "record", "inventory", "summary", "journal", "ledger", "digest", "roster"],
}
_EASY_COUNTS = {"train": (2, 9), "heldout": (10, 16)}
EASY_KINDS = ["create", "count", "copy", "rename", "append", "mkdir", "delete"]


def _easy_one(kind: str, rng: random.Random, split: str) -> tuple[str, str, str, list[tuple[str, str]]]:
    """(instruction, setup, solution, [(check name, bash condition)]) for one easy task."""
    words, names = _EASY_WORDS[split], _EASY_NAMES[split]
    f, g = (f"/app/{n}.txt" for n in rng.sample(names, 2))
    w1, w2 = rng.sample(words, 2)
    lines = [rng.choice(words) for _ in range(rng.randint(*_EASY_COUNTS[split]))]
    body = "\n".join(lines)
    make_f = f"printf '%s\\n' {' '.join(lines)} > {f}"
    if kind == "create":
        return (f"Create the file {f} containing the line: {w1} {w2}", "", f"echo {w1} {w2} > {f}",
                [("content", f'[ "$(cat {f})" = "{w1} {w2}" ]')])
    if kind == "count":
        return (f"Count the lines in {f} and write the number to {g}", make_f, f"wc -l < {f} > {g}",
                [("number", f'[ "$(tr -d "[:space:]" < {g})" = "{len(lines)}" ]'),
                 ("source_kept", f"[ -f {f} ]")])
    if kind == "copy":
        return (f"Copy {f} to {g}", make_f, f"cp {f} {g}",
                [("copied", f"cmp -s {g} - <<'EOF'\n{body}\nEOF"), ("source_kept", f"[ -f {f} ]")])
    if kind == "rename":
        return (f"Rename {f} to {g}", make_f, f"mv {f} {g}",
                [("renamed", f"cmp -s {g} - <<'EOF'\n{body}\nEOF"), ("source_gone", f"[ ! -e {f} ]")])
    if kind == "append":
        return (f"Append the line {w1} to the end of {f}", make_f, f"echo {w1} >> {f}",
                [("appended", f"cmp -s {f} - <<'EOF'\n{body}\n{w1}\nEOF")])
    if kind == "mkdir":
        return (f"Create the directory /app/{w1}/{w2}", "", f"mkdir -p /app/{w1}/{w2}",
                [("directory", f"[ -d /app/{w1}/{w2} ]")])
    if kind == "delete":
        return (f"Delete the file {f}", f"{make_f}; echo {w1} > {g}", f"rm {f}",
                [("deleted", f"[ ! -e {f} ]"), ("other_kept", f"[ -f {g} ]")])
    raise ValueError(f"unknown easy task kind {kind!r}; choose from {EASY_KINDS}")


def generate_easy_tasks(n: int, seed: int = 0, split: str = "train", kinds=None) -> list[Task]:
    """n procedurally generated very easy tasks (kinds cycled, parameters drawn from seed)."""
    if split not in _EASY_WORDS:
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    kinds = list(kinds or EASY_KINDS)
    rng = random.Random(f"termrl-easy:{seed}:{split}")
    tasks = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        instruction, setup, solution, checks = _easy_one(kind, rng, split)
        test = "".join(f"if {cond}\nthen echo 'PASSED {name}'\nelse echo 'FAILED {name}'; fail=1\nfi\n"
                       for name, cond in checks)
        tests = {"test.sh": f"#!/bin/bash\nfail=0\n{test}exit $fail\n".encode()}
        tasks.append(Task(
            name=f"easy-{split}-{seed}-{i:04d}-{kind}", instruction=instruction, layout="generated",
            image=BASE_IMAGE, setup=f"mkdir -p /app\n{setup}".strip(), tests=tests,
            test_command="bash /tests/test.sh", solution=solution + "\n", workdir="/app",
            agent_timeout_s=120, test_timeout_s=30, memory_mb=256, cpus=1.0, pids=128,
            metadata={"kind": kind, "split": split, "seed": seed, "index": i}))
    return tasks


def load_task_sets(cfg) -> tuple[list[Task], list[Task]]:
    """(train tasks, eval tasks) of a run config's `data:` section (eval capped at eval.num_tasks)."""
    d = cfg.data
    kinds = d.generated_kinds or None
    if d.train_tasks == "generated":
        train = generate_easy_tasks(d.num_generated_train, seed=d.generated_seed, split="train", kinds=kinds)
    else:
        train = load_tasks(d.train_tasks, strict=d.strict_tasks)
    if d.eval_tasks == "generated":
        held = generate_easy_tasks(d.num_generated_eval, seed=d.eval_seed, split=d.eval_split, kinds=kinds)
        seen = {t.instruction for t in train}
        held = [t for t in held if t.instruction not in seen]  # never evaluate on a task trained on
    elif d.eval_tasks:
        held = load_tasks(d.eval_tasks, strict=d.strict_tasks)
    else:
        held = []
    if not train:
        raise SystemExit(f"data.train_tasks {d.train_tasks!r} gave no tasks")
    return train, held[: cfg.eval.num_tasks]


