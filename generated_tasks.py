"""generated_tasks.py — procedurally generated task families, and a run's train / eval task sets.

Two families: the very easy tasks the tiny CPU demo trains on (one command each), and the
multi-step tasks, where what the last command needs is seen only in an earlier command's output.
Each has three splits of disjoint names, words and numbers: train (the tasks SFT imitates and RL
draws by default), rl (tasks RL may train on with their verifier alone: SFT never sees them) and
heldout (the eval's). `load_task_sets` turns a run config's `data:` section into the train and eval
tasks (generated, or loaded from folders by task_folders.py); `split_tasks` gives SFT and RL theirs.
"""
from __future__ import annotations

import random
import shlex

from task_folders import BASE_IMAGE, Task, load_tasks

# --- The generated family of very easy tasks (for the tiny CPU demo) -----------------------------

# Each split draws names and words from its own list and uses other counts. rl's counts are past
# the held-out ones (two digits, like them), so RL can meet what the train split never shows
# (tests/test_multistep.py::test_splits_share_no_name_word_or_number_and_are_deterministic).
_EASY_WORDS = {
    "train": ["apple", "river", "stone", "cloud", "green", "tiger", "lemon", "piano", "sugar", "happy",
              "orange", "silver", "window", "garden", "rocket", "pencil", "yellow", "castle"],
    "rl": ["anchor", "breeze", "canyon", "dolphin", "falcon", "glacier", "harbor", "island", "jungle",
           "kettle", "lantern", "meadow", "nectar", "orchid", "pebble", "quartz", "saddle", "thistle"],
    "heldout": ["mango", "ocean", "ember", "frost", "violet", "zebra", "cherry", "violin", "honey", "brave",
                "purple", "golden", "mirror", "forest", "planet", "marker", "indigo", "palace"],
}
_EASY_NAMES = {
    "train": ["notes", "data", "log", "items", "list", "report", "todo", "words", "draft", "info"],
    "rl": ["agenda", "catalog", "manifest", "register", "timeline", "receipt", "schedule", "minutes"],
    "heldout": ["memo", "record", "inventory", "summary", "journal", "ledger", "digest", "roster"],
}
SPLITS = list(_EASY_WORDS)
_EASY_COUNTS = {"train": (2, 9), "rl": (17, 24), "heldout": (10, 16)}
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
    return _generate("easy", lambda kind, rng, split: (*_easy_one(kind, rng, split), {}), EASY_KINDS,
                     n, seed, split, kinds)


# The time every file a generated task's setup makes carries (2026-01-01 00:00 UTC), set once the
# setup ran: `ls -l` prints it, and a time of the episode's start would put the wall clock into the
# tokens SFT imitates and a policy reads
# (tests/test_multistep.py::test_a_tasks_files_carry_one_fixed_time_whenever_an_episode_starts).
SETUP_MTIME = 1767225600
_PIN = f"find /app -exec touch -h -d @{SETUP_MTIME} {{}} +"  # a setup's last command


def _generate(family: str, one, all_kinds: list, n: int, seed: int, split: str, kinds) -> list[Task]:
    """n tasks of a family whose `one(kind, rng, split)` gives (instruction, setup, solution,
    [(check name, bash condition)], metadata): kinds cycled, parameters drawn from seed."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}; got {split!r}")
    kinds = list(kinds or all_kinds)
    rng = random.Random(f"termrl-{family}:{seed}:{split}")
    tasks = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        instruction, setup, solution, checks, meta = one(kind, rng, split)
        test = "".join(f"if {cond}\nthen echo 'PASSED {name}'\nelse echo 'FAILED {name}'; fail=1\nfi\n"
                       for name, cond in checks)
        tests = {"test.sh": f"#!/bin/bash\nfail=0\n{test}exit $fail\n".encode()}
        tasks.append(Task(
            name=f"{family}-{split}-{seed}-{i:04d}-{kind}", instruction=instruction, layout="generated",
            image=BASE_IMAGE, setup="\n".join(c for c in ("mkdir -p /app", setup, _PIN) if c), tests=tests,
            test_command="bash /tests/test.sh", solution=solution + "\n", workdir="/app",
            agent_timeout_s=120, test_timeout_s=30, memory_mb=256, cpus=1.0, pids=128,
            metadata={"family": family, "kind": kind, "split": split, "seed": seed, "index": i, **meta}))
    return tasks


def task_kind(name: str) -> str:
    """The kind of a generated task from its name alone (the name's last part, as _generate writes
    it): what trajectories and evals carry of a task."""
    return name.rsplit("-", 1)[-1]


# --- The generated family of multi-step tasks ----------------------------------------------------
#
# Each task needs at least two dependent interactions: the value its final command needs (a file
# name, a number, a path, what an error says) is in no instruction, only in what an earlier command
# prints. The oracle is what an expert types: first the inspection, then the action with the
# literal value it observed (which the generator knows), one command a turn. Names, words and
# numbers come from the easy family's per-split lists and from per-split ranges, all disjoint.

_MS_NUMBERS = {"train": (10, 49), "rl": (100, 149), "heldout": (50, 99)}  # what the tools print
_MS_COUNTS = {"train": (3, 9), "rl": (17, 24), "heldout": (10, 16)}  # files in an archive: never 1 or 2
# (each split's numbers disjoint, archives of 3 files or more: the test named above)
# a script sums two; terms and sums: train 10-29, 20-58; held-out 60-79, 120-158; rl 80-99, 160-198
_MS_TERMS = {"train": (10, 29), "rl": (80, 99), "heldout": (60, 79)}
_MS_KEYS = ["workspace", "target", "output", "cache", "profile", "channel"]


def _put(path: str, text: str) -> str:
    """A setup command writing text and a final newline to path."""
    return f"printf '%s\\n' {shlex.quote(text)} > {path}"


def _same(path: str, text: str) -> str:
    """The bash condition: path holds exactly text and a final newline."""
    return f"cmp -s {path} - <<'EOF'\n{text}\nEOF"


def _is(path: str, *texts: str) -> str:
    """The bash condition: path holds one of texts, whitespace at either end ignored."""
    got = f'"$(sed -e \'s/^[[:space:]]*//\' -e \'s/[[:space:]]*$//\' {path} 2>/dev/null)"'
    return " || ".join(f'[ {got} = {shlex.quote(t)} ]' for t in texts)


def _apart(words: list, k: int, rng: random.Random) -> list:
    """k distinct words of which none is part of another (grep for one finds only it)."""
    while True:
        picked = rng.sample(words, k)
        if not any(a != b and a in b for a in picked for b in picked):
            return picked


def _draw(rng: random.Random, split: str) -> tuple:
    """(words, names, 3-5 file stems, the stem the task is about) of one multi-step task."""
    words, names = _EASY_WORDS[split], _EASY_NAMES[split]
    stems = rng.sample(names, rng.randint(3, 5))
    return words, names, stems, rng.choice(stems)


# Each kind: (rng, split) -> (instruction, setup, solution, [(check name, bash condition)], metadata).
# metadata["hidden"]: the values the oracle types that the instruction never says, the last one what
# its final command needs; metadata["numbers"]: the numbers drawn (a kind's train and held-out ranges
# are disjoint).

def _grep(rng, split):
    """Find, then act: which file holds a word is known once grep says."""
    words, _, stems, target = _draw(rng, split)
    w, *rest = _apart(words, 1 + 2 * len(stems), rng)
    body = {s: [rest[2 * j], rest[2 * j + 1]] for j, s in enumerate(stems)}
    body[target].insert(rng.randint(0, 2), w)
    setup = "mkdir -p /app/box\n" + "\n".join(
        _put(f"/app/box/{s}.txt", "\n".join(b)) for s, b in body.items())
    return (f"One of the files in /app/box contains the word {w}. Move that file to /app/found.txt.", setup,
            f"grep -l {w} /app/box/*\nmv /app/box/{target}.txt /app/found.txt",
            [("moved", _same("/app/found.txt", "\n".join(body[target]))),
             ("source_gone", f"[ ! -e /app/box/{target}.txt ]"),
             ("others_kept", f'[ "$(ls /app/box | wc -l)" = {len(stems) - 1} ]')],
            {"hidden": [target], "numbers": []})


def _longest(rng, split):
    """Inspect, then decide: which file has the most lines."""
    words, _, stems, _ = _draw(rng, split)
    lo, hi = _EASY_COUNTS[split]
    counts = dict(zip(stems, rng.sample(range(lo, hi + 1), len(stems))))
    target = max(counts, key=counts.get)
    setup = "mkdir -p /app/logs\n" + "\n".join(
        _put(f"/app/logs/{s}.txt", "\n".join(rng.choice(words) for _ in range(c))) for s, c in counts.items())
    return ("Of the files in /app/logs, which one has the most lines? Write its file name, without the "
            "directory, to /app/answer.txt.", setup,
            f"wc -l /app/logs/*\necho {target}.txt > /app/answer.txt",
            [("answer", _is("/app/answer.txt", f"{target}.txt", f"/app/logs/{target}.txt"))],
            {"hidden": [target], "numbers": list(counts.values())})


def _config(rng, split):
    """Read, then act: a key's value names the directory to create; the other values must not."""
    words, *_ = _draw(rng, split)
    keys, values = rng.sample(_MS_KEYS, 4), _apart(words, 4, rng)
    pairs = list(zip(keys, values))
    rng.shuffle(pairs)
    conf = "\n".join(["# settings"] + [f"{k} = {v}" for k, v in pairs])
    return (f"The file /app/settings.conf sets the key {keys[0]}. Create a directory in /app named after "
            "its value.", _put("/app/settings.conf", conf), f"cat /app/settings.conf\nmkdir /app/{values[0]}",
            [("created", f"[ -d /app/{values[0]} ]"),
             ("only_that", " && ".join(f"[ ! -e /app/{v} ]" for v in values[1:]))],
            {"hidden": [values[0]], "numbers": []})


def _pointer(rng, split):
    """Follow a pointer: one file names the file to copy."""
    words, _, stems, target = _draw(rng, split)
    content = _apart(words, 2 * len(stems), rng)
    body = {s: f"{content[2 * j]}\n{content[2 * j + 1]}" for j, s in enumerate(stems)}
    setup = "mkdir -p /app/docs\n" + "\n".join(_put(f"/app/docs/{s}.txt", b) for s, b in body.items())
    setup += "\n" + _put("/app/pointer.txt", f"current: {target}.txt")
    return ("/app/pointer.txt names one of the files in /app/docs. Copy that file to /app/current.txt.",
            setup, f"cat /app/pointer.txt\ncp /app/docs/{target}.txt /app/current.txt",
            [("copied", _same("/app/current.txt", body[target])),
             ("source_kept", _same(f"/app/docs/{target}.txt", body[target]))],
            {"hidden": [target], "numbers": []})


def _chain(rng, split):
    """Two pointers to follow, then the answer; every other clue file gives a decoy answer."""
    words, _, stems, _ = _draw(rng, split)
    first, second, *decoys = stems
    answer, *others = _apart(words, len(stems), rng)
    clue = {first: f"next: /app/clues/{second}.txt", second: f"answer: {answer}",
            **{d: f"answer: {o}" for d, o in zip(decoys, others)}}
    setup = "mkdir -p /app/clues\n" + "\n".join(_put(f"/app/clues/{s}.txt", c) for s, c in clue.items())
    setup += "\n" + _put("/app/start.txt", f"next: /app/clues/{first}.txt")
    return ("Start at /app/start.txt. Each clue file either names the next file to read or gives the "
            "answer. Follow the clues and write the answer word to /app/answer.txt.", setup,
            f"cat /app/start.txt\ncat /app/clues/{first}.txt\ncat /app/clues/{second}.txt\n"
            f"echo {answer} > /app/answer.txt",
            [("answer", _is("/app/answer.txt", answer))], {"hidden": [first, second, answer], "numbers": []})


def _missing(rng, split):
    """Diagnose, then fix: the script's error names the directory it lacks; the script stays as it is."""
    words, *_ = _draw(rng, split)
    leaf, word = _apart(words, 2, rng)
    where, n = (f"/app/{rng.choice(['cache', 'spool', 'state', 'work'])}/{leaf}",
                rng.randint(*_MS_NUMBERS[split]))
    script = (f"#!/bin/bash\ndir={where}\nif [ ! -d \"$dir\" ]; then\n"
              f"  echo \"run.sh: $dir: no such directory\" >&2\n  exit 1\nfi\n"
              f"echo '{word} {n}' > \"$dir/stamp\"\necho \"stamped $dir with {word} {n}\"")
    return ("/app/run.sh fails. Run it, fix what its error message says is missing, then run it again and "
            "save what it prints to /app/output.txt.", _put("/app/run.sh", script),
            f"bash /app/run.sh\nmkdir -p {where}\nbash /app/run.sh > /app/output.txt",
            [("output", _same("/app/output.txt", f"stamped {where} with {word} {n}")),
             ("stamp", _same(f"{where}/stamp", f"{word} {n}")),
             ("script_kept", _same("/app/run.sh", script))],
            {"hidden": [where], "numbers": [n]})


def _chmod(rng, split):
    """Permission repair: which program lacks the execute bit is seen in ls -l."""
    words, _, stems, target = _draw(rng, split)
    drawn = {s: rng.randint(*_MS_NUMBERS[split]) for s in stems}
    out = {s: f"{w} {drawn[s]}" for s, w in zip(stems, _apart(words, len(stems), rng))}
    setup = "mkdir -p /app/bin\n" + "\n".join(
        _put(f"/app/bin/{s}", f"#!/bin/bash\necho {o}")
        + f" && chmod {644 if s == target else 755} /app/bin/{s}" for s, o in out.items())
    return ("One program in /app/bin cannot be run because it lacks execute permission. Make it executable, "
            "run it, and save what it prints to /app/out.txt.", setup,
            f"ls -l /app/bin\nchmod +x /app/bin/{target}\n/app/bin/{target} > /app/out.txt",
            [("executable", f"[ -x /app/bin/{target} ]"), ("output", _same("/app/out.txt", out[target]))],
            {"hidden": [target], "numbers": list(drawn.values())})


def _crlf(rng, split):
    """Format repair: `file` tells which script has CRLF line endings (bash then fails on its '\\r')."""
    words, _, stems, target = _draw(rng, split)
    lo, hi = _MS_TERMS[split]
    parts = {s: (w, rng.randint(lo, hi), rng.randint(lo, hi))
             for s, w in zip(stems, _apart(words, len(stems), rng))}
    setup = "mkdir -p /app/scripts\n" + "\n".join(
        _put(f"/app/scripts/{s}.sh", f"#!/bin/bash\na={a}\nb={b}\necho \"{w} $((a + b))\"")
        for s, (w, a, b) in parts.items())
    setup += f"\nsed -i 's/$/\\r/' /app/scripts/{target}.sh"
    w, a, b = parts[target]
    return ("One of the scripts in /app/scripts was saved with Windows (CRLF) line endings and fails "
            "when run with bash. Repair that script, run it with bash, and save what it prints to "
            "/app/result.txt.", setup,
            f"file /app/scripts/*\nsed -i 's/\\r$//' /app/scripts/{target}.sh\n"
            f"bash /app/scripts/{target}.sh > /app/result.txt",
            [("repaired", f"! grep -q $'\\r' /app/scripts/{target}.sh"),
             ("computes", f"grep -q 'a + b' /app/scripts/{target}.sh"),
             ("output", _same("/app/result.txt", f"{w} {a + b}"))],
            {"hidden": [target], "numbers": [x for _, a, b in parts.values() for x in (a, b, a + b)]})


def _archive(rng, split):
    """Chained: extract, count the regular files that came out (subfolders are no files), report it."""
    words, _, stems, _ = _draw(rng, split)
    n = rng.randint(*_MS_COUNTS[split])
    top, *subs = stems[:3]
    files = [f"/tmp/pack/{top}/{rng.choice([''] + [s + '/' for s in subs])}{rng.choice(words)}{j}.txt"
             for j in range(n)]
    setup = (f"mkdir -p {' '.join(f'/tmp/pack/{top}/{s}' for s in subs)}\n"
             + "\n".join(f"echo {rng.choice(words)} > {f}" for f in files)
             + f"\ntar -czf /app/bundle.tar.gz --mtime=@{SETUP_MTIME} -C /tmp/pack {top}\nrm -rf /tmp/pack")
    return ("Extract /app/bundle.tar.gz into /app/unpacked, then write one line to /app/tally.txt of the "
            "form `files: N`, N being the number of regular files the archive holds.", setup,
            "mkdir -p /app/unpacked && tar -xzf /app/bundle.tar.gz -C /app/unpacked\n"
            f"find /app/unpacked -type f | wc -l\necho 'files: {n}' > /app/tally.txt",
            [("report", _is("/app/tally.txt", f"files: {n}")),
             ("extracted", f'[ "$(find /app/unpacked -type f | wc -l)" = {n} ]')],
            {"hidden": [str(n)], "numbers": [n]})


def _locate(rng, split):
    """Find where a named file lies in a tree, then move it; the other files stay."""
    words, names, stems, _ = _draw(rng, split)
    w, *others = _apart(words, len(stems) + 1, rng)
    dirs = [f"/app/tree/{'/'.join(rng.sample(names, rng.randint(1, 3)))}" for _ in range(len(stems) + 1)]
    body = {f"{d}/{x}.bak": rng.choice(words) for d, x in zip(dirs, [w] + others)}
    where = next(iter(body))
    setup = "\n".join(f"mkdir -p {p.rsplit('/', 1)[0]} && echo {b} > {p}" for p, b in body.items())
    return (f"A file named {w}.bak is somewhere under /app/tree. Move it into the directory /app/found "
            "(create that directory).", setup,
            f"find /app/tree -name {w}.bak\nmkdir -p /app/found && mv {where} /app/found/",
            [("moved", _same(f"/app/found/{w}.bak", body[where])), ("source_gone", f"[ ! -e {where} ]"),
             ("others_kept", f'[ "$(find /app/tree -name "*.bak" | wc -l)" = {len(stems)} ]')],
            {"hidden": [where.rsplit("/", 1)[0]], "numbers": []})


_MULTISTEP = {"grep": _grep, "longest": _longest, "config": _config, "pointer": _pointer, "chain": _chain,
              "missing": _missing, "chmod": _chmod, "crlf": _crlf, "archive": _archive, "locate": _locate}
MULTISTEP_KINDS = list(_MULTISTEP)


def _multistep_one(kind: str, rng: random.Random, split: str) -> tuple:
    if kind not in _MULTISTEP:
        raise ValueError(f"unknown multi-step task kind {kind!r}; choose from {MULTISTEP_KINDS}")
    return _MULTISTEP[kind](rng, split)


def generate_multistep_tasks(n: int, seed: int = 0, split: str = "train", kinds=None) -> list[Task]:
    """n procedurally generated multi-step tasks (kinds cycled, parameters drawn from seed)."""
    return _generate("multistep", _multistep_one, MULTISTEP_KINDS, n, seed, split, kinds)


# The generated families a run config's data.generated_family names.
FAMILIES = {"easy": (generate_easy_tasks, EASY_KINDS),
            "multistep": (generate_multistep_tasks, MULTISTEP_KINDS)}


def generate_tasks(family: str, n: int, seed: int = 0, split: str = "train", kinds=None) -> list[Task]:
    """n tasks of the generated family named `family` (a key of FAMILIES)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown generated family {family!r}; choose from {', '.join(FAMILIES)}")
    return FAMILIES[family][0](n, seed, split, kinds)


def split_tasks(cfg, split: str, train: list[Task]) -> list[Task]:
    """The tasks SFT imitates or RL draws (sft.generated_split, train.generated_split): the run's
    train tasks for "train"; for "rl" as many of the rl split, drawn with the same seed and kinds."""
    if split == "train":
        return train
    d = cfg.data
    return generate_tasks(d.generated_family, d.num_generated_train, d.generated_seed, split,
                          d.generated_kinds or None)


def load_task_sets(cfg) -> tuple[list[Task], list[Task]]:
    """(train tasks, eval tasks) of a run config's `data:` section (eval capped at eval.num_tasks)."""
    d = cfg.data
    kinds = d.generated_kinds or None
    if d.train_tasks == "generated":
        train = generate_tasks(d.generated_family, d.num_generated_train, d.generated_seed, "train", kinds)
    else:
        train = load_tasks(d.train_tasks, strict=d.strict_tasks)
    if d.eval_tasks == "generated":
        held = generate_tasks(d.generated_family, d.num_generated_eval, d.eval_seed, d.eval_split, kinds)
        # never evaluate on a task trained on: a multi-step instruction repeats, its oracle's values do not
        seen = {(t.instruction, t.solution) for t in train}
        held = [t for t in held if (t.instruction, t.solution) not in seen]
    elif d.eval_tasks:
        held = load_tasks(d.eval_tasks, strict=d.strict_tasks)
    else:
        held = []
    if not train:
        raise SystemExit(f"data.train_tasks {d.train_tasks!r} gave no tasks")
    return train, held[: cfg.eval.num_tasks]


