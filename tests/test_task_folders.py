"""The shipped task suite (tasks/): every task loads, is well formed, and the suite is balanced.

The full curation run (build, oracle passes k times, no-op fails) is `python tasktool.py validate tasks/`;
here a slow test runs it for real on one task of each layout.
"""
import ast
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import task_folders as T
import tasktool

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "tasks"
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


# --- a task folder is a sandbox of its own ------------------------------------------------------

FIXTURES = Path(__file__).resolve().parent / "fixtures"
CANARY = "host-canary-" + os.urandom(8).hex()  # what no Task, prompt, container or log may ever hold

# how a downloaded task folder could reach a host file: (fixture, path in the folder, what it links to)
ROUTES = {
    "test-file": ("tb1-hello", "tests/test_outputs.py", "canary.txt"),     # copied in as a test
    "tests-dir": ("tb1-hello", "tests", "secrets"),                        # a host folder as the hidden tests
    "run-tests": ("tb1-hello", "run-tests.sh", "canary.txt"),              # run as the harness
    "test-sh": ("tb2-partial", "tests/test.sh", "canary.txt"),
    "instruction": ("tb2-partial", "instruction.md", "canary.txt"),        # the model's prompt
    "solution": ("tb1-hello", "solution.sh", "canary.txt"),                # typed into a container (validate)
    "copy-tb1": ("tb1-hello", "leak.txt", "canary.txt"),                   # a Dockerfile COPY source
    "copy-tb2": ("tb2-partial", "environment/leak.txt", "canary.txt"),
    "copy-dir": ("tb2-partial", "environment/leak", "secrets"),
}


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A collection of task folders, one per route linking to a host canary, one whose task.yaml and
    one whose instruction.md are not UTF-8, and a clean one whose in-folder symlink is fine. Returns
    (collection, host folder)."""
    root = tmp_path_factory.mktemp("planted")
    host, tasks = root / "host", root / "tasks"
    (host / "secrets").mkdir(parents=True)
    (host / "canary.txt").write_text(f"echo {CANARY}\n")
    (host / "secrets" / "test_outputs.py").write_text(f"def test_x():\n    assert '{CANARY}'\n")
    for name, (fixture, rel, target) in ROUTES.items():
        d = shutil.copytree(FIXTURES / fixture, tasks / name)
        if (d / rel).is_dir():
            shutil.rmtree(d / rel)
        (d / rel).unlink(missing_ok=True)
        (d / rel).symlink_to(host / target)
        if name.startswith("copy"):
            dockerfile = d / ("Dockerfile" if fixture == "tb1-hello" else "environment/Dockerfile")
            dockerfile.write_text(dockerfile.read_text() + f"COPY {Path(rel).name} /app/{Path(rel).name}\n")
    bad_yaml = shutil.copytree(FIXTURES / "tb1-hello", tasks / "latin1-yaml")
    (bad_yaml / "task.yaml").write_bytes(
        "instruction: Schreib »grüß dich« nach /app/g.txt\n".encode("latin-1"))
    bad_md = shutil.copytree(FIXTURES / "tb2-partial", tasks / "latin1-md")
    (bad_md / "instruction.md").write_bytes("Écris « bonjour » dans /app/a.txt".encode("latin-1"))
    clean = shutil.copytree(FIXTURES / "tb1-hello", tasks / "clean")
    (clean / "tests" / "same.py").symlink_to("test_outputs.py")  # inside the folder: allowed
    return tasks, host


@pytest.mark.parametrize("route", ROUTES)
def test_a_symlink_out_of_the_task_folder_is_refused_at_load(planted, route):
    """Bug: a symlink inside a task (a test file, tests/, run-tests.sh, instruction.md, a build
    context file) pointing outside it copied the host's file or folder into the container, ran it
    as the harness, or made it the model's prompt. Refused at load, naming the link and its target."""
    tasks, host = planted
    rel, target = ROUTES[route][1], ROUTES[route][2]
    with pytest.raises(T.TaskError) as e:
        T.load_task(tasks / route)
    assert str(e.value).startswith(f"{tasks / route / rel}: a symlink to {host / target}, "
                                   "outside the task folder")
    assert CANARY not in str(e.value)


def test_text_must_decode_and_sizes_have_limits(planted, tmp_path):
    """Bugs: a non-UTF-8 task.yaml / instruction.md raised UnicodeDecodeError (not a TaskError), which
    crashed train.py and stopped `validate` on the whole folder without naming the file; a
    50 MB instruction loaded unchecked (its one episode: 192 s, 9 GB); a fifo among the tests hung
    the loader for ever."""
    tasks, _ = planted
    for name, file in (("latin1-yaml", "task.yaml"), ("latin1-md", "instruction.md")):
        with pytest.raises(T.TaskError, match=rf"^{tasks / name / file}: not UTF-8 text \(byte \d+: invalid"):
            T.load_task(tasks / name)
    big = shutil.copytree(FIXTURES / "tb2-partial", tmp_path / "big")
    (big / "instruction.md").write_text("x" * (T.MAX_INSTRUCTION_BYTES + 1))
    with pytest.raises(T.TaskError, match=rf"instruction.md: {T.MAX_INSTRUCTION_BYTES + 1} bytes; at most"):
        T.load_task(big)
    tb1 = shutil.copytree(FIXTURES / "tb1-hello", tmp_path / "big-tb1")
    (tb1 / "task.yaml").write_text(f"instruction: {'é' * (T.MAX_INSTRUCTION_BYTES // 2 + 1)}\n")  # é: 2 bytes
    with pytest.raises(T.TaskError,
                       match=rf"task.yaml: the instruction is {T.MAX_INSTRUCTION_BYTES + 2} bytes; at most"):
        T.load_task(tb1)
    (big / "instruction.md").write_text("Create /app/a.txt.")
    with open(big / "tests" / "data.bin", "wb") as f:  # sparse: no disk spent
        f.truncate(T.MAX_TESTS_BYTES)
    with pytest.raises(T.TaskError,
                       match=rf"{big / 'tests'}: \d+ bytes of tests; .* at most {T.MAX_TESTS_BYTES}"):
        T.load_task(big)
    (big / "tests" / "data.bin").unlink()
    os.mkfifo(big / "tests" / "pipe")
    with pytest.raises(T.TaskError, match="pipe: not a regular file"):
        T.load_task(big)
    (big / "tests" / "pipe").unlink()
    assert T.load_task(big).instruction == "Create /app/a.txt."


def test_a_host_file_never_reaches_a_task_a_container_or_a_log(planted, tmp_path):
    """Each route, through each way tasks are loaded: load_tasks (train.py's and evaluate.py's
    loader) skips the planted and non-UTF-8 tasks with a line naming the file, and loads the clean
    one; train.py --dry-run says the same and counts 1 task; `tasktool.py validate` (real Docker: the
    clean task is built and its oracle run) reports each as malformed naming its file, and the
    clean one ok. No Task, output or JSON holds the canary."""
    import contextlib
    import io
    tasks, _ = planted
    broken = sorted([*ROUTES, "latin1-md", "latin1-yaml"])
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        loaded = T.load_tasks(tasks)
    assert ([t.name for t in loaded] == ["clean"]
            and set(loaded[0].tests) == {"test_outputs.py", "same.py", "run-tests.sh"})
    assert CANARY not in repr(loaded) and CANARY not in err.getvalue()
    lines = err.getvalue().splitlines()
    assert sorted(Path(ln.split(": ")[1]).relative_to(tasks).parts[0] for ln in lines[:-1]) == broken, lines
    assert lines[-1].startswith(f"skipped {len(broken)} of {len(broken) + 1} tasks")

    dry = subprocess.run([sys.executable, "train.py", "--config", "configs/tiny.yaml", "--dry-run",
                          "--set", f"data.train_tasks={tasks}", "--set", f"data.eval_tasks={tasks}",
                          "--set", f"out_dir={tmp_path / 'run'}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert "tasks: 1 train, 1 eval" in dry.stdout, dry.stdout + dry.stderr[-3000:]
    assert f"skipping task: {tasks / 'latin1-yaml' / 'task.yaml'}: not UTF-8 text" in dry.stderr
    assert CANARY not in dry.stdout + dry.stderr

    out = tmp_path / "validate.json"
    val = subprocess.run([sys.executable, "tasktool.py", "validate", str(tasks), "--k", "1",
                          "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    rows = {r["task"]: r for r in json.loads(out.read_text())["tasks"]}
    assert (val.returncode == 1
            and rows.pop("clean")["status"] == "ok"), val.stdout[-3000:] + val.stderr[-3000:]
    assert sorted(rows) == broken and all(r["status"] == "malformed" and str(tasks / n) in r["error"]
                                          for n, r in rows.items()), rows
    assert CANARY not in val.stdout + val.stderr + out.read_text()


def test_a_context_file_linked_out_after_load_is_refused_at_build(docker_env, planted, tmp_path):
    """Bug: the build read the folder again without the loader's checks, so a context file swapped
    for a link to a host file after load was copied into the image. The build refuses it, naming the
    link, and builds nothing."""
    _, host = planted
    d = shutil.copytree(FIXTURES / "tb1-hello", tmp_path / "swapped")
    (d / "data.txt").write_text("plain\n")
    (d / "Dockerfile").write_text((d / "Dockerfile").read_text() + "COPY data.txt /app/data.txt\n")
    task = T.load_task(d)
    (d / "data.txt").unlink()
    (d / "data.txt").symlink_to(host / "canary.txt")
    with pytest.raises(T.TaskError) as e:
        docker_env.image(task)
    assert str(e.value).startswith(f"{d / 'data.txt'}: a symlink to {host / 'canary.txt'}, "
                                   "outside the task folder")
    assert CANARY not in str(e.value)


def test_a_folder_of_tasks_is_not_searched_past_a_symlink_out_of_it(tmp_path, capsys):
    """A symlinked folder leading out of the collection (to / it would search the whole host) is
    skipped with a line; one that stays inside is searched."""
    elsewhere = shutil.copytree(FIXTURES / "tb1-hello", tmp_path / "elsewhere" / "tb1-hello")
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "out").symlink_to(elsewhere.parent)
    shutil.copytree(FIXTURES / "tb2-partial", tmp_path / "tasks" / "nested" / "tb2-partial")
    (tmp_path / "tasks" / "again").symlink_to("nested")
    assert [t.name for t in T.load_tasks(tmp_path / "tasks")] == ["tb2-partial", "tb2-partial"]
    assert (f"skipping {tmp_path / 'tasks' / 'out'}: a symlink to {elsewhere.parent}, outside"
            in capsys.readouterr().err)


# --- every name is checked where it is read --------------------------------------------------------

@pytest.mark.parametrize("image", ["../../../etc/passwd", "/etc/passwd", "Ubuntu:22.04", "ubuntu:", "a//b",
                                   "ubuntu@sha256:abc", "-ubuntu", "ubuntu:-x", "a" * 256, "ubuntu latest"])
def test_a_docker_image_off_dockers_reference_grammar_is_refused(tmp_path, image):
    """Bug: a TB2 task whose docker_image was `../../../etc/passwd` loaded and the name reached the
    Docker API as a path. Refused at load, naming the key, the folder and the grammar."""
    d = shutil.copytree(FIXTURES / "tb2-partial", tmp_path / "img")
    (d / "task.toml").write_text((d / "task.toml").read_text() + f"docker_image = {json.dumps(image)}\n")
    with pytest.raises(T.TaskError) as e:
        T.load_task(d)
    assert str(e.value).startswith(f"{d / 'task.toml'} [environment] docker_image: {image!r} is not a Docker "
                                   "image reference"), e.value
    assert "[registry-host[:port]/]name[:tag][@digest]" in str(e.value)


@pytest.mark.parametrize("image", ["ubuntu", "ubuntu:22.04", "library/ubuntu:22.04",
                                   "ghcr.io/laude-institute/t-bench/python-3-13:20250620",
                                   "localhost:5000/a/b_c__d-e.f:v1.2-rc_3",
                                   "[::1]:5000/img", "192.168.1.2:443/x/y",
                                   "alpine@sha256:" + "a" * 64, "alpine:3.20@sha256:" + "0f" * 32])
def test_a_docker_image_on_the_grammar_loads(tmp_path, image):
    d = shutil.copytree(FIXTURES / "tb2-partial", tmp_path / "img")
    (d / "task.toml").write_text((d / "task.toml").read_text() + f"docker_image = {json.dumps(image)}\n")
    assert T.load_task(d).image == image


@pytest.mark.parametrize("workdir", ["../../etc", "app", "/app/../../etc", "/app/..", ""])
def test_a_workdir_that_is_not_absolute_or_climbs_is_refused(tmp_path, workdir):
    """Bug: a TB2 workdir of `../../etc` loaded and every episode then failed as infra at container
    create. Refused at load with the rule."""
    d = shutil.copytree(FIXTURES / "tb2-partial", tmp_path / "wd")
    (d / "task.toml").write_text((d / "task.toml").read_text() + f"workdir = {json.dumps(workdir)}\n")
    with pytest.raises(T.TaskError, match=rf"^{re.escape(str(d / 'task.toml'))} \[environment\] workdir: "
                                          rf"{re.escape(repr(workdir))} .*absolute path with no '\.\.'"):
        T.load_task(d)
    (d / "task.toml").write_text((d / "task.toml").read_text().replace(f"workdir = {json.dumps(workdir)}",
                                                                       'workdir = "/srv/app"'))
    assert T.load_task(d).workdir == "/srv/app"


def test_a_train_run_whose_only_task_is_malformed_stops_in_one_line(tmp_path):
    """Bug: a train run whose only task folder was malformed (not UTF-8) ended in a traceback, where
    its --dry-run named the problem. The run stops with one line naming the file and the reason."""
    d = shutil.copytree(FIXTURES / "tb1-hello", tmp_path / "tasks" / "latin1")
    (d / "task.yaml").write_bytes("instruction: Schreib »grüß dich« nach /app/g.txt\n".encode("latin-1"))
    r = subprocess.run([sys.executable, "train.py", "--config", "configs/tiny.yaml",
                        "--set", f"data.train_tasks={d.parent}", "--set", f"data.eval_tasks={d.parent}",
                        "--set", f"out_dir={tmp_path / 'run'}"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert last.startswith("tasks: ") and f"{d / 'task.yaml'}: not UTF-8 text" in last, r.stderr[-3000:]
