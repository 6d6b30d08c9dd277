"""container.py — Docker calls below the terminal: every container we start labelled and removed on any exit,
`docker exec` with a deadline kept from the host, what changed in a container against its image.

Knows no task and no shell session (terminal.py); the errors every layer above raises live here.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import re
import select
import signal
import socket
import struct
import sys
import threading
import time
from pathlib import Path

from inspection import cgroup_pids, descendants, overlay_changes, proc_stat, repair_dev_null

LABEL = "termrl"  # every container and image we create carries this label
# A root shell working on its own files needs these; everything else (mount, ptrace, raw net...) stays
# dropped.
CAPS = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETUID", "SETGID", "NET_BIND_SERVICE"]
FLOOD_LIMIT = 32 << 20      # a command that streams more than this is killed like a timed-out one


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
        return proc_stat(pid)[19]
    except (OSError, IndexError):
        return ""


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return "unknown"


def owner_labels() -> dict:
    return {LABEL: "1", f"{LABEL}.pid": str(os.getpid()), f"{LABEL}.pidstart": _proc_start(os.getpid()),
            f"{LABEL}.host": socket.gethostname(), f"{LABEL}.boot": _boot_id(),
            f"{LABEL}.pidns": _pid_namespace()}


def _is_stale(labels: dict) -> bool:
    """A container is stale when the process that created it (on this machine) no longer exists."""
    if labels.get(f"{LABEL}.host") != socket.gethostname():
        return False  # another machine shares this daemon; its containers are not ours to judge
    if labels.get(f"{LABEL}.pidns", _pid_namespace()) != _pid_namespace():
        # a container beside us with the host's name (host networking), e.g. another node's trainer:
        # its pids are not ours to look up
        # (tests/test_env.py::test_sweep_spares_live_containers_of_another_pid_namespace)
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
SHUTDOWN = threading.Event()   # set by SIGINT/SIGTERM: no container starts after it
_ATEXIT_DONE = False


def register(client, cid: str):
    """Remember a container this process created, so cleanup_all removes it on any exit."""
    with _LIVE_LOCK:
        _LIVE[cid] = client


def forget(cid: str):
    """Drop a container from cleanup_all's list without a Docker call (its daemon stopped answering)."""
    with _LIVE_LOCK:
        _LIVE.pop(cid, None)


def remove(client, cid: str):
    with contextlib.suppress(Exception):  # already gone, or the daemon is down: nothing more we can do
        client.api.remove_container(cid, force=True, v=True)  # and its anonymous volumes (an image's VOLUME)
    forget(cid)


def cleanup_all():
    """Remove every container this process started (atexit and signal handlers call this)."""
    with _LIVE_LOCK:
        items = list(_LIVE.items())
    for cid, client in items:
        remove(client, cid)


def _on_signal(signum, frame):
    prev = _PREV_HANDLERS.get(signum)
    if prev == signal.SIG_IGN:
        return
    SHUTDOWN.set()
    cleanup_all()
    if callable(prev):
        prev(signum, frame)
    elif signum == signal.SIGINT:
        raise KeyboardInterrupt
    else:
        sys.exit(128 + signum)


def install_cleanup():
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
            remove(client, c["Id"])
            n += 1
    return n


# --- docker exec: the stream's frames, a deadline kept from the host ------------------------------

class Capped:
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



def next_frame(sock, raw: bytearray, deadline: float) -> bytes | None:
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


def exec_socket(api, exec_id: str) -> socket.socket | None:
    """The started exec's stream as a socket of our own, or None when the Docker client's socket
    was closed before we got it. The client's socket belongs to its HTTP response: when the garbage
    collector finalises that response (at any moment, from any thread), urllib3 closes the
    connection and the socket with it, under a reader in select() (ValueError: file descriptor
    cannot be a negative integer). So we take a duplicate of the descriptor and close the client's
    at once: what the client does later to its own socket cannot reach ours
    (tests/test_hostile.py::test_the_docker_clients_socket_closed_under_a_running_shell_is_not_its).
    """
    theirs = api.exec_start(exec_id, socket=True)
    sock = theirs._sock
    try:
        return sock.dup() if sock.fileno() >= 0 else None
    finally:
        theirs.close()  # the reader first, then the socket: its descriptor is released now
        sock.close()


def docker_exec(client, cid: str, argv: list, timeout: float, env=None, workdir=None, cgroup=None,
          host_pid: int | None = None, kill_inside: bool = False) -> tuple[int, bytes]:
    """`docker exec` with a deadline kept from the host, never by the container nor the Docker
    client's own timeout: (exit code, output). At the deadline every process the exec started is
    SIGKILLed from outside and the exit code is 124; with kill_inside (a daemon on another machine,
    whose pids mean nothing here) every process but init and its sleep, by a kill from inside."""
    api = client.api
    if host_pid:
        repair_dev_null(host_pid)
    ex = api.exec_create(cid, argv, environment=env, workdir=workdir, stdout=True, stderr=True)
    sock, data = exec_socket(api, ex["Id"]), b""  # no socket: the exec runs, its output is lost
    out, raw, deadline = Capped(FLOOD_LIMIT), bytearray(), time.monotonic() + timeout
    try:
        while sock and (data := next_frame(sock, raw, deadline)):
            out.add(data)
        if data is None:
            _kill_exec(api, ex["Id"], cgroup or {})
            if kill_inside:
                docker_exec(client, cid, ["sh", "-c", KILL_INSIDE], 10)
            return 124, out.text().encode()
    finally:
        if sock:
            sock.close()
    end = time.monotonic() + 10  # the stream ends a moment before docker records the exit code
    while (info := api.exec_inspect(ex["Id"]))["Running"] or info["ExitCode"] is None:
        if time.monotonic() > end:  # a process that closed its output and kept running
            _kill_exec(api, ex["Id"], cgroup or {})
            return 124, out.text().encode()
        time.sleep(0.01)
    return info["ExitCode"], out.text().encode()


def bash_exec(client, cid: str, cmd: str, timeout: float, workdir: str, env: dict | None, cgroup: dict,
              host_pid: int | None) -> tuple[int, str]:
    """`bash -c cmd` in a fresh process of the container (not the agent's shell): (exit code, output
    as text), the deadline kept from the host as docker_exec keeps it. host_pid is the container's
    init on this machine, None for a daemon on another machine (its processes killed from inside)."""
    code, out = docker_exec(client, cid, ["bash", "-c", cmd], timeout, env=env, workdir=workdir,
                            cgroup=cgroup, host_pid=host_pid, kill_inside=host_pid is None)
    return code, out.decode("utf-8", "replace")


def _kill_exec(api, exec_id: str, cgroup: dict):
    """SIGKILL an exec's process and all its descendants (host pids; a no-op for a remote daemon)."""
    with contextlib.suppress(Exception):
        root = api.exec_inspect(exec_id)["Pid"]
        for _ in range(3):  # a second pass catches what forked during the first
            hpids = cgroup_pids(cgroup) or []
            if root not in hpids:  # gone, or not a pid of this machine's container
                return
            for h in descendants({root}, hpids):
                with contextlib.suppress(OSError):
                    os.kill(h, signal.SIGKILL)


# Inside a container whose processes we cannot signal from here: stop, then kill, all but init,
# the first child of init (the sleep that keeps the container up), this script's own ancestry and,
# when TERMRL_FLOOR and TERMRL_SHELL are set (grading.stop_agent), what the image's ENTRYPOINT
# started: pids at or below the floor no younger than the agent's shell (as grading._image_processes).
KILL_INSIDE = r"""_field() { n=$2; { read -r s </proc/$1/stat; } 2>/dev/null || return; s=${s##*") "}
  set -- $s; eval echo \${$n}; }
keep=" 1 $$ $PPID $(_field $PPID 2) "
first=$(for p in /proc/[0-9]*; do [ "$(_field ${p#/proc/} 2)" = 1 ] && echo ${p#/proc/}; done |
  sort -n | head -1)
shell=$(_field "${TERMRL_SHELL:-0}" 20)
if [ -n "${TERMRL_FLOOR:-}" ] && [ -n "$shell" ]; then for p in /proc/[0-9]*; do p=${p#/proc/}
  b=$(_field $p 20)
  [ "$p" -le "$TERMRL_FLOOR" ] && [ -n "$b" ] && [ "$b" -le "$shell" ] && keep="$keep$p "; done; fi
for sig in STOP STOP STOP KILL; do for p in /proc/[0-9]*; do p=${p#/proc/}
  case "$keep $first " in *" $p "*) ;; *) kill -$sig $p 2>/dev/null;; esac; done; done; true"""


# --- What changed in a container, and who stopped it ---------------------------------------------

def _daemon_time(iso: str) -> int:
    """Seconds since the epoch of a timestamp the daemon wrote (RFC 3339, nanoseconds, any offset)."""
    from datetime import datetime
    return int(datetime.fromisoformat(re.sub(r"(\.\d{6})\d*", r"\1", iso).replace("Z", "+00:00")).timestamp())


def changes(api, cid: str, layers: tuple, local: bool) -> list[tuple[str, str]]:
    """(path, "A"dded | "C"hanged | "D"eleted) of the container against its image: from the overlay
    upper dir when it is on this machine (docker's diff API walks every layer: ~0.7 s here)."""
    upper, lowers = layers
    if upper and local and os.path.isdir(upper):
        return overlay_changes(upper, lowers)
    entries = [(c["Path"], "CAD"[c["Kind"]]) for c in api.diff(cid) or []]
    paths = sorted(p for p, _ in entries)
    parents = {p.rsplit("/", 1)[0] for p in paths}
    return [(p, k) for p, k in entries if p not in parents]  # a directory is listed when a child changed


def stopped_by_docker(api, cid: str) -> bool:
    """Whether Docker itself stopped the container (a `kill` event: the daemon shutting down, an
    operator's `docker stop`; nothing inside a container can cause one)."""
    with contextlib.suppress(Exception):
        since = _daemon_time(api.inspect_container(cid)["Created"])
        until = _daemon_time(api.info()["SystemTime"]) + 1  # the daemon's clock; blocks until then (< 1 s)
        return any(True for _ in api.events(since=since, until=until, decode=True,
                                            filters={"container": cid, "event": "kill"}))
    return False
