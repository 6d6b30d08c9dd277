"""The README is a contract: every command in its ```bash blocks runs as written.

The commands are parsed from README.md itself and run in README order, in a copy of the repository
(a git repo of the working tree's files), after the README's own demo command. Each is shortened
only by flags or `--set` keys that make it small (fewer steps, tasks, samples), never by another
entry point, so it takes the same code path. After each command, `git status` of the copy must be
clean: whatever a README command writes is in .gitignore.

A README command without an entry in RULES fails `test_every_readme_command_has_a_rule`: add one
(how to shorten it, what its output must show). Commands not run, and why:
- `make test`: it is this suite. (`make demo` is checked by its recipe: a README command run here.)
- the GPU commands (configs/qwen3-*.yaml, torchrun of 8 ranks): they need GPUs and an 8B model.
  On a machine without a GPU they are run anyway (torchrun with 2 ranks instead of 8): each must stop
  at once and say "torch sees no GPU" exactly once. The two nodes' lines run together, as two
  "nodes" on this machine meeting at a free localhost port: once per node.
"""
import functools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RESULTS = ROOT / "docs" / "results.md"
NO_GPU = "torch sees no GPU"


def readme_commands(text: str | None = None) -> list[str]:
    """Each line of each ```bash block, its trailing comment removed, in README order."""
    text = README.read_text() if text is None else text
    cmds = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M):
        for line in block.splitlines():
            line = re.sub(r"\s+#\s.*$", "", line).strip()
            if line and not line.startswith("#"):
                cmds.append(line)
    return cmds


# the demo run, shortened: 2 SFT steps, 2 RL steps of 2 tasks x 2, a checkpoint every step (so
# keep_last: 2 prunes: step_000000 must survive it), an eval at each step
SHORT = ("--set sft.steps=2 --set sft.num_tasks=8 --set sft.batch_size=4 --set sft.val_tasks=2 "
         "--set train.steps=2 --set train.tasks_per_step=2 --set train.group_size=2 "
         "--set train.updates_per_step=1 --set rollout.num_workers=4 "
         "--set eval.num_tasks=2 --set eval.samples=1 --set eval.every=1 --set checkpoint.every=1")
DEMO = "python train.py --config configs/tiny.yaml"
TB = "~/tb/tasks"  # the README's stand-in for a Terminal-Bench checkout
EVAL = "python evaluate.py run --config configs/tiny.yaml --tasks tasks/ --k 8 --model runs/tiny --out eval/"


def _has_gpu() -> bool:
    import torch
    return torch.cuda.is_available()


@dataclass
class Rule:
    append: str = ""                                   # flags that shorten the command
    replace: list = field(default_factory=list)        # (old, new) text substitutions, same purpose
    needs: list = field(default_factory=list)          # README commands whose output it reads
    stdin: str | None = None
    check: object = None                               # check(result, clone): asserts on its output
    skip: str = ""                                     # why it is not run (never silently)
    gpu: bool = False                                  # needs a GPU: without one, must say so once


def _check_demo(r, clone):
    ckpts = clone / "runs" / "tiny" / "checkpoints"
    assert (ckpts / "step_000000" / "model" / "config.json").exists(), "the SFT-only start the README loads"
    assert (clone / "runs" / "tiny" / "summary.txt").exists() and "held-out success" in r.stdout


def _check_resume(r, clone):
    recs = [json.loads(line) for line in (clone / "runs" / "tiny" / "metrics.jsonl").read_text().splitlines()]
    assert sorted(x["step"] for x in recs if x.get("phase") == "rl") == [1, 2, 3]
    assert (clone / "runs" / "tiny" / "checkpoints" / "latest").read_text().strip() == "step_000003"


def _check_shell(r, clone):
    """Bug: the shell cut the task instruction at 200 characters, mid-word."""
    from task_folders import load_task
    instruction = load_task(clone / "tasks" / "git-merge-conflict").instruction
    assert len(instruction) > 200
    for line in instruction.strip().splitlines():
        assert line.strip() in r.stderr
    assert "/app" in r.stdout  # the commands on stdin ran in the task's container, in its workdir


def _check_no_gpu_once(r, clone, nodes: int = 1):
    """Bug: a torchrun launch without GPUs printed the same one-line error once per rank (and, on a
    second node, once per rank after a 30 s wait: only RANK 0 spoke at once)."""
    out = r.stdout + r.stderr
    assert r.returncode != 0 and out.count(NO_GPU) == nodes, out[-3000:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# the README's two-node launch; here both "nodes" are this machine, 2 ranks each, run together
NODE = ("torchrun --nnodes 2 --node-rank {} --nproc-per-node 8 --master-addr node0 --master-port 29500 "
        "train.py --config configs/qwen3-full-8gpu.yaml")
ON_THIS_MACHINE = [("--nproc-per-node 8", "--nproc-per-node 2"),
                   ("--master-addr node0 --master-port 29500",
                    f"--master-addr 127.0.0.1 --master-port {_free_port()}")]


RULES = {
    "make demo": Rule(),  # its recipe's last line must be a README command run here (test_readme_command)
    "make test": Rule(skip="runs the whole suite, of which this test is part"),
    DEMO: Rule(append=SHORT, check=_check_demo),
    "python train.py --config configs/tiny.yaml --set train.steps=4 --set run_name=tiny-4steps":
        Rule(append=SHORT + " --set train.steps=1 --set eval.every=0",
             check=lambda r, clone: (clone / "runs" / "tiny-4steps" / "summary.txt").exists()),
    "python train.py --config configs/tiny.yaml --dry-run":
        Rule(check=lambda r, clone: "dry run: OK" in r.stdout),
    "python train.py --config configs/tiny.yaml --resume":
        Rule(append=SHORT + " --set train.steps=3", needs=[DEMO], check=_check_resume),
    "python train.py --config configs/tiny.yaml --restart":
        Rule(append=SHORT, needs=[DEMO], check=lambda r, clone: list((clone / "runs").glob("tiny.*"))
             and (clone / "runs" / "tiny" / "checkpoints" / "step_000000").exists()),
    "python train.py --config configs/qwen3-lora-1gpu.yaml --set model.path=/models/Qwen3-8B":
        Rule(gpu=True, check=_check_no_gpu_once),
    "torchrun --nproc-per-node 8 train.py --config configs/qwen3-full-8gpu.yaml":
        Rule(gpu=True, replace=[("--nproc-per-node 8", "--nproc-per-node 2")], check=_check_no_gpu_once),
    NODE.format(0): Rule(gpu=True, replace=ON_THIS_MACHINE,  # node 1 beside it; the exit status is node 0's
                         append="& " + functools.reduce(lambda line, r: line.replace(*r), ON_THIS_MACHINE,
                                                        NODE.format(1)) + "; wait $!",
                         check=lambda r, clone: _check_no_gpu_once(r, clone, nodes=2)),
    NODE.format(1):
        Rule(skip="runs beside node 0's line, in that line's rule: one node alone waits for the other"),
    "python bench/compare_algos.py":
        Rule(append="--seeds 0 --variants grpo " + SHORT + " --set train.steps=1 --set eval.every=0",
             check=lambda r, clone: (clone / "runs" / "compare-tiny" / "compare.md").exists()),
    "python scripts/get_smollm2.py":
        Rule(check=lambda r, clone: Path(r.stdout.split()[-1], "config.json").exists()),
    "python train.py --config configs/smollm2-cpu.yaml": Rule(
        append=SHORT + " --set train.steps=1 --set eval.every=0",
        needs=["python scripts/get_smollm2.py"],
        check=lambda r, clone: (clone / "runs" / "smollm2-cpu" / "summary.txt").exists()),
    "python bench/bench_smollm2.py --no-warmup": Rule(
        append="--only generation --concurrency 1 --engines full --max-tokens 2",
        needs=["python scripts/get_smollm2.py"], check=lambda r, clone: "tokens/s" in r.stdout),
    "python bench/bench_smollm2.py --metrics runs/smollm2-cpu/metrics.jsonl": Rule(
        needs=["python train.py --config configs/smollm2-cpu.yaml"],
        check=lambda r, clone: "generation" in r.stdout and "trainer" not in r.stdout),
    "python tasktool.py validate tasks/ --k 3 --json validate.json":
        Rule(replace=[("tasks/ ", "tasks/fix-json-config ")], append="--k 1",
             check=lambda r, clone: json.loads((clone / "validate.json").read_text())["tasks"][0]["status"]
             == "ok"),
    "python tasktool.py shell tasks/git-merge-conflict": Rule(stdin="pwd\nexit\n", check=_check_shell),
    # "Running official Terminal-Bench tasks": tests/fixtures (one TB1, one Harbor task) as the checkout
    f"python tasktool.py validate {TB} --k 3 --flake-runs 30 --load 4 --json validate.json":
        Rule(replace=[(TB, "tests/fixtures")], append="--k 1 --flake-runs 2 --load 2",
             check=lambda r, clone: [t["status"]
                                     for t in json.loads((clone / "validate.json").read_text())["tasks"]]
             == ["ok", "ok"]),
    f"python tasktool.py validate {TB} --build-network default --agent-network none "
    "--grading-network default":
        Rule(replace=[(TB, "tests/fixtures")], append="--k 1",
             check=lambda r, clone: "2/2 tasks ok" in r.stdout),
    f"python evaluate.py run --config configs/tiny.yaml --tasks {TB} --k 8 --model runs/tiny --out eval/tb/":
        Rule(replace=[(TB, "tests/fixtures")], append="--k 1", needs=[DEMO],
             check=lambda r, clone: len(json.loads(
                 (clone / "eval" / "tb" / "eval.json").read_text())["tasks"]) == 2),
    EVAL: Rule(replace=[("--tasks tasks/ ", "--tasks tasks/fix-json-config ")], append="--k 2", needs=[DEMO],
               check=lambda r, clone: json.loads((clone / "eval" / "eval.json").read_text())),
    "python evaluate.py curate eval/eval.json --min-pass 0.1 --max-pass 0.9 --out train-tasks.json":
        Rule(needs=[EVAL],
             check=lambda r, clone: "tasks" in json.loads((clone / "train-tasks.json").read_text())),
    "python evaluate.py behaviour runs/tiny/trajectories.jsonl":
        Rule(needs=[DEMO], check=lambda r, clone: "episodes" in r.stdout),
    "python bench/bench_env.py": Rule(append="--commands 20 --resets 2"),
    "python bench/bench_rollout.py": Rule(append="--threads 1 2 --episodes-per-thread 1 --latency 0.05"),
    "python bench/bench_train.py --steps 0 --repeats 2": Rule(append="--repeats 1",
                                                              check=lambda r, clone: "overhead" in r.stdout),
    "python bench/bench_train.py --metrics runs/tiny/metrics.jsonl":
        Rule(needs=[DEMO], check=lambda r, clone: "generation" in r.stdout and "overhead" not in r.stdout),
    "python bench/bench_learning.py --model runs/tiny/checkpoints/step_000000/model":
        Rule(append="--iters 1 --tasks 2 --group 2", needs=[DEMO],
             check=lambda r, clone: "after 1 updates" in r.stdout and "nan" not in r.stdout),
}


def test_every_readme_command_has_a_rule():
    missing = [c for c in readme_commands() if c not in RULES]
    assert not missing, (f"README commands with no entry in tests/test_readme.py RULES "
                         f"(say how to run them shortened, or why not): {missing}")


def test_readme_commands_parse_from_the_fenced_blocks():
    text = ("x\n```bash\npython a.py --k 3   # note\n\n# a comment line\nmake b\n```\n"
            "```python\nnot_me()\n```\n")
    assert readme_commands(text) == ["python a.py --k 3", "make b"]


def _anchor(heading: str) -> str:
    """A markdown heading's link anchor, as GitHub makes it."""
    return "#" + re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _headings(doc) -> set:
    """The link anchors of a markdown file's headings."""
    return {_anchor(h) for h in re.findall(r"^#+ (.*)$", doc.read_text(), re.M)}


def test_readme_is_a_guide_whose_figures_point_to_the_results():
    """The README stays a guide of at most 300 lines; every figure in its "What it achieves" table is
    the text of a link into docs/results.md, and every link into docs/ names a file (and heading)
    that exists."""
    text = README.read_text()
    assert len(text.splitlines()) <= 300, \
        f"README.md is {len(text.splitlines())} lines: move detail to docs/"
    section = text.split("## What it achieves", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|") and not line.startswith("|---")][1:]
    assert rows, "no rows in the README's What it achieves table"
    for row in rows:
        figure = row.strip("|").split("|", 1)[1]
        assert "](docs/results.md#" in figure, row
        assert not re.search(r"\d", re.sub(r"\[[^\]]*\]\([^)]*\)", "", figure)), \
            f"a figure outside a link: {row}"
    for target, anchor in re.findall(r"\]\((docs/[^)#]+)(#[^)]*)?\)", text):
        doc = ROOT / target
        assert doc.exists(), f"README links to {target}, which does not exist"
        if anchor:
            assert anchor in _headings(doc), \
                f"README links to {target}{anchor}: no such heading ({sorted(_headings(doc))})"


def test_links_within_the_docs_name_headings_that_exist():
    """A link from one of docs/*.md to a heading (its own, `#...`, or another doc's, `x.md#...`)
    names a file and heading that exist: a heading renamed as a section's figures land breaks none."""
    for doc in sorted((ROOT / "docs").glob("*.md")):
        for target, anchor in re.findall(r"\]\(([^)#\s:]*)(#[^)\s]*)\)", doc.read_text()):
            linked = doc.parent / target if target else doc
            assert linked.exists(), f"{doc.name} links to {target}, which does not exist"
            assert anchor in _headings(linked), f"{doc.name} links to {target}{anchor}: no such heading"


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """A copy of the working tree as a fresh git repo, plus `python`/`torchrun` on PATH as this
    interpreter (CI machines may have only python3)."""
    d = tmp_path_factory.mktemp("clone")
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for f in filter(None, files):
        if (ROOT / f).is_file():
            (d / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, d / f)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q"], cwd=d, check=True)
    subprocess.run(git + ["add", "-A"], cwd=d, check=True)
    subprocess.run(git + ["commit", "-qm", "clone"], cwd=d, check=True)
    bin_dir = tmp_path_factory.mktemp("bin")
    (bin_dir / "python").symlink_to(sys.executable)
    (bin_dir / "torchrun").write_text(f'#!/bin/sh\nexec {sys.executable} -m torch.distributed.run "$@"\n')
    (bin_dir / "torchrun").chmod(0o755)
    return d, {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1",
               "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


_done: dict[str, subprocess.CompletedProcess] = {}


def _run(cmd: str, clone) -> subprocess.CompletedProcess:
    """The README command, shortened by its rule, in the copy; once per module."""
    if cmd in _done:
        return _done[cmd]
    d, env = clone
    rule = RULES[cmd]
    for dep in rule.needs:
        _run(dep, clone)
    line = cmd
    for old, new in rule.replace:
        assert old in line, f"rule for {cmd!r}: {old!r} not in it"
        line = line.replace(old, new)
    line = f"{line} {rule.append}".strip()
    r = subprocess.run(line, shell=True, cwd=d, env=env, input=rule.stdin or "", capture_output=True,
                       text=True, timeout=900)
    _done[cmd] = r
    if not rule.gpu:
        assert r.returncode == 0, f"$ {line}\n--- exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    written = subprocess.run(["git", "status", "--porcelain"], cwd=d, capture_output=True, text=True).stdout
    assert not written, f"$ {line}\nwrote files that .gitignore does not cover:\n{written}"
    return r


@pytest.mark.slow
@pytest.mark.parametrize("cmd", readme_commands())
def test_readme_command(cmd, clone):
    rule = RULES.get(cmd)
    if rule is None:
        pytest.fail(f"no rule for README command {cmd!r} (see test_every_readme_command_has_a_rule)")
    if rule.skip:
        pytest.skip(rule.skip)
    if rule.gpu and _has_gpu():
        pytest.skip("needs the GPUs and the 8B model it names; the no-GPU check runs on machines without one")
    if cmd.startswith("make "):  # make only adds scripts/setup.sh: the recipe must be a README command
        d, env = clone
        # under `make test` (CI) the parent make's MAKELEVEL would add "Entering directory" lines
        env = {k: v for k, v in env.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
        recipe = subprocess.run(["make", "--no-print-directory", "-n", cmd.split()[1], "PYTHON=python"],
                                cwd=d, env=env, capture_output=True, text=True,
                                check=True).stdout.strip().splitlines()[-1]
        assert recipe in RULES and not RULES[recipe].skip, \
            f"{cmd} runs {recipe!r}, which the README does not show"
        return
    r = _run(cmd, clone)
    if rule.check is not None:
        assert rule.check(r, clone[0]) is not False, f"$ {cmd}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"


def test_bench_learning_says_a_missing_model_path_is_missing(tmp_path):
    """Bug: a --model path that does not exist ended in a 40-line traceback and Hugging Face's
    "Repo id must be in the form..." message."""
    missing = tmp_path / "runs" / "tiny" / "checkpoints" / "step_000000" / "model"
    r = subprocess.run([sys.executable, "bench/bench_learning.py", "--model", str(missing)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr and "Repo id" not in r.stderr
    assert f"--model {missing}: no such directory" in r.stderr


def _shape(line: str) -> list[str]:
    """A table row's cells with digits masked, runs of equal cells as one (the RL step columns
    follow the run's eval steps: the short run has other steps than the documented one)."""
    cells = [re.sub(r"[+-]?\d+(\.\d+)?", "N", c.strip()) for c in line.strip("|").split("|")]
    # "N steps (N)": the val_oracle_prob is printed only where the config scores validation
    cells = [c.replace("N steps (N)", "N steps") for c in cells]
    return [c for i, c in enumerate(cells) if i == 0 or c != cells[i - 1]]


@pytest.mark.slow
def test_demo_seeds_prints_the_results_table(clone):
    """Bug: bench/demo_seeds.py printed a table with other columns than the documented demo table,
    so its figures did not come from the command beside them. Compared with docs/results.md's
    first demo table of the same header by shape (digits masked): the same columns, header and cell
    formats, on the short demo run as seed 0 (a table printed with a column left out of the docs
    does not count)."""
    _run(DEMO, clone)
    d, env = clone
    shutil.copytree(d / "runs" / "tiny", d / "runs" / "tiny-seed0")
    r = subprocess.run("python bench/demo_seeds.py --seeds 0 --no-run", shell=True, cwd=d, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout.splitlines()
    first = next(i for i, line in enumerate(out) if line.startswith("|"))
    printed = []  # the seed table: the first block of rows (the by-kind table follows it)
    for line in out[first:]:
        if not line.startswith("|"):
            break
        printed.append(line)
    lines = RESULTS.read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("| seed | SFT stopped")]
    i = next((i for i in starts if _shape(lines[i]) == _shape(printed[0])), starts[0])
    documented = []
    for line in lines[i:]:
        if not line.startswith("|"):
            break
        documented.append(line)
    assert [_shape(x) for x in printed[:3]] == [_shape(x) for x in documented[:3]]  # header, rule, a seed
    assert _shape(printed[-1]) == _shape(documented[-1])  # the mean (sd) row
