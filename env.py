"""env.py — the terminals termrl's agents live in.

One Docker container per episode (the tasks come from task_folders.py and generated_tasks.py) with a persistent bash session,
hidden tests copied in only after the episode, rewards, a warm pool of pre-started containers, and cleanup of every container we start.

    python env.py validate tasks/ [--k 3] [--json out.json]   # curation: oracle passes, no-op fails
    python env.py shell tasks/<name>                          # a human shell in a task's container
"""
from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import fnmatch
import hashlib
import io
import json
import os
import re
import select
import shlex
import signal
import socket
import stat
import struct
import sys
import tarfile
import threading
import time
import weakref
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from hosts import CHECK_EVERY_S, PROBE_TIMEOUT_S, Host, HostPool, HostsDown, connect, parse_host
from task_folders import Task, TaskError, load_task, oracle_commands, task_dirs
from generated_tasks import generate_easy_tasks, generate_multistep_tasks

LABEL = "termrl"  # every container and image we create carries this label
# A root shell working on its own files needs these; everything else (mount, ptrace, raw net...) stays dropped.
CAPS = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETUID", "SETGID", "NET_BIND_SERVICE"]
OUTPUT_CAP = 16384          # bytes of command output the agent sees (half head, half tail)
FLOOD_LIMIT = 32 << 20      # a command that streams more than this is killed like a timed-out one
INLINE_TESTS_MAX = 48 << 10  # tests up to this tar size go in on the grading command line (argv <= 128 KiB)
_NOT_INSTALLED = "__termrl_tests_not_installed__"
FILE_SIZE_LIMIT = 1 << 30   # RLIMIT_FSIZE in containers: one runaway `yes > f` cannot fill the host disk
CONTAINER_CALL_TIMEOUT_S = 60  # the Docker client's timeout for calls about one container (not builds)
DISK_CHECK_S = 0.5          # the disk watchdog's period, where the storage driver has no quota (README "Disk cap")
SESSION_ENV = {"PAGER": "cat", "GIT_PAGER": "cat", "DEBIAN_FRONTEND": "noninteractive", "TERM": "dumb"}


class InfraError(RuntimeError):
    """Docker daemon / image build / container start / test harness failure (not the agent's fault)."""


class BuildError(InfraError):
    """The task's own Dockerfile failed to build: a defect of the task (validate says so), no episode runs."""


class HostDown(InfraError):
    """The episode's Docker host stopped answering and was drained: neither the agent's fault nor the
    task's, so rollout.collect runs the episode again elsewhere (tests/test_hosts.py)."""


# --- Container bookkeeping: labels, the registry of live containers, cleanup on every kind of exit ---

def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def _proc_start(pid: int) -> str:
    """Start time of a process (so a recycled pid is not mistaken for its dead owner)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return "unknown"


def _owner_labels() -> dict:
    return {LABEL: "1", f"{LABEL}.pid": str(os.getpid()), f"{LABEL}.pidstart": _proc_start(os.getpid()),
            f"{LABEL}.host": socket.gethostname(), f"{LABEL}.boot": _boot_id(), f"{LABEL}.pidns": _pid_namespace()}


def _is_stale(labels: dict) -> bool:
    """A container is stale when the process that created it (on this machine) no longer exists."""
    if labels.get(f"{LABEL}.host") != socket.gethostname():
        return False  # another machine shares this daemon; its containers are not ours to judge
    if labels.get(f"{LABEL}.pidns", _pid_namespace()) != _pid_namespace():
        # a container beside us with the host's name (host networking), e.g. another node's trainer:
        # its pids are not ours to look up (tests/test_env.py::test_sweep_spares_live_containers_of_another_pid_namespace)
        return False
    if labels.get(f"{LABEL}.boot") != _boot_id():
        return True
    try:
        pid = int(labels.get(f"{LABEL}.pid", ""))
        os.kill(pid, 0)
    except (ValueError, ProcessLookupError):
        return True
    except PermissionError:
        pass
    return _proc_start(pid) != labels.get(f"{LABEL}.pidstart")


_LIVE: dict[str, object] = {}   # container id -> docker client, for every container this process started
_LIVE_LOCK = threading.RLock()  # re-entrant: a signal may land while this thread holds it
_PREV_HANDLERS: dict = {}       # signal -> the handler ours replaced (called after cleanup)
_SHUTDOWN = threading.Event()   # set by SIGINT/SIGTERM: no container starts after it
_ATEXIT_DONE = False


def _remove(client, cid: str):
    with contextlib.suppress(Exception):  # already gone, or the daemon is down: nothing more we can do
        client.api.remove_container(cid, force=True)
    with _LIVE_LOCK:
        _LIVE.pop(cid, None)


def cleanup_all():
    """Remove every container this process started (atexit and signal handlers call this)."""
    with _LIVE_LOCK:
        items = list(_LIVE.items())
    for cid, client in items:
        _remove(client, cid)


def _on_signal(signum, frame):
    prev = _PREV_HANDLERS.get(signum)
    if prev == signal.SIG_IGN:
        return
    _SHUTDOWN.set()
    cleanup_all()
    if callable(prev):
        prev(signum, frame)
    elif signum == signal.SIGINT:
        raise KeyboardInterrupt
    else:
        sys.exit(128 + signum)


def _install_cleanup():
    global _ATEXIT_DONE
    if not _ATEXIT_DONE:
        _ATEXIT_DONE = bool(atexit.register(cleanup_all))
    if _PREV_HANDLERS or threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be installed from the main thread
    for s in (signal.SIGINT, signal.SIGTERM):
        _PREV_HANDLERS[s] = signal.getsignal(s)
        signal.signal(s, _on_signal)


def sweep_stale(client) -> int:
    """Remove termrl containers whose creating process is gone (e.g. a run killed with SIGKILL)."""
    n = 0
    for c in client.api.containers(all=True, filters={"label": LABEL}):
        if _is_stale(c.get("Labels") or {}):
            _remove(client, c["Id"])
            n += 1
    return n


# --- The terminal: one container, one persistent bash session attached over the docker socket ----

@dataclass
class CommandResult:
    output: str
    exit_code: int | None
    timed_out: bool
    duration_s: float
    truncated: bool
    shell_restarted: bool = False  # the agent's shell was replaced during this command (its variables and cwd are gone)


@dataclass
class Grade:
    reward: float | None
    passed: bool
    tests: dict
    output: str
    infra_error: str | None
    rewards: dict = field(default_factory=dict)  # every key of a TB2 reward.json (reward.txt: {"reward": x})
    tampered: str | None = None  # evidence that the episode tampered with grading (reward is then 0)


class _Capped:
    """Keeps the head and the tail of a byte stream, counting what it drops in between."""

    def __init__(self, cap: int):
        self.half, self.head, self.tail, self.dropped, self.total = cap // 2, bytearray(), bytearray(), 0, 0

    def add(self, b: bytes):
        self.total += len(b)
        if len(self.head) < self.half:
            n = self.half - len(self.head)
            self.head += b[:n]
            b = b[n:]
        self.tail += b
        if len(self.tail) > 2 * self.half:
            cut = len(self.tail) - self.half
            del self.tail[:cut]
            self.dropped += cut

    @property
    def omitted(self) -> int:
        return self.dropped + max(0, len(self.tail) - self.half)

    def text(self) -> str:
        n = self.omitted
        mid = f"\n[... {n} bytes of output omitted ...]\n" if n else ""
        tail = self.tail[n - self.dropped:]
        return self.head.decode("utf-8", "replace") + mid + tail.decode("utf-8", "replace")


# Runs once in every session. Commands run inside a function so that a USR1 trap can abort the
# whole command (loops included) after its processes are killed; `declare` is made global there
# so `declare -A x` persists as it would at a prompt. $? is carried over between commands.
# __termrl_out is where the harness's markers go (an agent's `exec >file` keeps the framing) and
# __termrl_in the commands' stdin: an empty pipe, so no path the agent can delete (/dev/null) is
# needed; without /dev/fd stdin is closed instead.
_PRELUDE = r"""exec 2>&1
declare() { if [ "${FUNCNAME[1]}" = __termrl_run ]; then builtin declare -g "$@"; else builtin declare "$@"; fi; }
typeset() { if [ "${FUNCNAME[1]}" = __termrl_run ]; then builtin typeset -g "$@"; else builtin typeset "$@"; fi; }
trap 'return 130 2>&-' USR1
exec {__termrl_out}>&1
{ exec {__termrl_in}< <(:); } 2>&- || __termrl_in=-
"""
KILL_GRACE_S = 0.5      # after a timeout: how long the shell gets to end the killed command before a restart
TIMEOUT_MARGIN_S = 2.5  # run(timeout=t) returns within t + this (grace + restart on a busy machine); test_hostile checks it
MARK = "\x1e"           # framing markers start with this byte (then B/E/S, the command's nonce, a number)
FORGERY_FORMATS = ["\\n\\036E{} 0\\n", "\\036B{} 1\\n"]  # the marker formats, for test_hostile's forgeries


def _command_line(cmd: str, nonce: str) -> str:
    """One command framed by a begin and an end marker carrying a fresh nonce.

    The nonce is new for every command and only ever printed split in two, so neither a trace
    (`set -x`, a DEBUG trap) nor an earlier command shows a marker an agent could replay. Before the
    end marker is printed, functions named `builtin` are removed in POSIX mode (where `unset` and
    `trap` are special builtins no function can shadow) and DEBUG/RETURN traps are cleared; every
    name the harness calls is `\\`-quoted so no alias applies. test_hostile.test_framing_* forges it."""
    a, b = nonce[:len(nonce) // 2], nonce[len(nonce) // 2:]
    return (f"\\builtin read -r __t __t __t __t __termrl_wm </proc/loadavg; "
            f"\\builtin printf '\\036B%s%s %s\\n' {a} {b} \"$__termrl_wm\" >&$__termrl_out; "
            "__termrl_rc() { return \"$1\"; }; __termrl_run() { __termrl_rc \"${__termrl_last:-0}\"; eval \"$1\"; }; "
            f"__termrl_run {shlex.quote(cmd)} <&$__termrl_in; "
            "{ __termrl_last=$?; POSIXLY_CORRECT=y; \\unset -f builtin; \\unset POSIXLY_CORRECT; \\trap - DEBUG RETURN; "
            f"\\builtin printf '\\n\\036E%s%s %d\\n' {a} {b} \"$__termrl_last\" >&$__termrl_out; }} 2>&-\n")


class Terminal:
    """One container plus one persistent bash session; `run` commands, then `grade` the episode.

    Use one terminal from one thread at a time. run() raises InfraError only when the container
    itself is gone; everything the agent can cause (timeouts, floods, `exit`) comes back as output.
    When the agent made the container unusable (no bash left to start, disk cap exceeded) `dead`
    says why: run() answers with that notice, and the episode should end (graded as a failure).

    Background jobs keep running between commands (servers, builds), within the container's CPU,
    memory, pid and disk limits. Their terminal output is not a later command's: when a command
    ends with jobs still holding the terminal, the shell moves to a fresh output pipe and the old
    one is no longer read (a job writing more than the pipe holds then blocks, as under Ctrl-S).
    A command that ends with the container at its pid limit (a fork bomb) ends every background job."""

    def __init__(self, client, container_id: str, key: tuple, output_cap: int = OUTPUT_CAP, host: Host | None = None):
        self.client, self.id, self.key, self.output_cap = client, container_id, key, output_cap
        self.host, self._epoch = host, host.epoch if host else 0  # a drain after this start loses the container
        self.task: Task | None = None
        self.closed = False
        self.dead: str | None = None
        self._restarts = 0  # shells started after the first (CommandResult.shell_restarted)
        self.disk_cap_mb = 0  # set by Env when the watchdog (not a storage quota) keeps the disk cap
        info = client.api.inspect_container(container_id)
        self._host_pid = info["State"]["Pid"]
        # Host-side work (/proc, cgroups, signals, the overlay dirs) only when State.Pid is this container's
        # init on THIS machine: a daemon elsewhere reports a pid of its machine, which here is an unrelated
        # process. Else the Docker API's slower ways (docs/grading-integrity.md; tests/test_hosts.py).
        self.local = (host is None or host.host_side) and _names_container(self._host_pid, container_id)
        self._cgroup = _cgroup_dirs(self._host_pid, container_id) if self.local else {}
        self._pids_max = _cgroup_read(self._cgroup, "pids", "pids.max")
        self._pids_hits = self._pid_limit_hits()
        self.env, self.multi_reward = None, "mean"  # set by Env: a fresh container to recheck a harness on
        self._networked = False  # joined the grading network
        layers = (info.get("GraphDriver") or {}).get("Data") or {}
        self._layers = (layers.get("UpperDir"), [d for d in (layers.get("LowerDir") or "").split(":") if d])
        self._home = next((v.split("=", 1)[1] for v in info["Config"].get("Env") or [] if v.startswith("HOME=")), "/root")
        self._socks = []  # every exec socket of this terminal (old output pipes stay open, unread)
        self._relays = set()  # container pids of the processes whose stdout is the shell's output pipe
        self._start_session()

    # -- session plumbing ----------------------------------------------------------------------
    def _start_session(self):
        if self.local:
            _repair_dev_null(self._host_pid)
        ex = self.client.api.exec_create(self.id, ["bash", "--noprofile", "--norc"], stdin=True, stdout=True,
                                         stderr=True, tty=False, environment=SESSION_ENV)
        self._exec_id = ex["Id"]
        self._sock = self._out = self.client.api.exec_start(self._exec_id, socket=True)._sock
        self._socks.append(self._sock)
        self._raw, self._pending = bytearray(), bytearray()
        nonce = os.urandom(8).hex()
        self._send(_PRELUDE + f"\\builtin printf '\\n\\036S%s %s\\n' {nonce} \"$$\"\n")
        found, pid = self._read_until(f"\n{MARK}S{nonce} ".encode(), time.monotonic() + 30, _Capped(4096))
        if not found:
            raise InfraError(f"container {self.id[:12]}: the bash session did not start")
        self._session_pid = int(pid)
        if not hasattr(self, "_floor"):
            self._floor = self._session_pid - 1  # pids up to here are init and its `sleep`
        procs = self._procs() or {}
        shell = next((h for h, n in procs.items() if n == self._session_pid), None)
        self._out_pipe = _readlink(f"/proc/{shell}/fd/1") if shell else None
        # host pids known not to write to the terminal: init, its sleep, the shell
        self._quiet = {h for h, n in procs.items() if n <= self._floor or n == self._session_pid}

    def _send(self, text: str):
        self._sock.sendall(text.encode())

    def _frames(self, deadline: float) -> bytes | None:
        """Payload of the next docker stream frames; b"" when the session ended, None on timeout."""
        data = _next_frame(self._out, self._raw, deadline)
        return data

    def _read_until(self, marker: bytes, deadline: float, sink: _Capped, flood: int = 0):
        """Stream into sink until `marker<digits>\\n`; returns (found, digits | reason)."""
        window = bytes(self._pending)
        self._pending = bytearray()
        keep = len(marker) + 24
        while True:
            i = window.find(marker)
            if i >= 0:
                j = window.find(b"\n", i + len(marker))
                if j >= 0:
                    sink.add(window[:i])
                    self._pending += window[j + 1:]
                    return True, window[i + len(marker):j].decode()
            elif len(window) > keep:
                sink.add(window[:-keep])
                window = window[-keep:]
            if flood and sink.total > flood:
                self._pending += window
                return False, "flood"
            data = self._frames(deadline)
            if data is None:
                self._pending += window
                return False, "timeout"
            if data == b"":
                sink.add(window)
                return False, "eof"
            window += data

    def _procs(self) -> dict | None:
        return _container_procs(self._host_pid, self._cgroup) if self.local else None

    def _kill_command(self, watermark: int, shell_too: bool = False) -> bool:
        """Kill every process the current command started (pids above the watermark); the shell gets
        USR1 (ends the command) or, with shell_too, SIGKILL. True when nothing above it is left."""
        api = self.client.api
        host = self._procs()
        if host is not None:  # local daemon: freeze the container so nothing forks while we kill
            with contextlib.suppress(Exception):
                self._check_host()  # no call to a drained daemon: it may hang until the client's timeout
                api.pause_container(self.id)
            try:
                for hpid, nspid in (self._procs() or {}).items():
                    with contextlib.suppress(OSError):
                        if nspid == self._session_pid and not shell_too:
                            os.kill(hpid, signal.SIGUSR1)
                        elif nspid > watermark and (shell_too or nspid not in self._relays):
                            os.kill(hpid, signal.SIGKILL)
            finally:
                with contextlib.suppress(Exception):
                    self._check_host()
                    api.unpause_container(self.id)
            if not shell_too:
                return True
            end = time.monotonic() + 5  # SIGKILLed processes vanish once the kernel reaps them
            while time.monotonic() < end:
                left = [n for n in (self._procs() or {}).values() if n > watermark]
                if not left:
                    return True
                time.sleep(0.02)
            return False
        sig = "-9" if shell_too else "-USR1"
        script = (f"kill {sig} {self._session_pid}; for p in /proc/[0-9]*; do p=${{p#/proc/}}; "
                  f"[ $p -gt {watermark} ] && [ $p != $$ ] && kill -9 $p; done 2>&-; true")
        with contextlib.suppress(Exception):
            _exec(self.client, self.id, ["sh", "-c", script], 10)
        return True

    def _alive(self) -> bool:
        if not self.host_ok():  # drained: no call that may hang
            return False
        with contextlib.suppress(Exception):
            return bool(self.client.api.inspect_container(self.id)["State"]["Running"])
        return False

    def _restart_session(self) -> bool:
        """Replace a dead or unrecoverable shell with a fresh one (state is lost, the container stays).
        Every process but init and its sleep is SIGKILLed first, the old shell included, and checked
        gone. False (and `dead` set) when the agent left the container unable to start a shell."""
        for s in self._socks:
            with contextlib.suppress(OSError):
                s.close()
        self._socks, self._relays = [], set()
        if self.dead:
            return False
        self._check_host()
        try:
            if not self._kill_command(self._floor, shell_too=True):
                raise InfraError(f"container {self.id[:12]}: processes survived SIGKILL")
            self._start_session()
            self._restarts += 1
            return True
        except Exception as e:
            if not self._alive():
                if isinstance(e, InfraError):
                    raise
                raise InfraError(f"container {self.id[:12]} is unusable: {type(e).__name__}: {e}") from None
            self.dead = "no new shell can start in this container (was bash or the filesystem deleted?)"
            return False

    def _dead_result(self, t0: float, out: str = "") -> CommandResult:
        return CommandResult(out + f"\n[the terminal is dead: {self.dead}; the episode is over]",
                             None, False, time.monotonic() - t0, False)

    # -- public API ----------------------------------------------------------------------------
    def run(self, cmd: str, timeout: float = 30) -> CommandResult:
        """Run one command in the persistent shell; on timeout kill the command, keep the shell.
        Returns within timeout + TIMEOUT_MARGIN_S."""
        if self.closed:
            raise InfraError("terminal is closed")
        self._check_host()
        t0 = time.monotonic()
        if self.dead:
            return self._dead_result(t0)
        first = self._end_fork_bomb()
        restarts = self._restarts
        note, sink = "", _Capped(self.output_cap)
        nonce = os.urandom(8).hex()
        try:
            self._send(_command_line(cmd, nonce))
        except OSError as e:
            if not self._restart_session():
                return self._dead_result(t0)
            return CommandResult(f"[the shell had died ({e}); a new shell was started, please retry]",
                                 None, False, time.monotonic() - t0, False, shell_restarted=True)
        deadline = t0 + timeout
        # what arrives before the begin marker is background output between commands: dropped
        found, wm = self._read_until(f"{MARK}B{nonce} ".encode(), deadline, _Capped(0))
        exit_code, timed_out = None, False
        if found:
            found, status = self._read_until(f"\n{MARK}E{nonce} ".encode(), deadline, sink, flood=FLOOD_LIMIT)
            if found:
                exit_code = int(status)
                note += self._detach_background()
            elif status == "eof":
                if self.dead or not self._restart_session():
                    return self._dead_result(t0, sink.text())
                note += "\n[the shell exited; a new shell was started in the working directory]"
            else:
                timed_out = True
                why = (f"timed out after {timeout:g}s" if status == "timeout"
                       else f"produced more than {FLOOD_LIMIT >> 20} MiB of output")
                note += self._recover(int(wm), why, sink, nonce)
        else:  # the shell never picked the command up
            timed_out = wm == "timeout"
            if self.dead or not self._restart_session():
                return self._dead_result(t0)
            note += (f"\n[the shell did not respond within {timeout:g}s" if timed_out else "\n[the shell exited") + \
                "; a new shell was started in the working directory]"
        if self.dead:
            return self._dead_result(t0, sink.text())
        return CommandResult(first + sink.text() + note, exit_code, timed_out, time.monotonic() - t0, bool(sink.omitted),
                             shell_restarted=self._restarts > restarts)

    def _recover(self, watermark: int, why: str, sink: _Capped, nonce: str) -> str:
        self._kill_command(watermark)
        found, _ = self._read_until(f"\n{MARK}E{nonce} ".encode(), time.monotonic() + KILL_GRACE_S, sink)
        if found:
            return f"\n[command {why} and was killed; the shell is still usable]"
        if not self._restart_session():
            return ""
        return f"\n[command {why} and was killed; the shell had to be restarted, so variables and cwd were reset]"

    def _end_fork_bomb(self) -> str:
        """When a fork failed at the container's pid limit since the last command (a fork bomb, most
        likely still running), end every background process: otherwise no command could fork."""
        hits = self._pid_limit_hits()
        if hits <= self._pids_hits:
            return ""
        self._kill_command(self._floor)  # the shell only gets USR1, which an idle shell ignores
        self._pids_hits = self._pid_limit_hits()
        return f"[the container reached its limit of {self._pids_max} processes: every background process was killed]\n"

    def _pid_limit_hits(self) -> int:
        """How often a fork in the container failed at its pid limit (the cgroup's pids.events)."""
        m = re.search(r"^max (\d+)", _cgroup_read(self._cgroup, "pids", "pids.events"), re.M)
        return int(m.group(1)) if m else 0

    def _detach_background(self) -> str:
        """Move the shell to a fresh output pipe when background jobs still hold the current one."""
        hpids = _cgroup_pids(self._cgroup)  # per command: one read of the cgroup, in the common case
        if not hpids or not self._out_pipe or not set(hpids) - self._quiet:
            return ""
        procs = self._procs() or {}
        holders = [h for h, n in procs.items() if n > self._floor and n != self._session_pid
                   and n not in self._relays and self._out_pipe in _fd_targets(h)]
        self._quiet |= set(procs) - set(holders)  # checked: not writing to the terminal
        if not holders:
            return ""
        shell = next((h for h, n in procs.items() if n == self._session_pid), None)
        try:
            ex = self.client.api.exec_create(self.id, ["bash", "--noprofile", "--norc", "-c",
                                                       "builtin printf '%s\\n' $$; builtin read -r _"],
                                             stdin=True, stdout=True, stderr=True, tty=False)
            sock = self.client.api.exec_start(ex["Id"], socket=True)._sock
            self._socks.append(sock)
            buf, data = bytearray(), b""
            end = time.monotonic() + 10
            while b"\n" not in data:
                chunk = _next_frame(sock, buf, end)
                if not chunk:
                    return ""
                data += chunk
            pid = int(data.split(b"\n")[0])
            self._relays.add(pid)
            self._quiet |= set(holders)  # they keep the old pipe: nothing to check again
            # the shell's fds that were the terminal follow it (stdout, stderr, an agent's saved copy);
            # a stdout the agent sent elsewhere (`exec >f`) stays there
            fds = os.listdir(f"/proc/{shell}/fd") if shell else []
            redirs = " ".join(f"{fd}>&$__termrl_out" for fd in sorted(fds, key=int)
                              if _readlink(f"/proc/{shell}/fd/{fd}") == self._out_pipe)
            nonce = os.urandom(8).hex()
            self._send(f"{{ exec {{__termrl_out}}>&- {{__termrl_out}}>/proc/{pid}/fd/1; }} 2>&-; exec {redirs}; "
                       f"\\builtin printf '\\n\\036S%s %s\\n' {nonce} 0 >&$__termrl_out\n")
            self._out, self._raw = sock, buf
            found, _ = self._read_until(f"\n{MARK}S{nonce} ".encode(), time.monotonic() + 10, _Capped(0))
            if not found:
                return ""
            host = next((h for h, n in (self._procs() or {}).items() if n == pid), None)
            self._out_pipe = _readlink(f"/proc/{host}/fd/1") if host else None
            self._quiet.add(host)
        except Exception:  # the old pipe stays in use: background output may then reach later commands
            return ""
        return ""

    def check_disk(self):
        """End the terminal (dead) when its writable layer is over disk_cap_mb."""
        upper = self._layers[0]
        if upper and self.local and os.path.isdir(upper):
            used = _dir_bytes(upper)
        else:  # a remote daemon: it measures the layer itself (slower)
            used = self.client.api.containers(all=True, size=True, filters={"id": self.id})[0].get("SizeRw", 0)
        if used > self.disk_cap_mb << 20:
            self.dead = f"the container's files grew past its disk cap of {self.disk_cap_mb} MiB"
            self._kill_command(self._floor, shell_too=True)

    def exec(self, cmd: str, timeout: float = 60, workdir: str | None = None, env: dict | None = None):
        """Run a command in a fresh process (not the agent's shell): (exit code, output). The deadline
        is kept from outside the container: at `timeout` the process tree is killed and the exit code
        is 124, whatever the container's `timeout` binary does (test_hostile.test_exec_and_grade_*)."""
        code, out = _exec(self.client, self.id, ["bash", "-c", cmd], timeout, env=env,
                          workdir=workdir or (self.task.workdir if self.task else "/"), cgroup=self._cgroup,
                          host_pid=self._host_pid if self.local else None, kill_inside=not self.local)
        return code, out.decode("utf-8", "replace")

    def grade(self) -> Grade:
        """Stop the agent, check the verifier's toolchain, copy the hidden tests in, run them, score.

        reward: 1/0 from the test exit code (TB1, generated) or reward.txt/json (TB2). An episode
        that tampered with grading gets reward 0 and `tampered` evidence; infra_error (reward None)
        only when Docker failed, the container was lost to the infrastructure (`lost`), or the
        harness fails on a fresh container too (tests/test_tampering.py, tests/test_hosts.py)."""
        if not self.host_ok():
            return Grade(None, False, {}, "", self.lost())
        g = self._grade()
        if (g.tampered or g.infra_error) and (why := self.lost()):
            return Grade(None, False, g.tests, g.output, why)
        return g

    def _grade(self) -> Grade:
        t = self.task
        if self.dead:  # the agent broke its own container: a failed episode, not an infrastructure error
            return Grade(0.0, False, {}, f"[the terminal is dead: {self.dead}]", None,
                         tampered=self.agent_stopped() or f"the agent made its container unusable: {self.dead}")
        try:
            exports = self._agent_exports() if t.tests_in_agent_shell else {}
            evidence = [] if t.keep_agent_processes else self._stop_agent()
            path_dirs = tuple(d.rstrip("/") + "/" for d in exports.get("PATH", "").split(":") if d.startswith("/"))
            evidence += toolchain_changes(self._changes(), t, self._home, _BIN_DIRS + path_dirs)
        except Exception as e:
            return self._failed(e)
        if evidence:
            return Grade(0.0, False, {}, "", None, tampered="; ".join(evidence)[:4000])
        g, harness_failed = self._verify(exports)
        if harness_failed and (why := self.agent_stopped()):
            return Grade(0.0, False, g.tests, g.output, None, tampered=why)
        if harness_failed and self.env is not None and self.env.harness_runs(t):
            return Grade(0.0, False, g.tests, g.output, None, rewards=g.rewards, tampered=(
                f"{g.infra_error} after the episode, but the harness runs on a fresh container"))
        return g

    def _verify(self, exports: dict | None = None) -> tuple[Grade, bool]:
        """Clean /tests and /logs/verifier, unpack the tests, run them: (grade, the harness failed)."""
        t = self.task
        env = {**(exports or {}), **verifier_env(t)}
        try:
            self._join_grading_network()
            rc, text = None, ""
            # Start from a clean /tests: nothing the agent left there or in the verifier's output counts.
            clean = "rm -rf /tests /logs/verifier && mkdir -p /tests /logs/verifier /logs/agent"
            tar, code = _tar(t.tests), None
            if len(tar) <= INLINE_TESTS_MAX:
                # one exec that cleans, unpacks and tests: each docker call costs ~80 ms of a small
                # machine's CPU, and a generated task's whole episode only ~0.6 s
                code, out = self.exec(
                    f"{{ {clean} && command -v base64 >/dev/null && command -v tar >/dev/null && "
                    f"printf %s {base64.b64encode(tar).decode()} | base64 -d | tar -x -C /tests; }} "
                    f"|| {{ echo {_NOT_INSTALLED}; exit 213; }}\n{t.test_command}",
                    t.test_timeout_s, env=env)
                if code == 213 and _NOT_INSTALLED in out:
                    code = None  # no base64 or tar in this image: the docker API's way below
            if code is None:
                self.exec(clean, 30)
                if not self.client.api.put_archive(self.id, "/tests", tar):
                    raise InfraError("could not copy the tests into the container")
                code, out = self.exec(t.test_command, t.test_timeout_s, env=env)
            for _ in range(3 if t.layout == "tb2" else 0):
                rc, text = self.exec("for f in /logs/verifier/reward.json /logs/verifier/reward.txt; do "
                                     "[ -f $f ] && { echo $f; cat $f; exit 0; }; done; exit 3", 30)
                if rc != 0 or text.partition("\n")[2].strip():
                    break  # an empty read is retried: a loaded daemon can drop a short exec's output
        except Exception as e:
            return self._failed(e), False
        g, harness_failed = self._score(code, out, rc, text)
        offline = _NO_NETWORK.search(out)
        if offline and not g.tests and not (g.reward or 0) > 0:  # no test ran: the runner could not be fetched
            net = self.env.grading_network if self.env else "none"
            return Grade(None, False, g.tests, g.output, "the test harness could not install itself: no network "
                         f"({offline.group().strip()[:120]}); grading joins env.grading_network ({net}) for "
                         "tasks whose tests_need_network"), False
        return g, harness_failed

    def _score(self, code: int, out: str, rc: int | None, text: str) -> tuple[Grade, bool]:
        """The grade of a test run's exit code, output and (TB2) reward file: (grade, the harness failed)."""
        t = self.task
        cap = _Capped(OUTPUT_CAP * 4)
        cap.add(out.encode())
        tests = {m.group(2): m.group(1) for m in re.finditer(
            r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\s+(\S+)", out, re.M)}
        timed_out = code in (124, 137)  # the tests hung on the state the agent left: a failure
        output = cap.text() + ("\n[tests timed out]" if timed_out else "")
        if t.layout != "tb2":
            if code in (126, 127) or (code in (3, 4, 5) and not tests):  # harness missing / pytest usage error
                return Grade(None, False, tests, output, f"test harness failed to run (exit code {code})"), True
            return Grade(1.0 if code == 0 else 0.0, code == 0, tests, output, None), False
        if rc != 0:
            if timed_out:
                return Grade(0.0, False, tests, output, None), False
            return Grade(None, False, tests, output,
                         f"test harness wrote no /logs/verifier/reward.txt (tests exit code {code})"), True
        path, _, body = text.partition("\n")
        try:
            rewards = json.loads(body) if path.endswith(".json") else {"reward": float(body.strip())}
            reward = scalar_reward(rewards, self.multi_reward)
        except (ValueError, TypeError, AttributeError) as e:
            return Grade(None, False, tests, output, f"{path}: {e}: {body[:100]!r}"), True
        return Grade(reward, reward >= 1.0, tests, output, None, rewards=rewards), False

    def _join_grading_network(self):
        """Give the container the grading network, once the agent's processes are gone, when the
        task's tests fetch their runner and the container has no network yet."""
        net = self.env.grading_network if self.env else "none"
        if not self.task.tests_need_network or net == "none" or self.key[4] != "none" or self._networked:
            return
        self.client.api.disconnect_container_from_network(self.id, "none")
        self.client.api.connect_container_to_network(self.id, net)
        self._networked = True

    def _agent_exports(self) -> dict:
        """The variables the agent's shell exported (TB1 run_tests_in_same_shell), without those that
        would load code into the verifier."""
        r = self.run("export -p", timeout=10)
        out = {}
        for m in re.finditer(r'^declare -x ([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"$', r.output, re.M):
            name, value = m.group(1), re.sub(r"\\(.)", r"\1", m.group(2))
            if not re.match(r"LD_|PYTHON|PYTEST|BASH_ENV$|ENV$|BASH_FUNC|TEST_DIR$|PS4$|SHELLOPTS$", name):
                out[name] = value
        return out

    def agent_stopped(self) -> str | None:
        """Evidence when Docker answers but the container no longer runs: the agent killed the process
        that keeps it up, its failure rather than the daemon's (tests/test_tampering.py)."""
        with contextlib.suppress(Exception):
            state = self.client.api.inspect_container(self.id)["State"]
            if not state.get("Running"):
                if self._stopped_by_docker():  # not the agent: the daemon or an operator (see `lost`)
                    return None
                return f"the container stopped during the episode (exit code {state.get('ExitCode')})"
            procs = self._procs()
            if procs is not None and _first_child(self._host_pid, procs) is None:  # stopping right now
                return "the container stopped during the episode (its keep-alive process was killed)"
        return None

    def _failed(self, e: Exception) -> Grade:
        """A Docker error while grading: reward 0 and flagged when the agent stopped the container,
        else an infra_error."""
        if why := self.agent_stopped():
            return Grade(0.0, False, {}, "", None, tampered=why)
        return Grade(None, False, {}, "", f"grading failed: {type(e).__name__}: {e}")

    def _stop_agent(self) -> list[str]:
        """SIGKILL every process in the container except init and the `sleep` that keeps it up, so
        nothing the agent started (daemons included) runs while the tests do; evidence for each
        killed process that names the tests or the verifier's output (tests/test_tampering.py)."""
        procs = self._procs()
        if procs is None:  # a daemon on another machine: kill from inside, with the container's tools
            self.exec(_KILL_INSIDE, 30, workdir="/")
            return []
        sleeper = _first_child(self._host_pid, procs)
        if sleeper is None:  # the container is stopping: nothing to grade in
            return ["the process that keeps the container up was killed during the episode"]
        keep = {self._host_pid, sleeper}
        stopped: dict[int, str] = {}
        for _ in range(1000):  # SIGSTOP until no new process appears: a stopped process cannot fork
            new = [h for h in procs if h not in keep and h not in stopped]
            if not new:
                break
            for h in new:
                stopped[h] = _describe(h)
                with contextlib.suppress(OSError):
                    os.kill(h, signal.SIGSTOP)
            procs = self._procs() or {}
        for h in stopped:
            with contextlib.suppress(OSError):
                os.kill(h, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while left := [h for h in (self._procs() or {}) if h in stopped and not _zombie(h)]:
            if time.monotonic() > deadline:
                raise InfraError(f"processes {left} of the agent survived SIGKILL")
            time.sleep(0.005)
        return [f"a process the agent left running refers to {m.group()}: {text[:200]!r}"
                for text in stopped.values() if (m := _VERIFIER_PATHS.search(text))]

    def _changes(self) -> list[tuple[str, str]]:
        """(path, "A"dded | "C"hanged | "D"eleted) of the container against its image: from the overlay
        upper dir when it is on this machine (docker's diff API walks every layer: ~0.7 s here)."""
        upper, lowers = self._layers
        if upper and self.local and os.path.isdir(upper):
            return _overlay_changes(upper, lowers)
        entries = [(c["Path"], "CAD"[c["Kind"]]) for c in self.client.api.diff(self.id) or []]
        paths = sorted(p for p, _ in entries)
        parents = {p.rsplit("/", 1)[0] for p in paths}
        return [(p, k) for p, k in entries if p not in parents]  # a directory is listed when a child changed

    def host_ok(self) -> bool:
        """Whether this container's host has not been drained since it started (no call to it)."""
        return self.host is None or (self.host.up and self.host.epoch == self._epoch)

    def _check_host(self):
        if not self.host_ok():
            raise HostDown(f"docker host {self.host.name} stopped answering ({self.host.why or 'drained'}); "
                           "its containers are lost")

    def lost(self) -> str | None:
        """Why the container was lost to the infrastructure, or None: its Docker host was drained, does
        not answer now, or Docker itself stopped the container (a `kill` event: the daemon shutting
        down, an operator's `docker stop`; nothing inside a container can cause one). The latter two
        drain the host (Env.check_host, Env.drain): it is tried again and rejoins when it answers."""
        if self.host_ok() and self.env is not None and self.host is not None and \
                self.env.check_host(self.host, fresh=True):
            with contextlib.suppress(Exception):  # removed: not lost to the infrastructure
                if not self.client.api.inspect_container(self.id)["State"]["Running"] and self._stopped_by_docker():
                    self.env.drain(self.host, "Docker stopped a running episode's container (daemon shutting down?)")
        if self.host_ok():
            return None
        return f"docker host {self.host.name} stopped answering ({self.host.why}); the container is lost"

    def _stopped_by_docker(self) -> bool:
        with contextlib.suppress(Exception):
            api = self.client.api
            since = _daemon_time(api.inspect_container(self.id)["Created"])
            until = _daemon_time(api.info()["SystemTime"]) + 1  # the daemon's clock; blocks until then (< 1 s)
            return any(True for _ in api.events(since=since, until=until, decode=True,
                                                filters={"container": self.id, "event": "kill"}))
        return False

    def close(self):
        if not self.closed:
            self.closed = True
            for sock in self._socks:
                with contextlib.suppress(OSError):
                    sock.close()
            if not self.host_ok():
                # no call to a daemon that stopped answering (it may hang): removed when the host rejoins
                self.host.lost.add(self.id)
                with _LIVE_LOCK:
                    _LIVE.pop(self.id, None)
            else:
                _remove(self.client, self.id)
            if self.host is not None and self.env is not None:
                self.env._hosts.release(self.host)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _next_frame(sock, raw: bytearray, deadline: float) -> bytes | None:
    """Payload of the next docker stream frame on sock (raw holds bytes read but not yet parsed);
    b"" when the stream ended, None at the deadline."""
    while True:
        if len(raw) >= 8:
            size = struct.unpack(">I", raw[4:8])[0]
            if len(raw) >= 8 + size:
                out = bytes(raw[8:8 + size])
                del raw[:8 + size]
                if out:
                    return out
                continue
        wait = deadline - time.monotonic()
        if wait <= 0 or not select.select([sock], [], [], wait)[0]:
            return None
        chunk = sock.recv(1 << 16)
        if not chunk:
            return b""
        raw += chunk


def _exec(client, cid: str, argv: list, timeout: float, env=None, workdir=None, cgroup=None,
          host_pid: int | None = None, kill_inside: bool = False) -> tuple[int, bytes]:
    """`docker exec` with a deadline kept from the host, never by the container nor the Docker
    client's own timeout: (exit code, output). At the deadline every process the exec started is
    SIGKILLed from outside and the exit code is 124; with kill_inside (a daemon on another machine,
    whose pids mean nothing here) every process but init and its sleep, by a kill from inside."""
    api = client.api
    if host_pid:
        _repair_dev_null(host_pid)
    ex = api.exec_create(cid, argv, environment=env, workdir=workdir, stdout=True, stderr=True)
    sock = api.exec_start(ex["Id"], socket=True)._sock
    out, raw, deadline = _Capped(FLOOD_LIMIT), bytearray(), time.monotonic() + timeout
    try:
        while data := _next_frame(sock, raw, deadline):
            out.add(data)
        if data is None:
            _kill_exec(api, ex["Id"], cgroup or {})
            if kill_inside:
                _exec(client, cid, ["sh", "-c", _KILL_INSIDE], 10)
            return 124, out.text().encode()
    finally:
        with contextlib.suppress(OSError):
            sock.close()
    end = time.monotonic() + 10  # the stream ends a moment before docker records the exit code
    while (info := api.exec_inspect(ex["Id"]))["Running"] or info["ExitCode"] is None:
        if time.monotonic() > end:  # a process that closed its output and kept running
            _kill_exec(api, ex["Id"], cgroup or {})
            return 124, out.text().encode()
        time.sleep(0.01)
    return info["ExitCode"], out.text().encode()


def _kill_exec(api, exec_id: str, cgroup: dict):
    """SIGKILL an exec's process and all its descendants (host pids; a no-op for a remote daemon)."""
    with contextlib.suppress(Exception):
        root = api.exec_inspect(exec_id)["Pid"]
        for _ in range(3):  # a second pass catches what forked during the first
            hpids = _cgroup_pids(cgroup) or []
            if root not in hpids:  # gone, or not a pid of this machine's container
                return
            parent = {}
            for h in hpids:
                with contextlib.suppress(OSError, IndexError, ValueError):
                    parent[h] = int(Path(f"/proc/{h}/stat").read_text().rsplit(")", 1)[1].split()[1])
            tree, grew = {root}, True
            while grew:
                new = {h for h, p in parent.items() if p in tree} - tree
                tree |= new
                grew = bool(new)
            for h in tree:
                with contextlib.suppress(OSError):
                    os.kill(h, signal.SIGKILL)


def _repair_dev_null(host_pid: int):
    """Recreate a container's /dev/null from the host if the agent deleted it: `docker exec` cannot
    start any process without it (test_hostile.test_deleted_dev_null_*). A no-op for a remote daemon."""
    path = f"/proc/{host_pid}/root/dev/null"
    with contextlib.suppress(OSError):
        if os.path.isdir(f"/proc/{host_pid}/root/dev") and not os.path.exists(path):
            if os.path.lexists(path):
                os.unlink(path)
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
            os.chmod(path, 0o666)


def _readlink(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def _fd_targets(hpid: int) -> set:
    try:
        return {_readlink(f"/proc/{hpid}/fd/{fd}") for fd in os.listdir(f"/proc/{hpid}/fd")}
    except OSError:
        return set()


def _daemon_time(iso: str) -> int:
    """Seconds since the epoch of a timestamp the daemon wrote (RFC 3339, nanoseconds, any offset)."""
    from datetime import datetime
    return int(datetime.fromisoformat(re.sub(r"(\.\d{6})\d*", r"\1", iso).replace("Z", "+00:00")).timestamp())


def _names_container(host_pid: int, container_id: str) -> bool:
    """Whether this machine's process host_pid is in the container's cgroup: the daemon is local."""
    try:
        return container_id in Path(f"/proc/{host_pid}/cgroup").read_text()
    except OSError:
        return False


def _cgroup_dirs(host_pid: int, container_id: str) -> dict:
    """{controller: its cgroup directory} of a container's init process, for those we can read;
    {} when that pid is not the container's on this machine (a remote daemon's pid means nothing here)."""
    dirs = {}
    try:
        text = Path(f"/proc/{host_pid}/cgroup").read_text()
    except OSError:
        return dirs
    if container_id not in text:
        return dirs
    lines = text.splitlines()
    for ln in lines:
        _, ctrls, path = ln.split(":", 2)
        for c in ctrls.split(",") if ctrls else ["unified"]:
            bases = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"] if c == "unified" else [f"/sys/fs/cgroup/{c}"]
            d = next((b + path for b in bases if os.path.isfile(b + path + "/cgroup.procs")), None)
            if d:
                dirs[c] = d
    if "pids" not in dirs and "unified" in dirs and os.path.exists(dirs["unified"] + "/pids.max"):
        dirs["pids"] = dirs["unified"]  # cgroup v2: one directory for every controller
    return dirs


def _cgroup_read(cgroup: dict, controller: str, name: str) -> str:
    try:
        return Path(cgroup[controller], name).read_text().strip()
    except (KeyError, OSError):
        return ""


def _cgroup_pids(cgroup: dict) -> list | None:
    text = _cgroup_read(cgroup, "pids", "cgroup.procs")
    return [int(x) for x in text.split()] if "pids" in cgroup and (text or os.path.isdir(cgroup["pids"])) else None


def _container_procs(init_pid: int, cgroup: dict | None = None) -> dict | None:
    """{host pid: pid inside the container} for a local daemon we may signal, else None."""
    hpids = _cgroup_pids(cgroup or {})
    if hpids is None:  # no readable cgroup: scan every process of the host for the container's pid namespace
        try:
            ns = os.readlink(f"/proc/{init_pid}/ns/pid")
            if ns == os.readlink("/proc/self/ns/pid"):
                return None  # not a separate pid namespace we can see from here
        except OSError:
            return None
        hpids = []
        for d in os.listdir("/proc"):
            with contextlib.suppress(OSError):
                if d.isdigit() and os.readlink(f"/proc/{d}/ns/pid") == ns:
                    hpids.append(int(d))
    procs = {}
    for h in hpids:
        try:
            status = Path(f"/proc/{h}/status").read_text()
            procs[h] = int(re.search(r"^NSpid:.*?(\d+)\s*$", status, re.M).group(1))
        except (OSError, AttributeError):
            continue
    return procs


def _dir_bytes(path: str) -> int:
    """Disk blocks used by the files under path (a container's writable layer)."""
    total, stack = 0, [path]
    while stack:
        try:
            it = os.scandir(stack.pop())
        except OSError:
            continue
        with it:
            for e in it:
                with contextlib.suppress(OSError):
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
                    else:
                        total += e.stat(follow_symlinks=False).st_blocks * 512
    return total


# --- Grading integrity: the verifier's environment, the agent's leftovers, toolchain changes -----

# What a harness prints when it cannot download its runner (curl, pip, uv, apt, DNS).
_NO_NETWORK = re.compile(r"^.*(Could not resolve host|Temporary failure in name resolution|Network is unreachable|"
                         r"Failed to establish a new connection|failed to lookup address|dns error).*$", re.M | re.I)
# Where the verifier's input and output live: a process of the agent that names them is tampering.
_VERIFIER_PATHS = re.compile(r"/tests\b|/logs/verifier|reward\.(txt|json)")
# Inside a container whose processes we cannot signal from here: stop, then kill, all but init,
# the first child of init (the sleep that keeps the container up) and this script's own ancestry.
_KILL_INSIDE = r"""keep=" 1 $$ $PPID $(cut -d' ' -f4 /proc/$PPID/stat) "
first=$(for p in /proc/[0-9]*; do [ "$(cut -d' ' -f4 $p/stat 2>/dev/null)" = 1 ] && echo ${p#/proc/}; done | sort -n | head -1)
for sig in STOP STOP STOP KILL; do for p in /proc/[0-9]*; do p=${p#/proc/}
  case "$keep $first " in *" $p "*) ;; *) kill -$sig $p 2>/dev/null;; esac; done; done; true"""
RUNNER_CONFIGS = ("pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")
# Programs every test harness may run, besides the words of the task's own test scripts.
_HARNESS_PROGRAMS = {"bash", "sh", "dash", "env", "timeout", "python", "python3", "pytest", "pytest-3",
                     "py.test", "pip", "pip3", "uv", "uvx"}
_RUNNER_PACKAGES = {"pytest", "_pytest", "pluggy", "iniconfig", "pytest.py", "_pytest.py", "py.py", "pluggy.py"}
_INSTALLER_CONFIGS = {"pip.conf", "uv.toml", ".pydistutils.cfg", ".npmrc", ".condarc"}
_BIN_DIRS = ("/usr/local/sbin/", "/usr/local/bin/", "/usr/sbin/", "/usr/bin/", "/sbin/", "/bin/")


def verifier_env(task: Task) -> dict:
    """Environment of the test run. The rest comes from the image's config, which the agent cannot
    change (its `export`s live in its own shell): PATH, PYTHONPATH, HOME. Python's user site is off
    and pytest reads no conftest or ini file above /tests, only the task's own (tests/test_tampering.py)."""
    ini = next((f"/tests/{n}" for n in RUNNER_CONFIGS if n in task.tests), "/dev/null")
    return {"TEST_DIR": "/tests", "PYTHONNOUSERSITE": "1",
            "PYTEST_ADDOPTS": f"-p no:cacheprovider --rootdir=/tests --confcutdir=/tests -c {ini}"}


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
    raise ValueError(f"several rewards {sorted(values)} and no 'reward' key; set env.multi_reward to mean or min")


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
        if path.startswith(("/tests/", "/logs/", "/proc/", "/tmp/pytest-of-")) or path in ("/tests", "/logs") or \
                any(fnmatch.fnmatch(path, g) for g in task.verifier_changes_ok):
            continue
        parts, name = path.split("/"), path.rsplit("/", 1)[-1]
        why = None
        if path.startswith("/etc/ld.so.preload") or path.startswith("/etc/ld.so.conf"):
            why = "the dynamic loader's config"
        elif path[:len(path) - len(name)] in bin_dirs and (name in programs or re.fullmatch(r"python\d[\d.]*", name)):
            why = "a program the test harness runs"
        elif name in ("sitecustomize.py", "usercustomize.py") or (name.endswith(".pth") and "python" in path):
            why = "a Python startup hook"
        elif _RUNNER_PACKAGES & set(parts) or re.search(r"/(pytest|pluggy)-[^/]*\.dist-info(/|$)", path):
            why = "the test runner's package"
        elif re.match(r"/usr/lib/python3\.\d+/(?!(dist|site)-packages/)", path) and not (kind == "A" and "__pycache__" in parts):
            why = "Python's standard library"
        elif kind != "A" and re.match(r"/(usr/)?lib(64|/x86_64-linux-gnu|/aarch64-linux-gnu)?/[^/]*\.so[.\d]*$", path):
            why = "a shared library"
        elif len(parts) == 2 and name in RUNNER_CONFIGS + ("conftest.py",):
            why = "test runner config above /tests"
        elif name in _INSTALLER_CONFIGS:
            why = "an installer's config, read by a harness that installs its runner"
        elif path in sourced:
            why = "a file the test script sources"
        if why:
            out.append(f"{kinds[kind]} {path} ({why})")
    return out


def _overlay_changes(upper: str, lowers: list[str]) -> list[tuple[str, str]]:
    """What docker diff reports, from the overlay dirs: whiteouts are deletions, a file also in a
    lower layer was changed, else added; an opaque directory (removed, then made again) changed."""
    out = []
    for root, dirs, files in os.walk(upper):
        rel = root[len(upper):]
        for d in dirs:
            with contextlib.suppress(OSError):
                if os.getxattr(os.path.join(root, d), "trusted.overlay.opaque") == b"y":
                    out.append((f"{rel}/{d}", "C"))
        for f in files:
            st = os.lstat(os.path.join(root, f))
            p = f"{rel}/{f}"
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                out.append((p, "D"))
            else:
                out.append((p, "C" if any(os.path.lexists(lo + p) for lo in lowers) else "A"))
    return out


def _stat_fields(hpid: int) -> list[str]:
    return Path(f"/proc/{hpid}/stat").read_text().rsplit(")", 1)[1].split()


def _first_child(init_pid: int, procs: dict) -> int | None:
    """The oldest child of the container's init: the sleep that keeps the container up."""
    kids = []
    for h in procs:
        with contextlib.suppress(OSError, IndexError, ValueError):
            f = _stat_fields(h)
            if int(f[1]) == init_pid:
                kids.append((int(f[19]), h))
    return min(kids)[1] if kids else None


def _zombie(hpid: int) -> bool:
    try:
        return _stat_fields(hpid)[0] in ("Z", "X")
    except (OSError, IndexError):
        return True  # gone


def _describe(hpid: int) -> str:
    """A process's command line and the text of the scripts it names (what it will do)."""
    try:
        argv = Path(f"/proc/{hpid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return ""
    text = b" ".join(argv).decode("utf-8", "replace")
    for a in argv[1:]:
        if a.startswith(b"/") or b"." in a:
            with contextlib.suppress(OSError, ValueError):
                cwd = os.readlink(f"/proc/{hpid}/cwd")
                p = Path(f"/proc/{hpid}/root") / os.path.join(cwd, a.decode()).lstrip("/")
                if p.is_file() and p.stat().st_size < (1 << 16):
                    text += "\n" + p.read_text(errors="replace")
    return text


def _tar(files: dict) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o755 if name.endswith(".sh") else 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


# --- Env: images (built once, cached by content), container starts, the warm pool ----------------

_HIDDEN = {"tests", "solution", "solution.sh", "solution.yaml", "run-tests.sh"}  # never in an image


def _context_files(task: Task) -> list[tuple[str, Path]]:
    ctx = task.build_context
    skip = _HIDDEN if task.layout == "tb1" else set()
    return [(str(p.relative_to(ctx)), p) for p in sorted(ctx.rglob("*"))
            if p.is_file() and not (set(p.relative_to(ctx).parts[:1]) & skip) and "__pycache__" not in p.parts]


class Env:
    """Starts terminals for tasks on one or more Docker hosts. Thread-safe; one per process; sweeps
    stale containers on every host at start.

    Hosts (hosts.py): each container goes to the least loaded live host with free capacity; a host
    that stops answering is drained (its containers end with HostDown, which rollout.collect runs
    again elsewhere) and retried with back-off until it answers, then swept and used again.
    Warm pool: `warm` started containers are kept ready per container config (image + limits) and
    live host once that config was reset 3 times or passed to warmup(); only the `max_pools` most
    recent configs are kept."""

    def __init__(self, warm: int = 0, max_concurrent_starts: int = 4, output_cap: int = OUTPUT_CAP,
                 max_pools: int = 16, multi_reward: str = "mean", build_network: str = "default",
                 agent_network: str = "none", grading_network: str = "default", hosts=(),
                 hosts_down_wait_s: float = 120.0):
        import docker  # imported here so task loading works without the docker SDK
        self._docker = docker
        self._max_starts = max_concurrent_starts  # per host
        specs = [parse_host(h) for h in hosts or [""]]
        if len({s.name for s in specs}) < len(specs):
            raise ValueError(f"env.hosts: two hosts share a name ({[s.name for s in specs]}); add name=X to one")
        self._lock = threading.Condition()
        self._hosts = HostPool([Host(s) for s in specs], self._lock, hosts_down_wait_s)
        self._token = os.urandom(6).hex()  # labels this Env's containers: a rejoining host is swept of them
        for h in self._hosts.hosts:
            if why := self._connect(h):
                self._hosts.drain(h, why)
        live = [h for h in self._hosts.hosts if h.up]
        if not live:
            raise InfraError("cannot reach the Docker daemon" + "".join(f"; {h.name}: {h.why}" for h in self._hosts.hosts)
                             + " (run `bash scripts/setup.sh` for this machine's)")
        self.client = live[0].client  # the first live host's: image lookups, `env.py shell`
        self.warm, self.output_cap, self.max_pools = warm, output_cap, max_pools
        # Three networks (see README "Running official Terminal-Bench tasks"): image builds, the agent's
        # episode (only tasks that allow_internet, and only when this is not "none"), and grading, joined
        # once the agent's processes are gone by tasks whose tests install their runner. "default" is the
        # daemon's bridge where it has one, else none. Every host must have the networks named.
        names = live[0].networks
        resolve = lambda n: ("bridge" if "bridge" in names else "none") if n == "default" else n  # noqa: E731
        for what, n in [("build", build_network), ("agent", agent_network), ("grading", grading_network)]:
            for h in live:
                if resolve(n) not in h.networks | {"none"}:
                    raise ValueError(f"env.{what}_network {n!r}: host {h.name} has no such docker network; "
                                     "`docker network ls` lists them (or use none / default)")
        self.build_network = "default" if resolve(build_network) == "bridge" else resolve(build_network)
        self.agent_network, self.grading_network = resolve(agent_network), resolve(grading_network)
        if multi_reward not in ("mean", "min", "error"):
            raise ValueError(f"multi_reward must be mean, min or error, got {multi_reward!r}")
        self.multi_reward = multi_reward
        self._pool: dict[tuple, list[Terminal]] = {}  # container config -> ready terminals (any host), least recent first
        self._starting: dict[tuple, int] = defaultdict(int)  # (config, host name) -> starts under way for the pool
        self._resets: dict[tuple, int] = defaultdict(int)
        self._warmed: set[tuple] = set()
        self._build_locks: dict[str, threading.Lock] = defaultdict(threading.Lock)
        self._closed = False
        self._terms = weakref.WeakSet()  # every terminal started here (the disk watchdog's list)
        self.swept = sum(sweep_stale(h.client) for h in live)
        _install_cleanup()
        self._fillers = [threading.Thread(target=self._fill_loop, daemon=True) for _ in range(min(2, max_concurrent_starts))]
        self._fillers += [threading.Thread(target=self._disk_loop, daemon=True),
                          threading.Thread(target=self._host_loop, daemon=True)]
        for th in self._fillers:
            th.start()

    # -- hosts ---------------------------------------------------------------------------------
    def _connect(self, h: Host) -> str | None:
        """Clients for h and what this Env needs to know of its daemon; None, or why it failed."""
        try:
            if h.client is None:
                h.client = connect(self._docker, h.spec, 600)  # builds and image loads take minutes
                # container calls take seconds: a daemon that hangs (not refuses) holds an episode's
                # call in flight this long at most, not 600 s (the drain ends its later ones at once)
                h.ops = connect(self._docker, h.spec, CONTAINER_CALL_TIMEOUT_S)
                h.probe = connect(self._docker, h.spec, PROBE_TIMEOUT_S)
                h.starts_gate = threading.Semaphore(self._max_starts)
            h.probe.ping()
            info = h.client.info()
            backing = dict(info.get("DriverStatus") or []).get("Backing Filesystem", "")
            # a storage-driver quota (`--storage-opt size=`) where the driver has one; else the watchdog
            h.disk_quota = info.get("Driver") in ("btrfs", "zfs", "devicemapper") or \
                (info.get("Driver") == "overlay2" and backing == "xfs")
            h.networks = {n["Name"] for n in h.client.api.networks()}
            return None
        except Exception as e:
            return f"{type(e).__name__}: {str(e)[:200]}"

    def check_host(self, h: Host, fresh: bool = False) -> bool:
        """Whether h answers a ping; drains it (its containers are lost) when it does not. fresh: on a new
        connection, which a daemon shutting down refuses at once while it still serves the open ones
        (and stops our containers: a failure then is not the agent's; tests/test_hosts.py)."""
        if fresh:
            try:
                connect(self._docker, h.spec, PROBE_TIMEOUT_S).close()  # connecting asks the daemon's version
                why = None
            except Exception as e:
                why = f"{type(e).__name__}: {str(e)[:200]}"
        else:
            why = self._hosts.answers(h)
        if why:
            self.drain(h, why)
        return why is None

    def drain(self, h: Host, why: str):
        """Treat h as down: its containers are lost (their episodes end with HostDown), it is retried."""
        with self._lock:
            if not self._hosts.drain(h, why):
                return
            h.failed += h.running
            lost = [t for pool in self._pool.values() for t in pool if t.host is h]
            for pool in self._pool.values():
                pool[:] = [t for t in pool if t.host is not h]
        for t in lost:
            t.close()  # no docker call: the ids wait in h.lost for the rejoin's sweep

    def _host_loop(self):
        """Ping live hosts every CHECK_EVERY_S (drain the silent); retry drained ones on their back-off,
        and when one answers, remove what it still holds of ours, then place containers there again."""
        while not self._closed:
            for h in list(self._hosts.hosts):
                if h.up:
                    self.check_host(h)
            with self._lock:
                due = self._hosts.due()
            for h in due:
                if self._connect(h) is None:
                    with contextlib.suppress(Exception):  # what is left is swept at the next start
                        self._sweep_own(h)
                    self._hosts.rejoin(h)
            time.sleep(CHECK_EVERY_S)

    def _sweep_own(self, h: Host):
        for c in h.client.api.containers(all=True, filters={"label": f"{LABEL}.env={self._token}"}):
            _remove(h.client, c["Id"])
        h.lost.clear()
        sweep_stale(h.client)

    def host_stats(self) -> dict:
        """Per host: running / failed containers, up, mean start latency since the last call (metrics.jsonl)."""
        return self._hosts.stats()

    def hosts_postfix(self) -> str:
        """name=running[/capacity] per host, `!` after a drained one; "" with the one default host."""
        return self._hosts.postfix() if len(self._hosts.hosts) > 1 or self._hosts.hosts[0].spec.url else ""

    def _live_host(self) -> Host:
        with self._lock:
            return self._hosts.live()

    # -- images --------------------------------------------------------------------------------
    def image(self, task: Task) -> str:
        """The image tag for task: given, or built from its Dockerfile once (tag = content hash) on a
        live host; other hosts load it from one that has it when they first need it (_host_image)."""
        host = self._live_host()
        if task.image:
            self._host_image(task.image, host)
            return task.image
        files = _context_files(task)
        h = hashlib.sha256()
        for rel, p in files:
            h.update(f"{rel}\0{p.stat().st_mode & 0o111}\0".encode() + p.read_bytes() + b"\0")
        h.update(task.dockerfile.name.encode())
        for base in re.findall(r"^\s*FROM\s+(\S+)", task.dockerfile.read_text(), re.M | re.I):
            try:  # a re-seeded base image must invalidate the cache
                h.update(host.client.api.inspect_image(base)["Id"].encode())
            except Exception:
                h.update(base.encode())
        slug = re.sub(r"[^a-z0-9_.-]+", "-", task.name.lower()).strip("-.") or "task"
        tag = f"termrl-{slug}:{h.hexdigest()[:16]}"
        self._host_image(tag, host, lambda: self._build(host, task, tag, files))
        return tag

    def _host_image(self, tag: str, host: Host, build=None):
        """Make image tag present on host, once: already there; else loaded from a host that has it
        (`docker save | docker load`); else built (build) or an error."""
        with self._lock:
            lock = self._build_locks[f"{host.name}\0{tag}"]
        with lock:  # one build or load per host and tag, however many threads reset this task at once
            if tag in host.images:
                return
            try:
                host.client.api.inspect_image(tag)
            except self._docker.errors.ImageNotFound:
                src = next((h for h in self._hosts.hosts if h is not host and h.up and tag in h.images), None)
                if src is not None:
                    try:
                        host.client.api.load_image(src.client.api.get_image(tag))
                    except Exception as e:
                        raise InfraError(f"copying image {tag} from host {src.name} to {host.name} failed: {e}") from None
                elif build is not None:
                    build()
                else:
                    raise InfraError(f"image {tag} is not available locally (host {host.name}) nor on another live host; "
                                     "run `bash scripts/setup.sh` to seed it") from None
            except Exception as e:
                raise InfraError(f"docker host {host.name}: error while looking up {tag}: {e}") from None
            host.images[tag] = tag

    def _build(self, host: Host, task: Task, tag: str, files):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for rel, p in files:
                tar.add(str(p), arcname=rel)
        buf.seek(0)
        log = []
        try:
            for chunk in host.client.api.build(
                    fileobj=buf, custom_context=True, tag=tag, rm=True, forcerm=True, decode=True,
                    dockerfile=str(task.dockerfile.relative_to(task.build_context)), labels={LABEL: "1"},
                    network_mode=self.build_network, timeout=int(task.build_timeout_s)):
                if "error" in chunk:
                    raise BuildError(f"building {task.name} ({task.dockerfile}) failed: {chunk['error'].strip()}\n"
                                     + "".join(log[-20:]))
                log.append(chunk.get("stream", ""))
        except InfraError:
            raise
        except Exception as e:
            raise InfraError(f"building {task.name} ({task.dockerfile}) failed: {e}") from None

    # -- containers ----------------------------------------------------------------------------
    def _key(self, task: Task) -> tuple:
        net = self.agent_network if task.allow_internet else "none"
        return (self.image(task), task.memory_mb, task.cpus, task.pids, net, task.workdir,
                tuple(sorted(task.env.items())), task.disk_mb, tuple(sorted(task.host_labels)))

    @staticmethod
    def _fits(h: Host, key: tuple) -> bool:
        """Whether h has every label the task of key needs (Task.host_labels)."""
        return set(key[8]) <= set(h.spec.labels)

    def _room(self, h: Host) -> bool:
        """Whether h can take one more container now (call with lock held); a full host gives up a
        pooled container (closed in the background) so an episode never waits on the warm pool."""
        if self._closed:
            raise InfraError("Env is closed")
        if h.free():
            return True
        victim = next((t for pool in self._pool.values() for t in pool if t.host is h), None) if h.up else None
        if victim is not None:
            for pool in self._pool.values():
                if victim in pool:
                    pool.remove(victim)
            threading.Thread(target=victim.close, daemon=True).start()
        return False

    def _place(self, key: tuple) -> Host:
        """Reserve room on the least loaded live host with the labels key needs (waits for one;
        HostsDown when none of them answers)."""
        fit = [h for h in self._hosts.hosts if self._fits(h, key)]
        if not fit:
            raise InfraError(f"the task needs Docker host labels {list(key[8])}; no host in env.hosts has them all "
                             f"({', '.join(f'{h.name}: {h.spec.labels}' for h in self._hosts.hosts)})")
        with self._lock:
            if self._closed or _SHUTDOWN.is_set():
                raise InfraError("Env is closed" if self._closed else "shutting down (SIGINT/SIGTERM)")
            return self._hosts.place(self._room, fit)

    def _start(self, key: tuple, host: Host) -> Terminal:
        """A new container for key on host, where room was reserved (released if this fails). HostDown
        when the host stopped answering."""
        image, memory_mb, cpus, pids, net, workdir, variables, disk_mb, _ = key
        client, t0 = host.ops, time.monotonic()
        with host.starts_gate:
            try:
                if _SHUTDOWN.is_set():
                    raise InfraError("shutting down (SIGINT/SIGTERM): no new containers")
                self._host_image(image, host)
                fsize = min(FILE_SIZE_LIMIT, disk_mb << 20)
                host_config = dict(
                    init=True, network_mode=net, mem_limit=f"{memory_mb}m", memswap_limit=f"{memory_mb}m",
                    nano_cpus=int(cpus * 1e9), pids_limit=pids, cap_drop=["ALL"], cap_add=CAPS,
                    security_opt=["no-new-privileges"], privileged=False,
                    ulimits=[{"Name": "fsize", "Soft": fsize, "Hard": fsize}])
                if host.disk_quota:
                    host_config["storage_opt"] = {"size": f"{disk_mb}M"}
                try:
                    c = client.api.create_container(
                        image, entrypoint=["sleep", "infinity"], command=[], working_dir=workdir,
                        labels={**_owner_labels(), f"{LABEL}.env": self._token}, environment=dict(variables),
                        hostname="termrl", host_config=client.api.create_host_config(**host_config))
                except self._docker.errors.APIError as e:
                    if not (host.disk_quota and "storage" in str(e).lower()):
                        raise
                    host.disk_quota = False  # e.g. xfs mounted without pquota: the watchdog instead
                    raise _Retry() from None
                cid = c["Id"]
                with _LIVE_LOCK:
                    _LIVE[cid] = client
                client.api.start(cid)
                if _SHUTDOWN.is_set():  # the signal's cleanup may have run before this container existed
                    raise InfraError("shutting down (SIGINT/SIGTERM): no new containers")
                term = Terminal(client, cid, key, self.output_cap, host)
                term.env, term.multi_reward = self, self.multi_reward
                if not host.disk_quota:
                    term.disk_cap_mb = disk_mb
                self._terms.add(term)
                with self._lock:
                    host.starts, host.start_s = host.starts + 1, host.start_s + time.monotonic() - t0
                return term
            except _Retry:
                err = None
            except Exception as e:
                err = e
                if "cid" in locals():
                    _remove(client, cid)
        if err is None:
            return self._start(key, host)
        self._hosts.release(host)
        if not isinstance(err, BuildError) and not self.check_host(host, fresh=True):
            with self._lock:
                host.failed += 1
            raise HostDown(f"docker host {host.name} stopped answering while starting a container: {err}") from None
        if isinstance(err, InfraError):
            raise err
        raise InfraError(f"starting a container from {image} on {host.name} failed: {err}") from None

    def _start_placed(self, key: tuple) -> Terminal:
        """_start on the least loaded live host, again elsewhere while a host fails (HostsDown when none is left)."""
        while True:
            try:
                return self._start(key, self._place(key))
            except HostDown:
                continue

    def _fill_loop(self):
        while True:
            with self._lock:
                while not self._closed and not (slot := self._deficit()):
                    self._lock.wait(1.0)
                if self._closed:
                    return
                key, host = slot
                host.running += 1  # reserved, as _place does
                self._starting[key, host.name] += 1  # so the other filler moves on to the next slot
            try:
                term = self._start(key, host)
            except Exception:
                term = None
            with self._lock:
                self._starting[key, host.name] -= 1
                if term is not None and not self._closed and key in self._pool and term.host.up:
                    self._pool[key].append(term)
                    self._lock.notify_all()
                    continue
            if term is not None:
                term.close()
            else:
                time.sleep(1.0)  # the daemon is struggling: back off instead of hammering it

    def _disk_loop(self):
        """The disk cap where the storage driver has no quota: a terminal whose writable layer grew
        past its cap is ended (test_hostile.test_disk_cap_stops_writes_past_it)."""
        while not self._closed:
            for term in list(self._terms):
                if term.disk_cap_mb and not term.closed and not term.dead and term.host_ok():
                    with contextlib.suppress(Exception):  # a container removed meanwhile
                        term.check_disk()
            time.sleep(DISK_CHECK_S)

    def _deficit(self):
        """(config, host) of a warm pool short of `warm` containers on a live host with room, or None."""
        for k, v in self._pool.items():
            for h in self._hosts.hosts:
                if h.free() and self._fits(h, k) and sum(t.host is h for t in v) + self._starting[k, h.name] < self.warm:
                    return k, h
        return None

    def warmup(self, tasks, wait: bool = True, timeout: float = 120):
        """Keep `warm` started containers ready for each distinct container config of tasks, on every
        live host with room for them."""
        keys = {self._key(t) for t in tasks}
        with self._lock:
            self._warmed |= keys
            for k in keys:
                self._pool.setdefault(k, [])
            self._lock.notify_all()
            end = time.monotonic() + timeout
            while wait and self.warm and any(
                    sum(t.host is h for t in self._pool.get(k, [])) < self.warm
                    for k in keys for h in self._hosts.hosts if h.free() and self._fits(h, k)):
                if time.monotonic() > end:
                    break
                self._lock.wait(0.2)

    def reset(self, task: Task) -> Terminal:
        """A fresh terminal for task (from the warm pool when one is ready). May raise InfraError, or
        HostsDown when every Docker host has stopped answering for env.hosts_down_wait_s."""
        key = self._key(task)
        term = None
        with self._lock:
            if self._closed or _SHUTDOWN.is_set():
                raise InfraError("Env is closed" if self._closed else "shutting down (SIGINT/SIGTERM)")
            self._resets[key] += 1
            pool = self._pool.pop(key, [])
            ready = [t for t in pool if t.host_ok()]
            if ready:  # the one on the least loaded host
                term = min(ready, key=lambda t: t.host.load())
                pool.remove(term)
            if key in self._warmed or self._resets[key] >= 3:  # one-off configs get no pool
                self._pool[key] = pool  # now the most recently used config
            evicted = []
            while len(self._pool) > self.max_pools:  # keep pools only for the configs in use lately
                evicted += self._pool.pop(next(iter(self._pool)))
            self._lock.notify_all()
        for t in evicted:
            t.close()
        if term is None:
            term = self._start_placed(key)
        term.task = task
        if task.setup:
            r = term.run(f"bash -c {shlex.quote(task.setup)}", timeout=120)
            if r.exit_code != 0:
                term.close()
                if term.lost():
                    raise HostDown(f"docker host {term.host.name} stopped answering during task {task.name}'s setup")
                raise InfraError(f"task {task.name}: setup failed (exit {r.exit_code}): {r.output[-500:]}")
        return term

    def harness_runs(self, task: Task) -> bool:
        """Whether task's test harness runs (whatever its verdict) on a fresh container: when it does,
        a harness that failed after an episode was broken by the agent."""
        try:
            with self._start_placed(self._key(task)) as term:
                term.task = task
                if task.setup:
                    term.run(f"bash -c {shlex.quote(task.setup)}", timeout=120)
                return not term._verify()[1]
        except InfraError:
            return False

    def close(self):
        with self._lock:
            self._closed = True
            pooled = [t for v in self._pool.values() for t in v]
            self._pool.clear()
            self._lock.notify_all()
        for t in pooled:
            t.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _Retry(Exception):
    """The daemon refused a storage quota: start again without one."""


# --- Curation (`validate`) and a human shell (`shell`) -------------------------------------------

def run_oracle(env: Env, task: Task, noop: bool = False) -> Grade:
    """One episode where the oracle's commands (or nothing) are typed into the terminal, then graded."""
    with env.reset(task) as term:
        for cmd in ([] if noop else oracle_commands(task)):
            term.run(cmd, timeout=min(task.agent_timeout_s, 600))
        return term.grade()


def validate_task(env: Env, path, k: int = 3, flake_runs: int = 0, load: int = 4) -> dict:
    """The paper's instance filter: the oracle passes k times in a row and doing nothing fails; then
    flake_runs more oracle episodes, `load` at a time, give the flake rate a 1-in-10 flake shows in."""
    row = {"task": Path(path).name if not isinstance(path, Task) else path.name, "status": "ok",
           "oracle": [], "noop": None, "build_s": None, "error": None, "flake_rate": None}
    try:
        task = path if isinstance(path, Task) else load_task(path)
        t0 = time.monotonic()
        env.image(task)
        row["build_s"] = round(time.monotonic() - t0, 2)
        g = run_oracle(env, task, noop=True)
        if g.infra_error:
            raise InfraError(f"no-op run: {g.infra_error}")
        row["noop"] = g.reward
        for _ in range(k):
            g = run_oracle(env, task)
            if g.infra_error:
                raise InfraError(f"oracle run: {g.infra_error}")
            row["oracle"].append(g.reward)
            if g.tampered:
                row["status"], row["error"] = "oracle_flagged", (
                    f"the oracle's episode is flagged as tampering: {g.tampered}; list the paths its solution "
                    "must change in verifier_changes_ok, or set keep_agent_processes if its tests need a "
                    "service it started")
                return row
            if not g.passed:
                row["error"] = "oracle failed: " + g.output[-600:]
                break
        if not row["error"] and flake_runs:
            from concurrent.futures import ThreadPoolExecutor
            with ThreadPoolExecutor(load) as pool:
                grades = list(pool.map(lambda _: run_oracle(env, task), range(flake_runs)))
            failed = [g for g in grades if not g.passed]
            row["flake_rate"] = len(failed) / flake_runs
            if failed:
                row["error"] = (f"oracle failed {len(failed)} of {flake_runs} runs under load {load}: "
                                + (failed[0].infra_error or failed[0].output[-600:]))
        if row["error"]:
            row["status"] = "oracle_fails" if len(row["oracle"]) == 1 and not row["flake_rate"] else "flaky"
        elif row["noop"] and row["noop"] > 0:
            row["status"], row["error"] = "noop_passes", "doing nothing already earns reward"
    except TaskError as e:
        row["status"], row["error"] = "malformed", str(e)
    except BuildError as e:  # the task's own Dockerfile: a defect of the task, with the build log's tail
        row["status"], row["error"] = "build_fails", str(e)
    except InfraError as e:
        row["status"], row["error"] = "infra_error", str(e)
    return row


def _validate_main(args) -> int:
    from concurrent.futures import ThreadPoolExecutor
    from tqdm import tqdm
    paths = task_dirs(args.tasks)
    if args.easy:
        paths += generate_easy_tasks(args.easy, split="train")
    if args.multistep:
        paths += generate_multistep_tasks(args.multistep, split="train")
    if not paths:
        print(f"no tasks found under {args.tasks}", file=sys.stderr)
        return 2
    with Env(max_concurrent_starts=args.jobs, **_env_kwargs(args)) as env, ThreadPoolExecutor(args.jobs) as pool:
        rows = list(tqdm(pool.map(lambda p: validate_task(env, p, args.k, args.flake_runs, args.load), paths),
                         total=len(paths), desc="validate", unit="task"))
    w = max(len(r["task"]) for r in rows)
    print(f"\n{'task':<{w}}  {'status':<14} {'build_s':>7}  {'noop':>4}  {'flake':>5}  oracle")
    for r in rows:
        oracle = " ".join(f"{x:g}" for x in r["oracle"]) or "-"
        flake = f"{r['flake_rate']:.0%}" if r["flake_rate"] is not None else "-"
        print(f"{r['task']:<{w}}  {r['status']:<14} {r['build_s'] if r['build_s'] is not None else '-':>7}  "
              f"{r['noop'] if r['noop'] is not None else '-':>4}  {flake:>5}  {oracle}")
    bad = [r for r in rows if r["status"] != "ok"]
    for r in bad:
        print(f"\n{r['task']}: {r['status']}: {r['error']}")
    print(f"\n{len(rows) - len(bad)}/{len(rows)} tasks ok")
    if args.json:
        Path(args.json).write_text(json.dumps({"k": args.k, "tasks": rows}, indent=2))
        print(f"wrote {args.json}")
    return 1 if bad else 0


def _env_kwargs(args) -> dict:
    return {"build_network": args.build_network, "agent_network": args.agent_network,
            "grading_network": args.grading_network, "hosts": args.docker_host}


def _shell_main(args) -> int:
    task = load_task(args.task)
    with Env(**_env_kwargs(args)) as env:
        image = env.image(task)  # on the first live host, where the shell then runs
        net = env._key(task)[4]
        spec = env._live_host().spec
    tls = spec.tls and ["--tlsverify", *[f"--tls{k}={spec.tls}/{f}" for k, f in
                                         [("cacert", "ca.pem"), ("cert", "cert.pem"), ("key", "key.pem")]]]
    cmd = ["docker", *(["-H", spec.url] if spec.url else []), *(tls or []), "run", "--rm", "-i" + ("t" if sys.stdin.isatty() else ""), "--network", net,
           *[f"-e{k}={v}" for k, v in task.env.items()],
           "--label", f"{LABEL}=1", "--cap-drop", "ALL", *[f"--cap-add={c}" for c in CAPS],
           "--memory", f"{task.memory_mb}m", "--pids-limit", str(task.pids), "-w", task.workdir,
           "--entrypoint", "bash", image]
    # the whole instruction, line by line as written (code blocks in it stay intact): the human
    # is here to do the task, and a cut-off instruction hides what the tests check
    instruction = "\n".join(f"#   {line}".rstrip() for line in task.instruction.strip().splitlines())
    print(f"# {task.name}:\n{instruction}\n# {' '.join(cmd)}", file=sys.stderr)
    os.execvp("docker", cmd)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("validate", help="build every task; check oracle passes k times and no-op fails")
    v.add_argument("tasks", help="a task dir, a dir of task dirs, or a task-list file")
    v.add_argument("--k", type=int, default=3, help="oracle runs that must all pass (determinism)")
    v.add_argument("--json", help="write the per-task results here")
    v.add_argument("--jobs", type=int, default=2, help="tasks validated in parallel")
    v.add_argument("--easy", type=int, default=0, help="also validate this many generated easy tasks")
    v.add_argument("--multistep", type=int, default=0, help="also validate this many generated multi-step tasks")
    v.add_argument("--flake-runs", type=int, default=0,
                   help="after k passes, this many more oracle runs; a 1-in-10 flake needs ~30 to show")
    v.add_argument("--load", type=int, default=4, help="the flake runs go this many at a time (concurrent load)")
    s = sub.add_parser("shell", help="open an interactive shell in a task's container")
    s.add_argument("task")
    for p in (v, s):
        p.add_argument("--build-network", default="default",
                       help="network of image builds: default (the daemon's), none, or a network name")
        p.add_argument("--agent-network", default="none",
                       help="network of the agent's container for tasks that allow_internet (none: always offline)")
        p.add_argument("--grading-network", default="default",
                       help="network joined for grading, after the agent's processes are gone, by tasks whose "
                            "tests_need_network")
        p.add_argument("--docker-host", action="append", default=[], metavar="URL[,capacity=N][,tls=DIR]",
                       help="a Docker host for the containers (repeatable; unix://, ssh://, or tcp:// with tls=); "
                            "default: DOCKER_HOST's daemon alone")
    args = ap.parse_args(argv)
    try:
        return _validate_main(args) if args.cmd == "validate" else _shell_main(args)
    except (TaskError, InfraError, HostsDown, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
