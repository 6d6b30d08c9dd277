"""What the policy picks on the multi-step kinds where the answer is a choice among what an earlier
command printed: `longest` (`wc -l /app/logs/*`, then the file with the most lines), `crlf`
(`file /app/scripts/*`, then the script it marks "with CRLF line terminators") and `chmod` (`ls -l
/app/bin`, then the program without the execute bit). For each run, its
last held-out eval's episodes of those kinds, by what the policy wrote or repaired:

    right         the file the listing singles out
    first listed  the first file of the listing, when that is not the right one
    other listed  another file of the listing
    not listed    a name the listing does not have
    no pick       no inspection listing, or no command that names a file

    python bench/multistep_choices.py runs/smollm2-multistep-sft150-seed0 runs/smollm2-multistep-ipa-seed0

It tells a policy that compares (right) from one that copies a name at chance (spread over the
listed ones) or makes one up, which held-out success alone does not.
"""
import argparse
import collections
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from compare_algos import final_eval  # noqa: E402
from generated_tasks import task_kind  # noqa: E402

CLASSES = ["right", "first listed", "other listed", "not listed", "no pick"]
# per kind: the listing's (name, line) pairs, the right name among them, the name a command picks
LISTED = {"longest": re.compile(r"^\s*(\d+) /app/logs/(\S+)$", re.M),
          "crlf": re.compile(r"^/app/scripts/(\S+):(.*)$", re.M),
          "chmod": re.compile(r"^-([rwx-]{9})\S*\s.*\s(\S+)$", re.M)}
# chmod's operand whole: a name miscopied with a space (`/app/bin/ digest`) picks "bin", not listed
PICKED = {"longest": re.compile(r"echo\s+['\"]?([\w./-]+?)['\"]?\s*>"),
          "crlf": re.compile(r"sed\b.*?/app/scripts/([\w.-]+)"),
          "chmod": re.compile(r"chmod\s+\S+\s+['\"]?([^\s'\"]+)")}


def listing(kind: str, text: str) -> tuple[list, str | None]:
    """(the names a tool output lists in order, the right one) for the kind's inspection command."""
    rows = LISTED[kind].findall(text)
    if kind == "longest":
        rows = [(name, int(n)) for n, name in rows]
        return [n for n, _ in rows], max(rows, key=lambda r: r[1])[0] if rows else None
    if kind == "chmod":
        return [n for _, n in rows], next((n for mode, n in rows if "x" not in mode), None)
    return [n for n, _ in rows], next((n for n, rest in rows if "CRLF" in rest), None)


def choice(kind: str, messages: list) -> str:
    """The class (CLASSES) of an episode's pick: the first tool output that lists files, then the
    first later command that names a file."""
    names, right, seen = [], None, False
    for m in messages:
        if m["role"] == "tool" and not seen:
            names, right = listing(kind, m["content"])
            seen = bool(names)
        elif m["role"] == "assistant" and seen and m.get("tool_call"):
            got = PICKED[kind].search(m["tool_call"]["arguments"].get("command", ""))
            if got:
                pick = Path(got.group(1)).name
                return ("right" if pick == right else "first listed" if pick == names[0] else
                        "other listed" if pick in names else "not listed")
    return "no pick"


def choices(run_dir: Path) -> dict:
    """{kind: Counter of classes} over the run's last held-out eval (final_eval's episodes)."""
    out = {k: collections.Counter() for k in LISTED}
    for e in final_eval(run_dir)["episodes"]:
        if (kind := task_kind(e["task_name"])) in LISTED:
            out[kind][choice(kind, e["messages"])] += 1
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="run directories with an eval_trajectories.jsonl")
    args = ap.parse_args(argv)
    print("| run | kind | " + " | ".join(CLASSES) + " |\n|---|---|" + "---:|" * len(CLASSES))
    for run in args.runs:
        for kind, got in choices(run).items():
            print(f"| {run.name} | {kind} | " + " | ".join(str(got[c]) for c in CLASSES) + " |")


if __name__ == "__main__":
    main()
