"""grading.py — how an episode is judged: stop the agent, check the verifier's toolchain, run the hidden tests
in the terminal, score; and settle, the one place that decides how an episode ended once the environment has a
say.

grade(term) is a function of a terminal.Terminal (the Docker host, the harness recheck on a fresh container
and the grading network come with the terminal). An episode that tampered with grading gets reward 0 and
evidence (docs/grading-integrity.md, tests/test_tampering.py); infra_error only when the infrastructure
failed.
"""
from __future__ import annotations

import contextlib
import fnmatch
import io
import json
import os
import re
import shlex
import signal
import tarfile
import time
from dataclasses import dataclass, field

from container import (KILL_INSIDE, LABEL, Capped, HostDown, InfraError, bash_exec, changes, owner_labels,
                       register, remove)
from inspection import (ReadWatch, cgroup_dirs, describe, exists_in_root, first_child, names_container,
                        proc_stat, read_in_root, services, write_new_dir, zombie)
from task_folders import Task
from terminal import OUTPUT_CAP

REWARD_MAX = 64 << 10  # a reward file is a number or a small JSON object


@dataclass
class Grade:
    """The verdict of the hidden tests on one episode."""
    reward: float | None = None  # None: not graded (infra_error says why)
    passed: bool = False
    tests: dict = field(default_factory=dict)  # test name -> PASSED | FAILED | ...
    output: str = ""
    infra_error: str | None = None
    rewards: dict = field(default_factory=dict)  # every key of a TB2 reward.json (reward.txt: {"reward": x})
    tampered: str | None = None  # evidence that the episode tampered with grading (reward is then 0)
    image_reads: list = field(default_factory=list)  # with term.trace_reads: the image's files the tests
    # read that the episode left as they were, outside the system's directories (tasktool's truth_in_reach)

    def record(self) -> dict:
        """What a trajectory keeps of the grade (its output's last 2000 characters)."""
        return {"passed": self.passed, "tests": self.tests, "output": self.output[-2000:],
                "infra_error": self.infra_error, "rewards": self.rewards, "tampered": self.tampered}


# What a harness prints when it cannot download its runner (curl, pip, uv, apt's "Temporary failure
# resolving", DNS).
_NO_NETWORK = re.compile(r"^.*(Could not resolve|Temporary failure (in name )?resol|Network is unreachable|"
                         r"Failed to establish a new connection|failed to lookup address|dns error).*$",
                         re.M | re.I)
# Where the verifier's input and output live: a process of the agent that names them is tampering.
_VERIFIER_PATHS = re.compile(r"/tests\b|/logs/verifier|reward\.(txt|json)")
RUNNER_CONFIGS = ("pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")
# Programs every test harness may run, besides the words of the task's own test scripts (rm, mkdir:
# verify's clean step; sleep: what keeps a GradingBox up).
_HARNESS_PROGRAMS = {"bash", "sh", "dash", "env", "timeout", "python", "python3", "pytest", "pytest-3",
                     "py.test", "pip", "pip3", "uv", "uvx", "rm", "mkdir", "sleep"}
_RUNNER_PACKAGES = {"pytest", "_pytest", "pluggy", "iniconfig", "pytest.py", "_pytest.py", "py.py",
                    "pluggy.py"}
# The packages pytest 7-8 imports at start-up, in a Python package directory (a project's own `py/`
# or `packaging/` is not on the runner's path: PYTHONSAFEPATH).
_RUNNER_DEPS = re.compile(r"/python[\d.]*/(dist|site)-packages/(py|attrs?|packaging|exceptiongroup|tomli|"
                          r"colorama|more_itertools)(\.py|/|$)")
# The shared libraries the shell and the interpreter load, wherever a copy of one is added or changed.
_CLOSURE_LIBS = re.compile(r"(ld-linux[^/]*|ld64[^/]*|lib(c|m|dl|pthread|rt|util|tinfo|readline|ncursesw?|"
                           r"python3[^/]*|z|expat|ffi|crypt|ssl|crypto|sqlite3|bz2|lzma|uuid|mpdec|nss_[a-z]+)\.so[.\d]*)")
_INSTALLER_CONFIGS = {"pip.conf", "uv.toml", ".pydistutils.cfg", ".npmrc", ".condarc"}
_BIN_DIRS = ("/usr/local/sbin/", "/usr/local/bin/", "/usr/sbin/", "/usr/bin/", "/sbin/", "/bin/")


def grade(term) -> Grade:
    """Stop the agent, check the verifier's toolchain, copy the hidden tests in, run them, score.

    reward: 1/0 from the test exit code (TB1, generated) or reward.txt/json (TB2). An episode
    that tampered with grading gets reward 0 and `tampered` evidence; infra_error (reward None)
    only when Docker failed, the container was lost to the infrastructure (`lost`), or grading
    failed and the harness fails on a fresh container too (blame; tests/test_tampering.py,
    tests/test_hosts.py)."""
    if not term.host_ok():
        return Grade(infra_error=term.lost())
    try:
        g = _grade(term)
    except Exception as e:  # our own code failed on what the agent left: the same rule as any failure
        g = blame(term, f"grading failed: {type(e).__name__}: {e}")
    if (g.tampered or g.infra_error) and (why := term.lost()):
        return Grade(tests=g.tests, output=g.output, infra_error=why)
    return g


def _removed(term) -> str | None:
    """Why the container no longer exists, or None: no container runs with auto-remove, so nothing
    inside one can remove it; the daemon or an operator did (test_env.test_grading_infra_error_*)."""
    try:
        term.client.api.inspect_container(term.id)
    except Exception as e:
        if getattr(e, "status_code", None) == 404:
            return f"container {term.id[:12]} was removed during the episode (by Docker or an operator)"
    return None


def blame(term, failure: str, g: Grade | None = None) -> Grade:
    """The one rule for a grading that failed after the agent acted (an exception in our host-side
    code, a Docker error, a harness that did not run, one that could not fetch its runner): the
    agent's failure (reward 0, flagged with the failure as evidence) unless the same harness, run
    the same way on a fresh container of the image, fails too; only then an infrastructure error.
    A container the agent stopped is its failure without a recheck (tests/test_tampering.py::
    test_grading_failure_after_the_agent_acted_is_the_agents and the test after it)."""
    tests, output, rewards = (g.tests, g.output, g.rewards) if g else ({}, "", {})
    failure = failure[:3000]  # an error can quote a path of any length the agent made
    # the Docker host or the container went away: nothing to recheck on
    if why := term.lost() or _removed(term):
        return Grade(tests=tests, output=output, infra_error=why)
    if why := term.agent_stopped():
        return Grade(reward=0.0, tests=tests, output=output, rewards=rewards, tampered=why)
    try:
        runs = term.harness_runs is not None and term.harness_runs(term.task)
    except Exception:  # no fresh container to compare with: the infrastructure's failure
        runs = False
    if runs:
        return Grade(reward=0.0, tests=tests, output=output, rewards=rewards,
                     tampered=f"{failure} after the episode, but the harness runs on a fresh container")
    return Grade(tests=tests, output=output, infra_error=failure)


def _grade(term) -> Grade:
    """grade, before the check that the container was not lost meanwhile."""
    t = term.task
    if term.dead:  # the agent broke its own container: a failed episode, not an infrastructure error
        return Grade(reward=0.0, output=f"[the terminal is dead: {term.dead}]",
                     tampered=term.agent_stopped() or f"the agent made its container unusable: {term.dead}")
    exports = _agent_exports(term) if t.tests_in_agent_shell else {}
    evidence, running = ([], False) if t.keep_agent_processes else stop_agent(term)
    box = None
    with _paused(term, running):  # what keeps running changes no file between the check and the commit
        path_dirs = tuple(d.rstrip("/") + "/" for d in exports.get("PATH", "").split(":")
                          if d.startswith("/"))
        diff = changes(term.client.api, term.id, term.layers, term.local)
        evidence += toolchain_changes(diff, t, term.home, _BIN_DIRS + path_dirs)
        if evidence:
            return Grade(reward=0.0, tampered="; ".join(evidence)[:4000])
        if running:
            box = GradingBox(term)
    try:
        g, harness_failed = verify(term, exports, diff, box)
    finally:
        if box:
            box.close()
    if harness_failed:
        return blame(term, g.infra_error, g)
    return g


@contextlib.contextmanager
def _paused(term, pause: bool):
    """The container frozen (docker pause) while the block runs, when pause."""
    import docker  # imported here so rollout (and config.rollout_cfg) import without the docker SDK
    if pause:
        term.client.api.pause(term.id)
    try:
        yield
    finally:
        if pause:
            with contextlib.suppress(docker.errors.APIError):  # a container that stopped meanwhile
                term.client.api.unpause(term.id)


class GradingBox:
    """The container the tests run in while the agent's services keep running in its own: a commit of
    the agent's container (frozen, after the toolchain check) started with the same limits and with the
    agent container's network namespace, so the tests reach the services on localhost, and nothing left
    running can see or write the tests, their runner or the reward file (a separate mount and pid
    namespace; tests/test_tampering.py::test_a_service_left_running_cannot_touch_the_grading).
    `sleep` keeps it up: a replaced `sleep` is a change to the harness's programs."""

    def __init__(self, term):
        api, self.client, self.task = term.client.api, term.client, term.task
        info = api.inspect_container(term.id)
        labels = {**owner_labels(), f"{LABEL}.grading": "1"}
        self.image = api.commit(term.id, conf={"Labels": labels}, pause=False)["Id"]
        try:
            hc = {k: v for k, v in info["HostConfig"].items() if k not in _NOT_SHARED}
            hc["NetworkMode"] = f"container:{term.id}"
            self.id = api.create_container(self.image, entrypoint=["sleep", "infinity"], command=[],
                                           labels=labels, working_dir=info["Config"].get("WorkingDir") or "/",
                                           host_config=hc)["Id"]
        except Exception:
            with contextlib.suppress(Exception):
                api.remove_image(self.image, force=True)
            raise
        register(self.client, self.id)
        api.start(self.id)
        pid = api.inspect_container(self.id)["State"]["Pid"]
        self.local = term.local and names_container(pid, self.id)
        self.host_pid, self.cgroup = pid, cgroup_dirs(pid, self.id) if self.local else {}

    def exec(self, cmd: str, timeout: float = 60, workdir: str | None = None, env: dict | None = None):
        """Run a command in a fresh process of the box: (exit code, output), its deadline kept from
        outside as Terminal.exec keeps it (test_hostile.test_exec_and_grade_*)."""
        return bash_exec(self.client, self.id, cmd, timeout,
                         workdir or (self.task.workdir if self.task else "/"), env, self.cgroup,
                         self.host_pid if self.local else None)

    def close(self):
        remove(self.client, self.id)
        with contextlib.suppress(Exception):
            self.client.api.remove_image(self.image, force=True)


# What a container in another's network namespace may not set (the daemon refuses them).
_NOT_SHARED = {"NetworkMode", "PortBindings", "PublishAllPorts", "Links", "Dns", "DnsOptions", "DnsSearch",
               "ExtraHosts"}


def verify(term, exports: dict | None = None, diff: list | None = None, box=None) -> tuple[Grade, bool]:
    """Clean /tests and /logs/verifier, remove the bytecode the episode left (diff: its changes), copy
    the tests in, run them, in term's container or in the GradingBox beside it: (grade, the harness
    failed). A Docker error or a runner it could not fetch is a harness failure (infra_error says
    which), for blame to judge after an episode and for Env.harness_runs on a fresh container."""
    t = term.task
    env, diff = {**(exports or {}), **verifier_env(t)}, diff or []
    stale = stale_bytecode(diff)
    try:
        box = box or term
        _join_grading_network(term)
        # Start from a clean /tests: nothing the agent left there or in the verifier's output counts.
        # On this machine, when neither exists, the host makes them and writes the tests (no program of
        # the container runs); else rm and mkdir, in the checked toolchain (_HARNESS_PROGRAMS), clean
        # and the tests go in through the Docker API. The reward comes out the same two ways.
        if not (box.local and not stale and _put_tests_from_host(box, t.tests)):
            box.exec("rm -rf /tests /logs/verifier && mkdir -p /tests /logs/verifier /logs/agent", 30,
                     workdir="/")
            for i in range(0, len(stale), 500):  # argv stays far below the kernel's 2 MiB
                box.exec("rm -f -- " + " ".join(shlex.quote(p) for p in stale[i:i + 500]), 30, workdir="/")
            if not box.client.api.put_archive(box.id, "/tests", _tar(t.tests)):
                raise InfraError("could not copy the tests into the container")
        watch = ReadWatch(box.host_pid) if term.trace_reads and box.local else contextlib.nullcontext()
        with watch:
            code, out = box.exec(t.test_command, t.test_timeout_s, env=env)
        rc, text = (_read_reward(box) if t.layout == "tb2" else (None, ""))
    except Exception as e:
        return Grade(infra_error=f"grading failed: {type(e).__name__}: {e}"), True
    g, harness_failed = _score(term, code, out, rc, text)
    # what the tests read of the image and the episode left as the image had it
    changed = {p for p, _ in diff}
    g.image_reads = sorted(p for p in getattr(watch, "opened", ()) if p not in changed and
                           any(os.path.lexists(lower + p) for lower in term.layers[1]))
    offline = _NO_NETWORK.search(out)
    if offline and not g.tests and not (g.reward or 0) > 0:  # no test ran: the runner could not be fetched
        net = term.grading_network
        return Grade(tests=g.tests, output=g.output,
                     infra_error="the test harness could not install itself: no network "
                     f"({offline.group().strip()[:120]}); grading joins env.grading_network ({net}) for "
                     "tasks whose tests_need_network"), True
    return g, harness_failed


def _score(term, code: int, out: str, rc: int | None, text: str) -> tuple[Grade, bool]:
    """The grade of a test run's exit code, output and (TB2) reward file: (grade, the harness failed)."""
    t = term.task
    cap = Capped(OUTPUT_CAP * 4)
    cap.add(out.encode())
    tests = {m.group(2): m.group(1) for m in re.finditer(
        r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\s+(\S+)", out, re.M)}
    timed_out = code in (124, 137)  # the tests hung on the state the agent left: a failure
    output = cap.text() + ("\n[tests timed out]" if timed_out else "")
    if t.layout != "tb2":
        if code in (126, 127) or (code in (3, 4, 5) and not tests):  # harness missing / pytest usage error
            return Grade(tests=tests, output=output,
                         infra_error=f"test harness failed to run (exit code {code})"), True
        return Grade(reward=1.0 if code == 0 else 0.0, passed=code == 0, tests=tests, output=output), False
    if rc != 0:
        if timed_out:
            return Grade(reward=0.0, tests=tests, output=output), False
        return Grade(tests=tests, output=output,
                     infra_error="test harness wrote no /logs/verifier/reward.txt "
                                 f"(tests exit code {code})"), True
    path, _, body = text.partition("\n")
    try:
        rewards = json.loads(body) if path.endswith(".json") else {"reward": float(body.strip())}
        reward = scalar_reward(rewards, term.multi_reward)
    except (ValueError, TypeError, AttributeError) as e:
        return Grade(tests=tests, output=output, infra_error=f"{path}: {e}: {body[:100]!r}"), True
    return Grade(reward=reward, passed=reward >= 1.0, tests=tests, output=output, rewards=rewards), False


def _put_tests_from_host(box, tests: dict) -> bool:
    """/tests with the tests, an empty /logs/verifier and /logs/agent, written from the host into the
    root of a container on this machine (inspection.write_new_dir); False when /tests or /logs/verifier
    exists already (what is left of them the clean step removes) or the host cannot write there."""
    root = f"/proc/{box.host_pid}/root"
    return (write_new_dir(root, "/tests", tests) and write_new_dir(root, "/logs/verifier", {}) and
            write_new_dir(root, "/logs/agent", {}, exist_ok=True))


def _read_reward(box) -> tuple[int, str]:
    """(0, "path\\ncontent") of the first reward file the runner left, read once it exited from the
    host (a regular file of the container's root: inspection.read_in_root) or through the Docker API;
    (3, "") when there is none. reward.json wins over reward.txt, as in Harbor."""
    import docker  # as in _paused
    for path in ("/logs/verifier/reward.json", "/logs/verifier/reward.txt"):
        if box.local:
            root = f"/proc/{box.host_pid}/root"
            if (body := read_in_root(root, path, REWARD_MAX)) is not None:
                return 0, f"{path}\n{body.decode('utf-8', 'replace')}"
            if not exists_in_root(root, path):
                continue
        try:
            stream, stat = box.client.api.get_archive(box.id, path)
        except docker.errors.APIError:  # no such file, or a path through a file (/logs replaced by one)
            continue
        data = b""
        for chunk in stream:  # a directory or a huge file named reward.*: read no more than a reward's worth
            data += chunk
            if len(data) > REWARD_MAX + (64 << 10):
                return 0, f"{path}\n[more than {REWARD_MAX} bytes]"
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            member = tar.next()
            f = tar.extractfile(member) if member is not None and member.isfile() else None
            body = f.read(REWARD_MAX).decode("utf-8", "replace") if f else "[not a regular file]"
        return 0, f"{path}\n{body}"
    return 3, ""


def _join_grading_network(term):
    """Give the container the grading network, once the agent's processes are gone, when the
    task's tests fetch their runner and the container has no network yet."""
    net = term.grading_network
    if not term.task.tests_need_network or net == "none" or term.network != "none" or term.networked:
        return
    term.client.api.disconnect_container_from_network(term.id, "none")
    term.client.api.connect_container_to_network(term.id, net)
    term.networked = True


def _agent_exports(term) -> dict:
    """The variables the agent's shell exported (TB1 run_tests_in_same_shell), without those that
    would load code into the verifier."""
    r = term.run("export -p", timeout=10)
    out = {}
    for m in re.finditer(r'^declare -x ([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"$', r.output, re.M):
        name, value = m.group(1), re.sub(r"\\(.)", r"\1", m.group(2))
        if not re.match(r"LD_|PYTHON|PYTEST|BASH_ENV$|ENV$|BASH_FUNC|TEST_DIR$|PS4$|SHELLOPTS$", name):
            out[name] = value
    return out


def stop_agent(term) -> tuple[list[str], bool]:
    """SIGKILL every process in the container but init, the `sleep` that keeps it up, what the image's
    ENTRYPOINT started and the services the agent left (processes with a listening socket, and their
    children): (evidence for each process that names the tests or the verifier's output, whether any
    process is left running, so the tests run in a GradingBox). With VOLUMEs (not in a commit) or a
    daemon on another machine the agent's services are stopped too (tests/test_tampering.py)."""
    procs = term.procs()
    if procs is None:  # a daemon on another machine: kill from inside, with the container's tools
        term.exec(KILL_INSIDE, 30, workdir="/", env={"TERMRL_FLOOR": str(term.floor),
                                                     "TERMRL_SHELL": str(term.shell_pid)})
        return [], False
    sleeper = first_child(term.host_pid, procs)
    if sleeper is None:  # the container is stopping: nothing to grade in
        return ["the process that keeps the container up was killed during the episode"], False
    image = _image_processes(term, procs)
    keep = {term.host_pid, sleeper} | image
    stopped: dict[int, str] = {}
    for _ in range(1000):  # SIGSTOP until no new process appears: a stopped process cannot fork
        new = [h for h in procs if h not in keep and h not in stopped]
        if not new:
            break
        for h in new:
            stopped[h] = describe(h)
            with contextlib.suppress(OSError):
                os.kill(h, signal.SIGSTOP)
        procs = term.procs() or {}
    served = services(term.host_pid, stopped) if not term.volumes else set()
    for h in stopped:
        with contextlib.suppress(OSError):
            os.kill(h, signal.SIGCONT if h in served else signal.SIGKILL)
    deadline = time.monotonic() + 10
    while left := [h for h in (term.procs() or {}) if h in stopped and h not in served and not zombie(h)]:
        if time.monotonic() > deadline:
            raise InfraError(f"processes {left} of the agent survived SIGKILL")
        time.sleep(0.005)
    evidence = [f"a process the agent left running refers to {m.group()}: {text[:200]!r}"
                for text in stopped.values() if (m := _VERIFIER_PATHS.search(text))]
    return evidence, bool(served or image - {term.host_pid, sleeper})


def _image_processes(term, procs: dict) -> set:
    """Host pids of what the image's ENTRYPOINT started before the agent's shell: container pids at
    or below the terminal's floor that are older than the shell (a pid recycled after a wrap is not)."""
    def born(h):
        with contextlib.suppress(OSError, IndexError, ValueError):
            return int(proc_stat(h)[19])
    shell = next((h for h, n in procs.items() if n == term.shell_pid), None)
    limit = born(shell) if shell else None
    if limit is None:
        return set()
    return {h for h, n in procs.items() if n <= term.floor and (born(h) or 1 << 62) <= limit}


@dataclass
class Outcome:
    """How an episode ended once the environment had its say (settle); rollout.run_episode writes it
    into the Trajectory."""
    # None: the episode's own finish stands; else sandbox_lost | container_stopped | env_error
    finish_reason: str | None
    # False: the environment failed, not the agent; the row is masked out of training
    valid: bool
    reward: float              # NaN when not valid
    grade: dict | None         # the grade record (None: nothing was graded)
    error: str | None = None   # what failed, for a row that is not valid
    grade_s: float | None = None  # how long grading took, when it ran


def settle(term, error: Exception | None = None) -> Outcome:
    """Grade the episode, or, when an InfraError ended it (error, or a grade with infra_error), decide
    whose failure it was. A container lost to the infrastructure (HostDown, or term.lost(): its Docker
    host stopped answering, or Docker stopped it) is "sandbox_lost", which rollout.collect runs again
    elsewhere; a container the agent stopped is the agent's failure ("container_stopped", reward 0);
    anything else is "env_error", masked out of training (tests/test_hosts.py, tests/test_tampering.py)."""
    record = grade_s = None
    if error is None:
        t0 = time.monotonic()
        g = grade(term)
        grade_s = time.monotonic() - t0
        record = g.record()
        if not g.infra_error:
            return Outcome(finish_reason=None, valid=True, reward=float(g.reward), grade=record,
                           grade_s=grade_s)
        error = InfraError(g.infra_error)
    if isinstance(error, HostDown) or (term is not None and term.lost()):
        return Outcome(finish_reason="sandbox_lost", valid=False, reward=float("nan"), grade=record,
                       error=str(error), grade_s=grade_s)
    if term is not None and (why := term.agent_stopped()):
        return Outcome(finish_reason="container_stopped", valid=True, reward=0.0,
                       grade=Grade(reward=0.0, output=str(error), tampered=why).record(), grade_s=grade_s)
    return Outcome(finish_reason="env_error", valid=False, reward=float("nan"), grade=record,
                   error=str(error), grade_s=grade_s)


def verifier_env(task: Task) -> dict:
    """Environment of the test run. The rest comes from the image's config, which the agent cannot
    change (its `export`s live in its own shell): PATH, PYTHONPATH, HOME. Python's user site is off,
    pytest reads no conftest or ini file above /tests, only the task's own, loads no plugin through an
    entry point but those the task names in pytest_plugins, and Python puts neither the working
    directory nor a script's directory on sys.path unless the task's tests_import_agent_code
    (tests/test_tampering.py)."""
    ini = next((f"/tests/{n}" for n in RUNNER_CONFIGS if n in task.tests), "/dev/null")
    plugins = "".join(f" -p {p}" for p in task.pytest_plugins)
    env = {"TEST_DIR": "/tests", "PYTHONNOUSERSITE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
           "PYTEST_ADDOPTS": f"-p no:cacheprovider --rootdir=/tests --confcutdir=/tests -c {ini}{plugins}"}
    return env if task.tests_import_agent_code else {**env, "PYTHONSAFEPATH": "1"}


def scalar_reward(rewards: dict, multi: str = "mean") -> float:
    """The reward of a Harbor reward.json. Harbor keeps every key and its metrics expect one (or a key
    named "reward", which its rewardkit writes as the aggregate); several keys and no "reward" are
    reduced by `multi`: "mean", "min" (every criterion must hold) or "error"."""
    if not isinstance(rewards, dict) or not rewards:
        raise ValueError("expected a JSON object of numbers")
    values = {k: float(v) for k, v in rewards.items()}
    if "reward" in values or len(values) == 1:
        return values.get("reward", next(iter(values.values())))
    if multi == "mean":
        return sum(values.values()) / len(values)
    if multi == "min":
        return min(values.values())
    raise ValueError(f"several rewards {sorted(values)} and no 'reward' key; "
                     "set env.multi_reward to mean or min")


def _script_words(task: Task) -> tuple[set, set]:
    """(words, sourced absolute paths) of the task's test command and shell scripts in its tests."""
    text = task.test_command + "\n" + "\n".join(
        v.decode("utf-8", "replace") for k, v in task.tests.items() if k.endswith(".sh"))
    words = set(re.findall(r"[A-Za-z0-9_.+-]+", text))
    sourced = {p for p in re.findall(r"(?:^|[;&|({\s])(?:source|\.)\s+[\"']?([^\s\"';&|)]+)", text)}
    return words, sourced


def toolchain_changes(changes, task: Task, home: str = "/root", bin_dirs=_BIN_DIRS) -> list[str]:
    """Evidence that the container's changes against its image reach the verifier's toolchain: the
    harness's programs on PATH, Python's startup hooks and the test runner's package, the dynamic
    loader's config, runner config above /tests, files the test scripts source. A task lists the
    globs its legitimate solution must change in verifier_changes_ok."""
    words, sourced = _script_words(task)
    programs = _HARNESS_PROGRAMS | words
    bin_dirs = tuple(bin_dirs) + (f"{home}/.local/bin/",)  # where TB1's uv setup installs uv
    sourced = {re.sub(r"^(\$HOME|\$\{HOME\}|~)(?=/)", home, p) for p in sourced}
    kinds = {"A": "added", "C": "changed", "D": "deleted"}
    out = []
    for path, kind in changes:
        if path.startswith(("/tests/", "/logs/", "/proc/", "/tmp/pytest-of-")) or \
                path in ("/tests", "/logs") or _pyc(path) or \
                any(fnmatch.fnmatch(path, g) for g in task.verifier_changes_ok):
            continue  # bytecode: verify removes it before the tests run
        parts, name = path.split("/"), path.rsplit("/", 1)[-1]
        why = None
        if path.startswith("/etc/ld.so.preload") or path.startswith("/etc/ld.so.conf"):
            why = "the dynamic loader's config"
        elif path[:len(path) - len(name)] in bin_dirs and (name in programs
                                                           or re.fullmatch(r"python\d[\d.]*", name)):
            why = "a program the test harness runs"
        elif name in ("sitecustomize.py", "usercustomize.py") or (name.endswith(".pth") and "python" in path):
            why = "a Python startup hook"
        elif _RUNNER_PACKAGES & set(parts) or _RUNNER_DEPS.search(path) or \
                re.search(r"/(pytest|pluggy)-[^/]*\.dist-info(/|$)", path):
            why = "the test runner's package"
        elif re.match(r"/usr/(local/)?lib/python3\.\d+/(?!(dist|site)-packages/)", path):
            why = "Python's standard library"
        elif name == "pyvenv.cfg":
            why = "the interpreter's home (pyvenv.cfg)"
        elif kind != "A" and re.match(r"/(usr/)?lib(64|/x86_64-linux-gnu|/aarch64-linux-gnu)?/[^/]*\.so"
                                      r"[.\d]*$", path):
            why = "a shared library"
        elif re.match(r"/(usr/(local/)?)?lib", path) and _CLOSURE_LIBS.fullmatch(name):
            why = "a library the shell or the interpreter loads"
        elif len(parts) == 2 and name in RUNNER_CONFIGS + ("conftest.py",):
            why = "test runner config above /tests"
        elif name in _INSTALLER_CONFIGS:
            why = "an installer's config, read by a harness that installs its runner"
        elif path in sourced:
            why = "a file the test script sources"
        if why:
            out.append(f"{kinds[kind]} {path} ({why})")
    return out



def _pyc(path: str) -> bool:
    """Compiled bytecode, which verify removes before the tests run (Python recompiles it from the
    checked source), so a planted .pyc never runs."""
    return path.endswith(".pyc") and "/__pycache__/" in path


def stale_bytecode(changes) -> list[str]:
    """The .pyc files that the episode added or changed."""
    return [p for p, kind in changes if kind != "D" and _pyc(p)]


def _tar(files: dict) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o755 if name.endswith(".sh") else 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
