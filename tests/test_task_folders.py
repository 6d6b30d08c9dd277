"""The shipped task suite (tasks/): every task loads, is well formed, and the suite is balanced.

The full curation run (build, oracle passes k times, no-op fails) is `python tasktool.py validate tasks/`;
here a slow test runs it for real on one task of each layout.
"""
import ast
import re
from collections import Counter
from pathlib import Path

import pytest

import task_folders as T
import tasktool

TASKS = Path(__file__).resolve().parents[1] / "tasks"
TASK_DIRS = T.task_dirs(TASKS)
# categories the suite must cover (issue 2: files, text, Python, debugging, data, git, sysadmin)
CATEGORIES = {"file-operations", "text-processing", "software-engineering", "debugging",
              "data-processing", "version-control", "system-administration"}


def category(task):
    meta = task.metadata.get("metadata", task.metadata) if task.layout == "tb2" else task.metadata
    return meta.get("category")


def test_suite_size_layouts_and_categories():
    tasks = [T.load_task(d) for d in TASK_DIRS]
    assert len(tasks) >= 24
    layouts = Counter(t.layout for t in tasks)
    assert layouts["tb1"] >= len(tasks) // 2 and layouts["tb2"] >= len(tasks) // 4, layouts  # ~2/3 : 1/3
    cats = Counter(category(t) for t in tasks)
    assert set(cats) == CATEGORIES, cats
    assert min(cats.values()) >= 2, cats
    assert len({t.name for t in tasks}) == len(tasks)


@pytest.mark.parametrize("d", TASK_DIRS, ids=[d.name for d in TASK_DIRS])
def test_task_well_formed(d):
    task = T.load_task(d)
    dockerfile = task.dockerfile.read_text()
    assert dockerfile.splitlines()[0] == "FROM termrl-base:bookworm"
    assert "WORKDIR /app" in dockerfile and task.workdir == "/app"
    # the agent must never see the tests or the oracle: nothing of them goes into the image
    for line in dockerfile.splitlines():
        if line.startswith(("COPY", "ADD")):
            assert not re.search(r"\b(tests|solution(\.sh)?|run-tests\.sh)\b", line), line
    assert "/tests" not in task.instruction and "solution" not in task.instruction.lower()
    # several test functions, so per-test results mean something
    src = task.tests["test_outputs.py"].decode()
    tree = ast.parse(src)
    assert sum(isinstance(n, ast.FunctionDef) and n.name.startswith("test_") for n in tree.body) >= 3
    # the oracle replays command by command in a persistent shell
    cmds = T.oracle_commands(task)
    assert cmds and not any(re.match(r"\s*set\s+-e", c) for c in cmds)
    meta = task.metadata.get("metadata", task.metadata)
    assert meta["author_name"] == "termrl" and meta["difficulty"] in ("easy", "medium", "hard")
    assert len(meta["tags"]) >= 2
    assert not task.allow_internet


@pytest.mark.slow
@pytest.mark.parametrize("name", ["organize-files-by-extension", "json-user-report"])
def test_shipped_task_validates_for_real(docker_env, name):
    row = tasktool.validate_task(docker_env, TASKS / name, k=1)
    assert row["status"] == "ok", row
    assert row["noop"] == 0.0 and row["oracle"] == [1.0]
