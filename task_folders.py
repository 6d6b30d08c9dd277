"""task_folders.py — the Task an agent is asked to do, read from Terminal-Bench task folders.

Loads Terminal-Bench 1.0 (task.yaml + run-tests.sh) and 2 / Harbor (task.toml + tests/test.sh)
task directories into `Task`s, and splits an oracle solution into the commands typed into a
terminal. Knows nothing about containers (env.py) and generates nothing (generated_tasks.py).

A task folder may come from anywhere, so it is a sandbox of its own: every file the loader reads,
and every file of the image's build context, resolves inside the folder (a symlink pointing out is
refused: `safe_files`), text decodes as UTF-8, and the instruction and tests have size limits. A
folder that breaks one is a TaskError naming the file, which load_tasks skips with a line.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import yaml

BASE_IMAGE = "termrl-base:bookworm"  # the image generated tasks run in (scripts/setup.sh builds it)
DEFAULT_MEMORY_MB, DEFAULT_CPUS, DEFAULT_PIDS = 2048, 1.0, 512
DEFAULT_DISK_MB = 4096  # a container's writable layer: 16 episodes at once stay under 64 GiB of host disk


class TaskError(ValueError):
    """A malformed task directory; the message names the file and what is wrong."""


# --- Task folders --------------------------------------------------------------------------------

@dataclass
class Task:
    name: str
    instruction: str
    layout: str                       # "tb1" | "tb2" | "generated"
    path: Path | None = None
    image: str | None = None          # use this image as is ...
    dockerfile: Path | None = None    # ... or build this Dockerfile
    build_context: Path | None = None
    setup: str | None = None          # shell run before the agent starts (generated tasks)
    tests: dict = field(default_factory=dict)   # path relative to /tests -> bytes
    test_command: str = "bash /tests/run-tests.sh"
    solution: str = ""
    workdir: str = "/app"
    agent_timeout_s: float = 360.0
    test_timeout_s: float = 60.0
    build_timeout_s: float = 600.0
    memory_mb: int = DEFAULT_MEMORY_MB
    cpus: float = DEFAULT_CPUS
    pids: int = DEFAULT_PIDS
    disk_mb: int = DEFAULT_DISK_MB    # the container's writable layer (env.py enforces it; README "Disk cap")
    allow_internet: bool = False
    metadata: dict = field(default_factory=dict)
    # Grading integrity opt-outs, for tasks whose legitimate solution needs them (grading.grade):
    keep_agent_processes: bool = False  # the tests talk to a service the agent started
    env: dict = field(default_factory=dict)  # container environment variables (Harbor [environment.env])
    tests_in_agent_shell: bool = False  # TB1 run_tests_in_same_shell: the tests see the agent's exports
    tests_need_network: bool = False  # the tests download their runner (grading joins env's grading network)
    verifier_changes_ok: list = field(default_factory=list)  # globs of toolchain paths a solution may change
    tests_read_ok: list = field(default_factory=list)  # globs of image files the tests may read (validate)
    pytest_plugins: list = field(default_factory=list)  # plugins the tests need (entry-point autoload is off)
    tests_import_agent_code: bool = False  # the tests import from the working directory (else PYTHONSAFEPATH)
    host_labels: list = field(default_factory=list)  # only hosts with all these labels run it (env.hosts)


# The instruction is the model's prompt: 64 KiB is ~16k tokens, past every rollout.max_context shipped
# and many times the longest Terminal-Bench instruction (a few KiB); an unchecked 50 MB one took one
# episode 192 s and 9 GB. The tests are held by every Task and copied into each graded container:
# 16 MiB leaves room for test data (fixtures, expected outputs) and keeps a thousand tasks in memory.
# Other text (task.yaml / task.toml, solution, Dockerfile) is parsed whole: 1 MiB.
MAX_INSTRUCTION_BYTES = 64 << 10
MAX_TESTS_BYTES = 16 << 20
MAX_TEXT_BYTES = 1 << 20


def _need(path: Path, what: str) -> Path:
    if not path.exists():
        raise TaskError(f"{path}: missing ({what})")
    return path


def _inside(path: Path, folder: Path) -> Path:
    """path, when it resolves (symlinks followed) inside the task folder; else a TaskError naming both.
    tests/test_task_folders.py::test_a_host_file_never_reaches_a_task_a_container_or_a_log"""
    real = path.resolve()
    if not real.is_relative_to(folder.resolve()):
        raise TaskError(f"{path}: a symlink to {real}, outside the task folder {folder}; a task may use its "
                        f"own files only (copy the file into the folder instead)")
    return path


def safe_files(top: Path, folder: Path) -> list[Path]:
    """Every regular file under `top` (a directory of task folder `folder`), sorted, __pycache__ left
    out. A symlink anywhere under it that resolves outside `folder` is a TaskError, and so is a fifo,
    socket or device (reading one would block or never end). What the loader reads from tests/ and
    what env.py copies into a build context."""
    _inside(top, folder)
    files = []
    for p in sorted(top.rglob("*")):
        if "__pycache__" in p.parts:
            continue
        if p.is_symlink():
            _inside(p, folder)
        if p.is_file():
            files.append(p)
        elif p.exists() and not p.is_dir():
            raise TaskError(f"{p}: not a regular file (a fifo, socket or device); "
                            "a task holds plain files only")
    return files


def _read(path: Path, folder: Path, what: str, limit: int = MAX_TEXT_BYTES) -> bytes:
    """The bytes of one file of task folder `folder`, checked as `safe_files` checks them, at most `limit`."""
    _inside(_need(path, what), folder)
    if not path.is_file():
        raise TaskError(f"{path}: not a regular file ({what})")
    if (size := path.stat().st_size) > limit:
        raise TaskError(f"{path}: {size} bytes; at most {limit} ({limit >> 10} KiB) "
                        f"are read from it ({what})")
    return path.read_bytes()


def _text(path: Path, folder: Path, what: str, limit: int = MAX_TEXT_BYTES) -> str:
    """_read, decoded as UTF-8: a file that is not is a TaskError naming it and the first bad byte."""
    data = _read(path, folder, what, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TaskError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason}); "
                        f"save it as UTF-8 ({what})") from None


def _read_tests(tests_dir: Path, folder: Path) -> dict:
    _need(tests_dir, "the tests/ directory with the hidden tests")
    paths = safe_files(tests_dir, folder)
    if not paths:
        raise TaskError(f"{tests_dir}: empty (the hidden tests go here)")
    if (size := sum(p.stat().st_size for p in paths)) > MAX_TESTS_BYTES:
        raise TaskError(f"{tests_dir}: {size} bytes of tests; "
                        f"a task's tests may hold at most {MAX_TESTS_BYTES} "
                        f"({MAX_TESTS_BYTES >> 20} MiB): every graded container receives them")
    return {str(p.relative_to(tests_dir)): p.read_bytes() for p in paths}


def _instruction(text: str, where: Path) -> str:
    if not text.strip():
        raise TaskError(f"{where}: empty instruction (the task text the agent sees)")
    if (size := len(text.encode())) > MAX_INSTRUCTION_BYTES:
        raise TaskError(f"{where}: the instruction is {size} bytes; at most {MAX_INSTRUCTION_BYTES} "
                        f"({MAX_INSTRUCTION_BYTES >> 10} KiB): it is the model's prompt")
    return text.strip()


# Never in a task image's build context (env.py): the agent could read them from the image.
HIDDEN_FILES = {"tests", "solution", "solution.sh", "solution.yaml", "run-tests.sh"}


def _instructions(text: str) -> list[tuple[int, str]]:
    """(line number, text) of each Dockerfile instruction, continuations joined, comments left out."""
    logical, first = [], None
    for n, raw in enumerate(text.splitlines(), 1):
        if first is None:
            if not raw.strip() or raw.lstrip().startswith("#"):
                continue
            first, parts = n, []
        parts.append(raw.rstrip("\\"))
        if not raw.endswith("\\"):
            logical.append((first, " ".join(parts)))
            first = None
    return logical


def _copy_words(args: str) -> list[str]:
    try:
        words = json.loads(args) if args.startswith("[") else None
    except json.JSONDecodeError:
        words = None
    if isinstance(words, list):
        return list(map(str, words))
    return [w for w in args.split() if not w.startswith("--")]


def _never_in_final(logical: list, i: int, stage: int, final_stages: set, src: str, dest: str) -> str:
    """Why the files a COPY at logical[i] (of stage `stage`) brings in never reach the final image
    ("" when they may): its stage is one the final image does not build on (a builder stage, whose
    outputs the final one copies), or a later RUN of the same stage removes them."""
    if stage not in final_stages:
        return f"only in stage {stage + 1}, which the final image does not build on"
    target = dest.rstrip("/") + ("/" + Path(src.rstrip("/")).name if dest.endswith("/") else "")
    for n, line in logical[i + 1:]:
        if re.match(r"\s*FROM\s", line, re.I):
            break
        if m := re.match(r"\s*RUN\s+(.*)$", line, re.I):
            for rm in re.findall(r"\brm\s+([^;&|]*)", m.group(1)):
                if any(target == t.rstrip("/") or target.startswith(t.rstrip("/") + "/")
                       for t in rm.split() if t.startswith("/") and t.rstrip("/")):
                    return f"line {n} removes them in the same stage"
    return ""


def _refuse_hidden_copies(dockerfile: Path, context: Path, folder: Path, layout: str):
    """A TaskError for a COPY/ADD of the tests or the solution, which are never in the build context:
    the build would fail at episode time, and an image holding them would show the agent the tests.
    A Harbor environment/ folder's own file of such a name is the environment's, and fine. A copy
    the final image never holds (a builder stage, a later `RUN rm`) gets advice that keeps it working
    (tests/test_real_tasks.py::
    test_a_copy_of_tests_the_final_image_never_holds_is_refused_with_advice_that_works)."""
    logical = _instructions(_text(dockerfile, folder, "the task image's Dockerfile"))
    froms = [(i, line.split()) for i, (_, line) in enumerate(logical) if re.match(r"\s*FROM\s", line, re.I)]
    names = {w[3].lower(): k for k, (_, w) in enumerate(froms) if len(w) >= 4 and w[2].lower() == "as"}
    final_stages, k = set(), len(froms) - 1
    while k >= 0 and k not in final_stages:  # the last stage and the stages it is built FROM
        final_stages.add(k)
        base = next((w for w in froms[k][1][1:] if not w.startswith("--")), "").lower()
        k = names.get(base, -1)
    for i, (n, line) in enumerate(logical):
        m = re.match(r"\s*(COPY|ADD)\s+(.*)$", line, re.I)
        if not m or "--from" in m.group(2):
            continue
        words = _copy_words(m.group(2).strip())
        for src in words[:-1]:
            top = src.removeprefix("./").split("/")[0]
            if top not in HIDDEN_FILES or (layout != "tb1" and (context / src).exists()):
                continue
            stage = sum(1 for j, _ in froms if j < i) - 1
            where = f"{dockerfile}:{n}: {line.strip()}"
            if why := _never_in_final(logical, i, stage, final_stages, src, words[-1]):
                inner = src.removeprefix("./").split("/", 1)[-1] if "/" in src.strip("/") else src
                raise TaskError(
                    f"{where}: its files never reach the final image ({why}), but the tests and the "
                    "solution are never in the build context, so this line cannot build. Keep a copy of "
                    "what it needs "
                    f"outside {top}/ and COPY that instead: `mkdir -p {context}/build-input && cp -r "
                    f"{context / src} {context}/build-input/{inner}`, then "
                    f"`COPY build-input/{inner} {words[-1]}`")
            raise TaskError(
                f"{where}: the tests and the solution are never built into the image (the agent would read "
                "them); termrl copies the tests in when it grades and types the solution in for validate: "
                "delete this line")


def _dockerfile_workdir(dockerfile: Path, folder: Path, default: str = "/app") -> str:
    """The last absolute WORKDIR of the Dockerfile: TB tasks put the agent where the image does."""
    found = re.findall(r"^\s*WORKDIR\s+(\S+)\s*$", _text(dockerfile, folder, "the task image's Dockerfile"),
                       re.M | re.I)
    return found[-1] if found and found[-1].startswith("/") and "$" not in found[-1] else default


# Docker's image reference grammar (github.com/distribution/reference, regexp.go):
#   reference := name [":" tag] ["@" digest];  name := [domain "/"] path-component ["/" path-component]*
#   domain := host [":" port];  host := domain-component ["." domain-component]* | "[" IPv6 "]"
#   path-component := [a-z0-9]+ (separator [a-z0-9]+)*;  separator := [_.] | "__" | [-]+
#   tag := [\w][\w.-]{0,127};  digest := algorithm ":" [0-9a-fA-F]{32,}
# A name off it reached the Docker API as a path (`../../../etc/passwd`).
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_REFERENCE = re.compile(rf"(?:{_DOMAIN}/)?{_PATH_PART}(?:/{_PATH_PART})*"
                             r"(?::[\w][\w.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*"
                             r":[0-9a-fA-F]{32,})?")


def _image_ref(value, where: str) -> str:
    """value when it is a Docker image reference (IMAGE_REFERENCE; the name at most 255 characters)."""
    name = value.split("@")[0] if isinstance(value, str) else ""
    head, colon, tail = name.rpartition(":")
    name = head if colon and "/" not in tail else name  # the tag off; a registry's :port stays
    if not (isinstance(value, str) and IMAGE_REFERENCE.fullmatch(value) and len(name) <= 255):
        raise TaskError(f"{where}: {value!r} is not a Docker image reference "
                        "([registry-host[:port]/]name[:tag][@digest]: the name lower-case letters, digits "
                        "and single . _ __ or - between them, in /-separated parts; "
                        "e.g. python:3.13-slim-bookworm)")
    return value


def _workdir(value, where: str) -> str:
    """value when it is an absolute path with no `..` component: the agent's starting directory."""
    if not (isinstance(value, str) and value.startswith("/") and ".." not in value.split("/")):
        raise TaskError(f"{where}: {value!r} is not a working directory; it must be an absolute path with no "
                        "'..' component (e.g. /app)")
    return value


def _number(value, where: str, cast=float):
    try:
        return cast(value)
    except (TypeError, ValueError):
        raise TaskError(f"{where}: expected a number, got {value!r}") from None


def _memory_mb(env: dict, where: str) -> int:
    if "memory_mb" in env:
        return _number(env["memory_mb"], f"{where} [environment] memory_mb", int)
    if "memory" in env:  # Harbor also writes memory = "2G" / "512M"
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)[bB]?\s*", str(env["memory"]))
        if not m:
            raise TaskError(f"{where} [environment] memory: cannot parse {env['memory']!r} (use e.g. 2G)")
        scale = {"k": 1 / 1024, "m": 1, "g": 1024, "": 1 / (1 << 20)}[m.group(2).lower()]
        return max(1, int(float(m.group(1)) * scale))
    return DEFAULT_MEMORY_MB


def _load_tb1(d: Path) -> Task:
    f = d / "task.yaml"
    try:
        meta = yaml.safe_load(_text(f, d, "the task's metadata and instruction")) or {}
    except yaml.YAMLError as e:
        raise TaskError(f"{f}: invalid YAML: {e}") from None
    if not isinstance(meta, dict):
        raise TaskError(f"{f}: expected a mapping with an 'instruction' key")
    # what termrl cannot run is said before what such a task lacks
    # (tests/test_real_tasks.py::test_multi_step_and_multi_container_are_said_before_missing_files)
    for name in _COMPOSE:
        _single_container(d / name, d)
    instruction = meta.get("instruction")
    if not instruction and isinstance(meta.get("descriptions"), list) and meta["descriptions"]:
        instruction = meta["descriptions"][0].get("description")  # older TB1 tasks
    if not isinstance(instruction, str) or not instruction.strip():
        raise TaskError(f"{f}: missing 'instruction' (the task text the agent sees)")
    instruction = _instruction(instruction, f)
    dockerfile = _need(d / "Dockerfile", "the task image's Dockerfile")
    safe_files(d, d)  # the build context: all of the folder
    _refuse_hidden_copies(dockerfile, d, d, "tb1")
    same_shell = meta.get("run_tests_in_same_shell", False)
    if not isinstance(same_shell, bool):
        raise TaskError(f"{f}: run_tests_in_same_shell must be true or false, got {same_shell!r}")
    tests = _read_tests(d / "tests", d)
    tests["run-tests.sh"] = _read(d / "run-tests.sh", d, "the script that runs the tests")
    if (d / "solution.sh").exists():
        solution = _text(d / "solution.sh", d, "the oracle solution")
    elif (d / "solution.yaml").exists():
        steps = yaml.safe_load(_text(d / "solution.yaml", d, "the oracle solution")) or []
        solution = "\n".join(s["command"] if isinstance(s, dict) else str(s) for s in steps)
    else:
        raise TaskError(f"{d / 'solution.sh'}: missing (the oracle solution)")
    return Task(
        name=d.name, instruction=instruction, layout="tb1", path=d, dockerfile=dockerfile,
        build_context=d, tests=tests, test_command="bash /tests/run-tests.sh", solution=solution,
        workdir=_dockerfile_workdir(dockerfile, d),
        agent_timeout_s=_number(meta.get("max_agent_timeout_sec", 360), f"{f} max_agent_timeout_sec"),
        test_timeout_s=_number(meta.get("max_test_timeout_sec", 60), f"{f} max_test_timeout_sec"),
        memory_mb=_number(meta.get("memory_mb", DEFAULT_MEMORY_MB), f"{f} memory_mb", int),
        cpus=_number(meta.get("cpus", DEFAULT_CPUS), f"{f} cpus"),
        pids=_number(meta.get("pids", DEFAULT_PIDS), f"{f} pids", int),
        allow_internet=bool(meta.get("allow_internet", False)), metadata=meta,
        tests_in_agent_shell=same_shell,
        tests_need_network=_needs_network(meta, tests, str(f)), host_labels=_host_labels(meta, str(f)),
        **_integrity(meta, str(f)))


_COMPOSE = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")


def _single_container(compose: Path, folder: Path):
    """Refuse a compose file with more than the task's own container: termrl runs one container per
    episode, and a task whose tests need a database or a second host would silently fail."""
    if not compose.exists():
        return
    try:
        services = (yaml.safe_load(_text(compose, folder, "the compose file")) or {}).get("services") or {}
    except (yaml.YAMLError, AttributeError) as e:
        raise TaskError(f"{compose}: cannot read the compose file ({e})") from None
    if len(services) > 1:
        raise TaskError(f"{compose}: a multi-container task (services {', '.join(map(str, services))}); "
                        "termrl runs each episode in one container, so this task cannot run as written")


# Commands by which a test script fetches its runner (TB1's uv/pytest setup, TB2's uvx); such a
# task's grading needs the network even though its agent may not have it.
_FETCHES = re.compile(r"\b(curl|wget|uvx|pip3?\s+install|uv\s+(pip|add|sync|venv|run|tool)|"
                      r"apt(-get)?\s+install|npm\s+(install|ci)|git\s+clone)\b")


def _needs_network(meta: dict, tests: dict, where: str) -> bool:
    """tests_need_network from the task when it says (TB1 top level, TB2 [verifier]), else whether a
    test script fetches something."""
    if "tests_need_network" in meta:
        if not isinstance(meta["tests_need_network"], bool):
            raise TaskError(f"{where}: tests_need_network must be true or false")
        return meta["tests_need_network"]
    return any(_FETCHES.search(v.decode("utf-8", "replace")) for k, v in tests.items() if k.endswith(".sh"))


def _host_labels(meta: dict, where: str) -> list:
    """host_labels: the labels a Docker host needs to run this task (an arm64 image, a big machine)."""
    labels = meta.get("host_labels", [])
    if not (isinstance(labels, list) and all(isinstance(x, str) and x for x in labels)):
        raise TaskError(f"{where}: host_labels must be a list of label names, got {labels!r}")
    return labels


def _integrity(meta: dict, where: str) -> dict:
    """The grading opt-outs of a task: TB1 top-level keys, TB2 keys of [metadata]."""
    keep, ok = meta.get("keep_agent_processes", False), meta.get("verifier_changes_ok", [])
    reads = meta.get("tests_read_ok", [])
    plugins, agent_code = meta.get("pytest_plugins", []), meta.get("tests_import_agent_code", False)
    for name, v in [("keep_agent_processes", keep), ("tests_import_agent_code", agent_code)]:
        if not isinstance(v, bool):
            raise TaskError(f"{where}: {name} must be true or false, got {v!r}")
    for name, v in [("verifier_changes_ok", ok), ("tests_read_ok", reads)]:
        if not (isinstance(v, list) and all(isinstance(g, str) and g.startswith("/") for g in v)):
            raise TaskError(f"{where}: {name} must be a list of absolute path globs, got {v!r}")
    if not (isinstance(plugins, list) and all(isinstance(p, str) and re.fullmatch(r"[A-Za-z_][\w.]*", p)
                                              for p in plugins)):
        raise TaskError(f"{where}: pytest_plugins must be a list of plugin module names "
                        f"(e.g. [\"pytest_asyncio\"]), got {plugins!r}")
    return {"keep_agent_processes": keep, "verifier_changes_ok": ok, "pytest_plugins": plugins,
            "tests_import_agent_code": agent_code, "tests_read_ok": reads}


def _load_tb2(d: Path) -> Task:
    f = d / "task.toml"
    try:
        meta = tomllib.loads(_text(f, d, "the task's metadata"))
    except tomllib.TOMLDecodeError as e:
        raise TaskError(f"{f}: invalid TOML: {e}") from None
    if "steps" in meta:  # said first, as in TB1 (instruction.md lives in its steps)
        raise TaskError(f"{f}: a multi-step task ([[steps]]); termrl runs one instruction and one verifier "
                        "per episode, so the later steps would never be graded")
    for name in _COMPOSE:
        _single_container(d / "environment" / name, d)
    instruction = _instruction(_text(d / "instruction.md", d, "the task text the agent sees",
                                     MAX_INSTRUCTION_BYTES), d / "instruction.md")
    sections = {k: meta.get(k, {}) for k in ("verifier", "agent", "environment")}
    for k, v in sections.items():
        if not isinstance(v, dict):
            raise TaskError(f"{f}: [{k}] must be a table")
    env = sections["environment"]
    variables = env.get("env", {})
    if not (isinstance(variables, dict)
            and all(isinstance(v, (str, int, float, bool)) for v in variables.values())):
        raise TaskError(f"{f}: [environment.env] must be a table of NAME = \"value\"")
    image = env.get("docker_image")  # a prebuilt image instead of environment/Dockerfile
    if image is not None:
        image = _image_ref(image, f"{f} [environment] docker_image")
    dockerfile = None if image else _need(d / "environment" / "Dockerfile", "the task image's Dockerfile")
    if (d / "environment").exists():
        safe_files(d / "environment", d)  # the build context
    if dockerfile:
        _refuse_hidden_copies(dockerfile, d / "environment", d, "tb2")
    _need(d / "tests" / "test.sh", "the script that runs the tests and writes /logs/verifier/reward.txt")
    tests = _read_tests(d / "tests", d)
    solution = _text(d / "solution" / "solve.sh", d, "the oracle solution")
    return Task(
        name=d.name, instruction=instruction, layout="tb2", path=d, image=image, dockerfile=dockerfile,
        build_context=d / "environment", tests=tests, test_command="bash /tests/test.sh", solution=solution,
        workdir=(_workdir(env["workdir"], f"{f} [environment] workdir") if "workdir" in env
                 else _dockerfile_workdir(dockerfile, d) if dockerfile else "/app"),
        agent_timeout_s=_number(sections["agent"].get("timeout_sec", 600), f"{f} [agent] timeout_sec"),
        test_timeout_s=_number(sections["verifier"].get("timeout_sec", 600), f"{f} [verifier] timeout_sec"),
        build_timeout_s=_number(env.get("build_timeout_sec", 600), f"{f} [environment] build_timeout_sec"),
        memory_mb=_memory_mb(env, str(f)),
        cpus=_number(env.get("cpus", DEFAULT_CPUS), f"{f} [environment] cpus"),
        pids=_number(env.get("pids", DEFAULT_PIDS), f"{f} [environment] pids", int),
        allow_internet=bool(env.get("allow_internet", False)), metadata=meta,
        env={k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in variables.items()},
        tests_need_network=_needs_network(sections["verifier"], tests, f"{f} [verifier]"),
        host_labels=_host_labels(env, f"{f} [environment]"),
        **_integrity(meta.get("metadata") if isinstance(meta.get("metadata"), dict) else {},
                     f"{f} [metadata]"))


def load_task(path) -> Task:
    """Load one Terminal-Bench 1.0 (task.yaml) or 2 / Harbor (task.toml) task directory."""
    d = Path(path)
    if not d.is_dir():
        raise TaskError(f"{d}: not a directory (expected a task folder with task.yaml or task.toml)")
    try:
        if (d / "task.toml").exists():
            return _load_tb2(d)
        if (d / "task.yaml").exists():
            return _load_tb1(d)
    except TaskError as e:  # among a hundred folders, the refusal names its own (tests/test_real_tasks.py)
        if str(d) not in str(e):
            raise TaskError(f"{d}: {e}") from None
        raise
    raise TaskError(f"{d}: neither task.yaml (Terminal-Bench 1.0) nor task.toml (Terminal-Bench 2) found")


def _looks_like_task(d: Path) -> bool:
    return any((d / n).exists() for n in ("task.yaml", "task.toml", "instruction.md", "solution.sh",
                                          "run-tests.sh", "tests", "solution"))


def _find_tasks(d: Path, top: Path | None = None) -> list[Path]:
    """Task folders under d at any depth (a checkout nests collections); hidden folders skipped, and
    symlinks leading out of the folder searched (a link to / would search the host)."""
    top, out = top or d, []
    for c in sorted(d.iterdir()):
        if c.is_dir() and not c.name.startswith((".", "__")):
            if c.is_symlink() and not c.resolve().is_relative_to(top.resolve()):
                print(f"skipping {c}: a symlink to {c.resolve()}, outside {top}", file=sys.stderr)
                continue
            out += [c] if _looks_like_task(c) else _find_tasks(c, top)
    return out


def task_dirs(spec) -> list[Path]:
    """Task folders named by spec: a task dir, a folder of task dirs at any depth, or a list file
    (JSON or lines)."""
    p = Path(spec).expanduser()  # `--set data.train_tasks=~/tb` reaches us unexpanded
    if p.is_file():
        try:
            text = p.read_bytes().decode("utf-8")
        except UnicodeDecodeError as e:
            raise TaskError(f"{p}: not UTF-8 text (byte {e.start}: {e.reason})") from None
        try:
            items = json.loads(text)["tasks"] if text.lstrip().startswith("{") else None
        except (json.JSONDecodeError, KeyError, TypeError):
            raise TaskError(f"{p}: expected JSON of the form {{\"tasks\": [\"path\", ...]}}") from None
        if items is None:
            items = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
        return [(p.parent / i) if not Path(i).is_absolute() else Path(i) for i in items]
    if not p.is_dir():
        raise TaskError(f"{p}: no such task directory or task-list file")
    if (p / "task.yaml").exists() or (p / "task.toml").exists():
        return [p]
    return _find_tasks(p)


def load_tasks(spec, strict: bool = False) -> list[Task]:
    """All tasks named by spec (see task_dirs). A malformed task is skipped with one line on stderr
    naming the file and the reason, then a count (strict: the first one raises TaskError); no task
    at all is a TaskError naming where it looked."""
    dirs, tasks, skipped = task_dirs(spec), [], []
    for d in dirs:
        try:
            tasks.append(load_task(d))
        except TaskError as e:
            if strict:
                raise
            skipped.append(str(e))
            print(f"skipping task: {e}", file=sys.stderr)
    if skipped:
        print(f"skipped {len(skipped)} of {len(dirs)} tasks under {spec} as malformed "
              "(--strict / data.strict_tasks makes this an error)", file=sys.stderr)
    if not tasks:
        why = f"; all {len(dirs)} found are malformed: " + " | ".join(skipped[:3]) if skipped else ""
        where = (f"the folders listed in {spec}" if Path(spec).is_file()
                 else f"{Path(spec).resolve()} and below")
        raise TaskError(f"{spec}: no task found (looked for task.yaml / task.toml in {where}{why})")
    return tasks


# --- Oracle solutions as a sequence of commands --------------------------------------------------

_ERREXIT = re.compile(r"set(\s+([-+][A-Za-z]+|pipefail|errexit|nounset|xtrace|errtrace|noclobber))+")


def _complete(chunk: str) -> bool:
    if re.search(r"(^|[^\\])(\\\\)*\\\n$", chunk):  # ends in a line continuation: bash -n accepts that
        return False
    r = subprocess.run(["bash", "-n"], input=chunk, capture_output=True, text=True)
    return r.returncode == 0 and not r.stderr.strip()  # an open heredoc only warns


def oracle_commands(task: Task) -> list[str]:
    """The oracle solution split into top-level shell commands, in order.

    Lines are accumulated until `bash -n` accepts the chunk; shebangs, comments and `set -e`-style
    lines are dropped (errexit would end a persistent interactive shell at the first failure)."""
    commands, chunk = [], []
    for line in task.solution.splitlines():
        s = line.strip()
        if not chunk and (not s or s.startswith("#") or _ERREXIT.fullmatch(s)):
            continue
        chunk.append(line)
        if _complete("\n".join(chunk) + "\n"):
            commands.append("\n".join(chunk).strip())
            chunk = []
    if chunk:
        raise TaskError(f"{task.path or task.name}: the solution does not parse as bash near: "
                        f"{chunk[0][:80]!r}")
    return commands
