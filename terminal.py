"""terminal.py — the framed persistent shell an agent types into: one container, one bash session.

Commands go in framed by nonce-carrying markers and come back within their deadline (a timeout, a
flood, an `exit` or a fork bomb is output, never an exception); background jobs are detached from
the terminal's output; a container the agent made unusable is `dead`. Grading is grading.py's.
"""
from __future__ import annotations

import contextlib
import os
import select
import shlex
import signal
import socket
import time
from dataclasses import dataclass

from container import (FLOOD_LIMIT, Capped, HostDown, InfraError, bash_exec, docker_exec, exec_socket, forget,
                       next_frame, remove, stopped_by_docker)
from inspection import (FILES_LIMIT, cgroup_dirs, cgroup_pids, cgroup_read, chars_read, container_procs,
                        disk_use, fd_targets, first_child, listen_inside, loopback_socket, names_container,
                        pid_limit_hits, reading_pipe, readlink, repair_dev_null)
from hosts import Host
from task_folders import Task

OUTPUT_CAP = 16384          # bytes of command output the agent sees (half head, half tail)
SESSION_ENV = {"PAGER": "cat", "GIT_PAGER": "cat", "DEBIAN_FRONTEND": "noninteractive", "TERM": "dumb"}


@dataclass
class CommandResult:
    output: str
    exit_code: int | None
    timed_out: bool
    duration_s: float
    truncated: bool
    # the agent's shell was replaced during this command (its variables and cwd are gone)
    shell_restarted: bool = False



# Runs once in every session. Commands run inside a function so that a USR1 trap can abort the
# whole command (loops included) after its processes are killed; `declare` is made global there
# so `declare -A x` persists as it would at a prompt. $? is carried over between commands.
# __termrl_out is where the harness's markers go (an agent's `exec >file` keeps the framing) and
# __termrl_in the commands' stdin: an empty pipe, so no path the agent can delete (/dev/null) is
# needed; without /dev/fd stdin is closed instead.
_PRELUDE = r"""exec 2>&1
declare() { if [ "${FUNCNAME[1]}" = __termrl_run ]; then builtin declare -g "$@"
  else builtin declare "$@"; fi; }
typeset() { if [ "${FUNCNAME[1]}" = __termrl_run ]; then builtin typeset -g "$@"
  else builtin typeset "$@"; fi; }
trap 'return 130 2>&-' USR1
exec {__termrl_out}>&1
{ exec {__termrl_in}< <(:); } 2>&- || __termrl_in=-
"""
KILL_GRACE_S = 0.5      # after a timeout: how long the shell gets to end the killed command before a restart
# run(timeout=t) returns within t + this (grace + restart on a busy machine); test_hostile checks it
TIMEOUT_MARGIN_S = 2.5
MARK = "\x1e"           # framing markers start with this byte (then B/E/S, the command's nonce, numbers)
# a shell waiting for input this long with no marker sent has lost its framing: restarted
IDLE_S = 1.0
# the marker formats, for test_hostile's forgeries
FORGERY_FORMATS = ["\\n\\036E{} 0\\n", "\\036B{} 1\\n", "\\n\\036E{} 0 0\\n"]


def _command_line(cmd: str, nonce: str, answer: int) -> str:
    """One command framed by a begin and an end marker carrying a fresh nonce and a probe's answer.

    The nonce is new for every command. The harness's own parts run with stderr closed and with the
    agent's `set -x`/`set -v` off (restored for the command alone), so no trace shows a marker. Before
    the end marker, functions named `builtin` are removed in POSIX mode (where `unset` and `trap` are
    special builtins no function can shadow) and DEBUG/RETURN traps are cleared; every name the
    harness calls is `\\`-quoted so no alias applies. Then a probe runs a command with a known exit
    status (`answer`) the way the next command will run, and the end marker carries its status too:
    a shell whose framing the command broke (a builtin disabled or wrapped, a harness variable made
    readonly) answers it wrongly or sends no marker, and is restarted (test_hostile:
    test_framing_survives_*, test_a_shell_whose_framing_*, test_traces_to_a_file_*)."""
    a, b = nonce[:len(nonce) // 2], nonce[len(nonce) // 2:]
    return ("{ __t=; __termrl_wm=; \\builtin read -r __t __t __t __t __termrl_wm </proc/loadavg; "
            f"\\builtin printf '\\036B%s%s %s\\n' {a} {b} \"$__termrl_wm\" >&$__termrl_out; "
            "__termrl_rc() { return \"$1\"; }; "
            "__termrl_run() { __termrl_rc \"${__termrl_last:-0}\"; eval \"$1\"; }; "
            "case $__termrl_fl in *x*) \\set -x;; esac; case $__termrl_fl in *v*) \\set -v;; esac; } 2>&-; "
            f"__termrl_run {shlex.quote(cmd)} <&$__termrl_in; "
            "{ __termrl_last=$?; POSIXLY_CORRECT=y; __termrl_fl=$-; \\set +xv; \\unset -f builtin; "
            "\\unset POSIXLY_CORRECT; "
            "\\trap - DEBUG RETURN; } 2>&-; "
            f"__termrl_run '\\trap - DEBUG RETURN && __termrl_rc {answer}' <&$__termrl_in 2>&-; "
            f"{{ \\builtin printf '\\n\\036E%s%s %d %d\\n' {a} {b} \"$__termrl_last\" $? "
            ">&$__termrl_out; } 2>&-\n")


class _Stream:
    """The shell's output as docker stream frames, read up to a framing marker. `idle()` says when
    the shell waits for input that will not come (Terminal._idle): the marker then never arrives."""

    def __init__(self, sock, idle, raw: bytearray | None = None):
        self.sock, self.idle = sock, idle
        self.raw, self.pending = raw if raw is not None else bytearray(), bytearray()

    def frames(self, deadline: float) -> bytes | None:
        """Payload of the next docker stream frames; b"" when the session ended, None on timeout,
        False when the shell has waited for input IDLE_S with nothing sent (its framing is broken)."""
        idle_since = None
        while True:
            now = time.monotonic()
            data = next_frame(self.sock, self.raw, min(deadline, now + IDLE_S / 4))
            if data is not None or time.monotonic() >= deadline:
                return data
            if not self.idle():
                idle_since = None
            elif idle_since is None:
                idle_since = now
            elif time.monotonic() - idle_since >= IDLE_S:
                return False

    def read_until(self, marker: bytes, deadline: float, sink: Capped, flood: int = 0):
        """Stream into sink until `marker<digits>\\n`; returns (found, digits | reason)."""
        window = bytes(self.pending)
        self.pending = bytearray()
        keep = len(marker) + 24
        while True:
            i = window.find(marker)
            if i >= 0:
                j = window.find(b"\n", i + len(marker))
                if j >= 0:
                    sink.add(window[:i])
                    self.pending += window[j + 1:]
                    return True, window[i + len(marker):j].decode()
            elif len(window) > keep:
                sink.add(window[:-keep])
                window = window[-keep:]
            if flood and sink.total > flood:
                self.pending += window
                return False, "flood"
            data = self.frames(deadline)
            if data is None or data is False:
                self.pending += window
                return False, "timeout" if data is None else "idle"
            if data == b"":
                sink.add(window)
                return False, "eof"
            window += data


class Shell:
    """The agent's bash session in one Terminal's container: started behind the framing prelude,
    sent command lines and read up to their markers, its command's processes killed, its output
    moved away from background jobs, a fork bomb ended. The session's state lives here; what the
    container offers (its processes, its host's health) is asked of the Terminal."""

    def __init__(self, term: Terminal):
        self.term = term
        self.socks = []  # every exec socket of this terminal (old output pipes stay open, unread)
        self.relays = set()  # container pids of the processes whose stdout is the shell's output pipe
        self.pids_max = cgroup_read(term.cgroup, "pids", "pids.max")
        self._pids_hits = pid_limit_hits(term.cgroup)
        self._begin()
        # pids up to here are init and its `sleep` (and what the image's ENTRYPOINT started)
        self.floor: int = self.pid - 1
        self._settle()

    def start(self):
        """A fresh bash session in place of the last one (whose processes are gone)."""
        self._begin()
        self._settle()

    def _begin(self):
        """Start bash, once more when its shell ended before it answered (a start cut short leaves
        the container as it was: tests/test_hostile.py::test_a_session_start_cut_short_is_tried_again)."""
        term = self.term
        if term.local:
            repair_dev_null(term.host_pid)
        why = self._try()
        if why == "eof":
            why = self._try()
        if why:
            raise InfraError(f"container {term.id[:12]}: the bash session did not start ({why})")

    def _settle(self):
        """Note the new shell's host pid, its input and output, and the processes known quiet."""
        procs = self.term.procs() or {}
        shell = next((h for h, n in procs.items() if n == self.pid), None)
        self._out_pipe = readlink(f"/proc/{shell}/fd/1") if shell else None
        self._shell, self._in_pipe = shell, readlink(f"/proc/{shell}/fd/0") if shell else None
        self._sent = (0, 0)  # (bytes the shell had read, bytes of command line sent since)
        # host pids known not to write to the terminal: init, its sleep, the shell
        self._quiet = {h for h, n in procs.items() if n <= self.floor or n == self.pid}

    def _try(self) -> str | None:
        """Start bash in an exec and wait for its answer; None once it answered, else why not: "eof"
        when the exec ended first, "timeout" when it did not answer within 30 s."""
        term = self.term
        # On a local daemon the shell reads its commands from a TCP connection on the container's
        # loopback (its listener made from the host, closed once the shell connected): a socket,
        # unlike the exec's input pipe, cannot be reopened through /proc/<pid>/fd/0, so no other
        # process reads the next command line (test_hostile.test_no_process_reads_the_shells_next_command).
        listener = listen_inside(term.host_pid) if term.local else None
        argv = ["bash", "--noprofile", "--norc"]
        if listener:
            argv += ["-c", f"{{ exec 3<>/dev/tcp/127.0.0.1/{listener.getsockname()[1]}; }} 2>&- && "
                           f"exec bash --noprofile --norc 0<&3 3<&-; \\builtin printf '\\036P\\n'; "
                           "exec bash --noprofile --norc"]
        ex = term.client.api.exec_create(term.id, argv, stdin=True, stdout=True, stderr=True, tty=False,
                                         environment=SESSION_ENV)
        self._exec_id = ex["Id"]
        self._sock = exec_socket(term.client.api, self._exec_id)
        if self._sock is None:  # no stream to read: an exec that ended, tried once more
            if listener:        # (test_hostile.py::test_an_exec_socket_closed_as_*)
                listener.close()
            return "eof"
        self._stream = _Stream(self._sock, self.idle)
        # host pid and input (pipe or socket) of the shell, once it answered
        self._shell = self._in_pipe = None
        self.socks.append(self._sock)
        self._input = self._sock
        if listener:
            self._input = self._connection(listener) or self._sock
        nonce = os.urandom(8).hex()
        with contextlib.suppress(OSError):  # an exec that already ended: its stream says so
            self.send(_PRELUDE + f"\\builtin printf '\\n\\036S%s %s\\n' {nonce} \"$$\"\n")
        found, pid = self._stream.read_until(f"\n{MARK}S{nonce} ".encode(), time.monotonic() + 30,
                                             Capped(4096))
        if not found:
            return pid
        self.pid = int(pid)  # the shell's pid inside the container
        return None

    def send(self, text: str):
        data = text.encode()
        self._sent = (chars_read(self._shell) if self._shell else -1, len(data))
        self._input.sendall(data)

    def read_until(self, marker: bytes, deadline: float, sink: Capped, flood: int = 0):
        """The shell's output into sink up to `marker<digits>\\n`: (found, digits | reason) (_Stream)."""
        return self._stream.read_until(marker, deadline, sink, flood)

    def _connection(self, listener):
        """The shell's connection to listener, or None when it reads the exec's pipe instead (no
        `/dev/tcp` in its bash: it printed the P marker). A connection from any other process of the
        container is closed: the shell's is the one its own process holds."""
        deadline, pid = time.monotonic() + 30, None
        try:
            listener.setblocking(False)
            while time.monotonic() < deadline:
                ready, _, _ = select.select([listener, self._sock], [], [], deadline - time.monotonic())
                if self._sock in ready:
                    self._stream.read_until(f"{MARK}P".encode(), deadline, Capped(4096))
                    return None
                if listener not in ready:
                    continue
                with contextlib.suppress(BlockingIOError):
                    conn, (_, port) = listener.accept()
                    # Docker records it a moment after the start
                    while not pid and time.monotonic() < deadline:
                        pid = self.term.client.api.exec_inspect(self._exec_id).get("Pid") or time.sleep(0.005)
                    if pid and _holds(self.term.host_pid, pid, port):
                        conn.settimeout(self._sock.gettimeout())  # sends wait as on the exec's socket
                        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                        self.socks.append(conn)
                        return conn
                    conn.close()
            return None
        finally:
            listener.close()

    def idle(self) -> bool:
        """Whether the shell has read all it was sent and waits for more (seen from outside the
        container, so nothing the agent did to the shell changes the answer): the framing then
        sent no marker the harness waits for."""
        if not self._shell or not self._in_pipe or not reading_pipe(self._shell, self._in_pipe):
            return False
        before, sent = self._sent
        return before >= 0 and chars_read(self._shell) - before >= sent

    def close(self):
        """Close every exec socket of the session (a restart, or the terminal's end), shut down first:
        the daemon sees the stream end even while a copy of the descriptor lives on, so a writer to
        the terminal left running does not keep Docker's copy of its output, and the container's
        removal, waiting ~20 s (test_hostile.test_close_takes_under_a_second_*)."""
        for s in self.socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()
        self.socks, self.relays = [], set()

    def end_fork_bomb(self) -> str:
        """When a fork failed at the container's pid limit since the last command (a fork bomb, most
        likely still running), end every background process: otherwise no command could fork."""
        term = self.term
        if pid_limit_hits(term.cgroup) <= self._pids_hits:
            return ""
        self.kill(self.floor)  # the shell only gets USR1, which an idle shell ignores
        # a fork under way when the container froze fails at the limit after the thaw: count the hits
        # once the killed processes are gone, or the next command would end a bomb that is over
        end = time.monotonic() + 2
        while time.monotonic() < end and any(n > self.floor and n != self.pid and n not in self.relays
                                             for n in (term.procs() or {}).values()):
            time.sleep(0.02)
        self._pids_hits = pid_limit_hits(term.cgroup)
        return (f"[the container reached its limit of {self.pids_max} processes: every background process "
                "was killed]\n")

    def kill(self, watermark: int, shell_too: bool = False) -> bool:
        """Kill every process the current command started (pids above the watermark); the shell gets
        USR1 (ends the command) or, with shell_too, SIGKILL. True when nothing above it is left. Never
        init nor what is older than the agent: the watermark is at least the floor
        (test_hostile.test_no_command_inside_the_container_makes_its_episode_infra)."""
        term = self.term
        watermark = max(watermark, self.floor)
        api = term.client.api
        host = term.procs()
        if host is not None:  # local daemon: freeze the container so nothing forks while we kill
            with contextlib.suppress(Exception):
                term.check_host()  # no call to a drained daemon: it may hang until the client's timeout
                api.pause_container(term.id)
            try:
                for hpid, nspid in (term.procs() or {}).items():
                    with contextlib.suppress(OSError):
                        if nspid == self.pid and not shell_too:
                            os.kill(hpid, signal.SIGUSR1)
                        elif nspid > watermark and (shell_too or nspid not in self.relays):
                            os.kill(hpid, signal.SIGKILL)
            finally:
                with contextlib.suppress(Exception):
                    term.check_host()
                    api.unpause_container(term.id)
            if not shell_too:
                return True
            end = time.monotonic() + 5  # SIGKILLed processes vanish once the kernel reaps them
            while time.monotonic() < end:
                left = [n for n in (term.procs() or {}).values() if n > watermark]
                if not left:
                    return True
                time.sleep(0.02)
            return False
        sig = "-9" if shell_too else "-USR1"
        script = (f"kill {sig} {self.pid}; for p in /proc/[0-9]*; do p=${{p#/proc/}}; "
                  f"[ $p -gt {watermark} ] && [ $p != $$ ] && kill -9 $p; done 2>&-; true")
        with contextlib.suppress(Exception):
            docker_exec(term.client, term.id, ["sh", "-c", script], 10)
        return True

    def detach_background(self) -> bool:
        """Move the shell to a fresh output pipe when background jobs still hold the current one. On
        failure the old pipe stays in use: background output may then reach later commands. False
        when the shell was told to move and did not answer (the command had made a harness variable
        readonly or defined a function `exec`): its framing is gone."""
        hpids = cgroup_pids(self.term.cgroup)  # per command: one read of the cgroup, in the common case
        if not hpids or not self._out_pipe or not set(hpids) - self._quiet:
            return True
        procs = self.term.procs() or {}
        holders = [h for h, n in procs.items() if n > self.floor and n != self.pid
                   and n not in self.relays and self._out_pipe in fd_targets(h)]
        self._quiet |= set(procs) - set(holders)  # checked: not writing to the terminal
        # a child the shell forked a moment ago (it exits at once) is no background job: let it go first
        end = time.monotonic() + 0.1
        while holders and time.monotonic() < end:
            time.sleep(0.01)
            holders = [h for h in holders if self._out_pipe in fd_targets(h)]
        if not holders:
            return True
        try:
            return self._move_output(procs, holders)
        except Exception:
            return True

    def _move_output(self, procs: dict, holders: list) -> bool:
        """Start a relay process, point the shell's terminal fds at its stdout and read from it; False
        when the shell did not answer the move."""
        term = self.term
        shell = next((h for h, n in procs.items() if n == self.pid), None)
        ex = term.client.api.exec_create(term.id, ["bash", "--noprofile", "--norc", "-c",
                                                   "builtin printf '%s\\n' $$; builtin read -r _"],
                                         stdin=True, stdout=True, stderr=True, tty=False)
        sock = exec_socket(term.client.api, ex["Id"])
        if sock is None:
            return True
        self.socks.append(sock)
        buf, data = bytearray(), b""
        end = time.monotonic() + 10
        while b"\n" not in data:
            chunk = next_frame(sock, buf, end)
            if not chunk:
                return True
            data += chunk
        pid = int(data.split(b"\n")[0])
        self.relays.add(pid)
        self._quiet |= set(holders)  # they keep the old pipe: nothing to check again
        # the shell's fds that were the terminal follow it (stdout, stderr, an agent's saved copy);
        # a stdout the agent sent elsewhere (`exec >f`) stays there
        fds = os.listdir(f"/proc/{shell}/fd") if shell else []
        redirs = " ".join(f"{fd}>&$__termrl_out" for fd in sorted(fds, key=int)
                          if readlink(f"/proc/{shell}/fd/{fd}") == self._out_pipe)
        nonce = os.urandom(8).hex()
        self.send(f"{{ exec {{__termrl_out}}>&- {{__termrl_out}}>/proc/{pid}/fd/1; }} 2>&-; exec {redirs}; "
                  f"\\builtin printf '\\n\\036S%s %s\\n' {nonce} 0 >&$__termrl_out\n")
        pending = self._stream.pending
        self._stream = _Stream(sock, self.idle, buf)
        self._stream.pending = pending
        found, _ = self._stream.read_until(f"\n{MARK}S{nonce} ".encode(), time.monotonic() + 10, Capped(0))
        if not found:
            return False
        host = next((h for h, n in (term.procs() or {}).items() if n == pid), None)
        self._out_pipe = readlink(f"/proc/{host}/fd/1") if host else None
        self._quiet.add(host)
        return True


class Terminal:
    """One container plus one persistent bash session; `run` commands, then grading.grade the episode.

    Use one terminal from one thread at a time. run() raises InfraError only when the container is
    gone by Docker's or its host's doing; everything the agent can cause (timeouts, floods, `exit`)
    comes back as output. When the agent made the container unusable (no bash left to start, disk
    cap exceeded, the container stopped from inside) `dead` says why: run() answers with that
    notice, and the episode should end (graded as a failure).

    Background jobs keep running between commands (servers, builds), within the container's CPU,
    memory, pid and disk limits. Their terminal output is not a later command's: when a command
    ends with jobs still holding the terminal, the shell moves to a fresh output pipe and the old
    one is no longer read (a job writing more than the pipe holds then blocks, as under Ctrl-S).
    A command that ends with the container at its pid limit (a fork bomb) ends every background job."""

    def __init__(self, client, container_id: str, key: tuple, output_cap: int = OUTPUT_CAP,
                 host: Host | None = None, *, host_answers=None, drain_host=None, on_close=None,
                 harness_runs=None, grading_network: str = "none", multi_reward: str = "mean",
                 disk_cap_mb: int = 0, disk_quota: bool = False, network: str = "none"):
        """What the terminal needs of its environment comes as callables: host_answers() whether the
        host answers a fresh connection (draining it when not), drain_host(why) treat it as down,
        on_close() once the container is gone (its place on the host is free). harness_runs(task),
        grading_network and multi_reward are for grading.grade; disk_cap_mb is the disk cap the disk
        watchdog keeps (check_disk; 0: none), disk_quota whether a storage quota caps the layer itself;
        network the network the container started on ("none": no network during the episode)."""
        self.client, self.id, self.key, self.output_cap = client, container_id, key, output_cap
        # a drain after this start loses the container
        self.host, self._epoch = host, host.epoch if host else 0
        self._host_answers, self._drain_host, self._on_close = host_answers, drain_host, on_close
        self.harness_runs, self.grading_network = harness_runs, grading_network
        self.multi_reward = multi_reward
        self.network = network
        self.task: Task | None = None
        self.closed = False
        self.dead: str | None = None
        self._restarts = 0  # shells started after the first (CommandResult.shell_restarted)
        self.disk_cap_mb, self.disk_quota = disk_cap_mb, disk_quota
        info = client.api.inspect_container(container_id)
        self.host_pid = info["State"]["Pid"]
        # Host-side work (/proc, cgroups, signals, the overlay dirs) only when State.Pid is this container's
        # init on THIS machine: a daemon elsewhere reports a pid of its machine, which here is an unrelated
        # process. Else the Docker API's slower ways (docs/grading-integrity.md; tests/test_hosts.py).
        self.local = (host is None or host.host_side) and names_container(self.host_pid, container_id)
        self.cgroup = cgroup_dirs(self.host_pid, container_id) if self.local else {}  # its cgroup dirs here
        self.networked = False  # joined the grading network (grading.grade)
        # grading.grade records which of the image's files the tests read (tasktool validate)
        self.trace_reads = False
        layers = (info.get("GraphDriver") or {}).get("Data") or {}
        self.layers = (layers.get("UpperDir"), [d for d in (layers.get("LowerDir") or "").split(":") if d])
        # an image's VOLUMEs are directories on the host's disk that no writable-layer quota covers
        self.volumes = [m["Source"] for m in info.get("Mounts") or []
                        if m.get("Type") == "volume" and m.get("Source")]
        env = info["Config"].get("Env") or []
        self.home = next((v.split("=", 1)[1] for v in env if v.startswith("HOME=")), "/root")
        self.shell = Shell(self)

    @property
    def shell_pid(self) -> int:
        """The pid, inside the container, of the agent's shell now running."""
        return self.shell.pid

    @property
    def floor(self) -> int:
        """The highest container pid older than the agent: init, its keep-alive `sleep` and what the
        image's ENTRYPOINT started. Every pid above it is the agent's (or the harness's)."""
        return self.shell.floor

    def procs(self) -> dict | None:
        return container_procs(self.host_pid, self.cgroup) if self.local else None

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
        self.shell.close()
        if self.dead:
            return False
        self.check_host()
        try:
            if not self.shell.kill(self.floor, shell_too=True):
                raise InfraError(f"container {self.id[:12]}: processes survived SIGKILL")
            self.shell.start()
            self._restarts += 1
            return True
        except Exception as e:
            if not self._alive():
                # stopped from inside (not by Docker: agent_stopped): the agent's outcome, not infra
                if not isinstance(e, HostDown) and (why := self.agent_stopped()):
                    self.dead = why
                    return False
                if isinstance(e, InfraError):
                    raise
                raise InfraError(f"container {self.id[:12]} is unusable: {type(e).__name__}: {e}") from None
            self.dead = "no new shell can start in this container (was bash or the filesystem deleted?)"
            return False

    def _dead_result(self, t0: float, out: str = "") -> CommandResult:
        return CommandResult(output=out + f"\n[the terminal is dead: {self.dead}; the episode is over]",
                             exit_code=None, timed_out=False, duration_s=time.monotonic() - t0,
                             truncated=False)

    # -- public API ----------------------------------------------------------------------------
    def run(self, cmd: str, timeout: float = 30) -> CommandResult:
        """Run one command in the persistent shell; on timeout kill the command, keep the shell.
        Returns within timeout + TIMEOUT_MARGIN_S."""
        if self.closed:
            raise InfraError("terminal is closed")
        self.check_host()
        t0 = time.monotonic()
        if self.dead:
            return self._dead_result(t0)
        first = self.shell.end_fork_bomb()
        restarts = self._restarts
        # what a timeout kills is what started after this point, as the host sees the container's
        # processes: nothing the shell says (its own watermark) decides it where the host can look
        procs = self.procs()
        watermark = max(procs.values(), default=self.floor) if procs is not None else None
        note, sink = "", Capped(self.output_cap)
        nonce, answer = os.urandom(8).hex(), 1 + os.urandom(1)[0] % 120
        try:
            self.shell.send(_command_line(cmd, nonce, answer))
        except OSError as e:
            if not self._restart_session():
                return self._dead_result(t0)
            return CommandResult(output=f"[the shell had died ({e}); a new shell was started, please retry]",
                                 exit_code=None, timed_out=False, duration_s=time.monotonic() - t0,
                                 truncated=False, shell_restarted=True)
        deadline = t0 + timeout
        # what arrives before the begin marker is background output between commands: dropped
        found, wm = self.shell.read_until(f"{MARK}B{nonce} ".encode(), deadline, Capped(0))
        exit_code, timed_out = None, False
        if found:
            found, status = self.shell.read_until(f"\n{MARK}E{nonce} ".encode(), deadline, sink,
                                                  flood=FLOOD_LIMIT)
            if found and _answered(status, answer):
                exit_code = int(status.split()[0])
                if not self.shell.detach_background():  # this command broke the framing: its result says so
                    exit_code, note = None, note + self._reframe()
            elif found:
                note += self._reframe()
            elif status == "eof":
                if self.dead or not self._restart_session():
                    return self._dead_result(t0, sink.text())
                note += "\n[the shell exited; a new shell was started in the working directory]"
            elif status == "idle":
                note += self._reframe()
            else:
                timed_out = True
                why = (f"timed out after {timeout:g}s" if status == "timeout"
                       else f"produced more than {FLOOD_LIMIT >> 20} MiB of output")
                note += self._recover(_watermark(wm, self.floor) if watermark is None else watermark,
                                      why, sink, nonce, answer)
        elif wm == "idle":  # the shell read the command line and printed no begin marker
            note += self._reframe()
        else:  # the shell never picked the command up
            timed_out = wm == "timeout"
            if self.dead or not self._restart_session():
                return self._dead_result(t0)
            note += (f"\n[the shell did not respond within {timeout:g}s" if timed_out
                     else "\n[the shell exited") + "; a new shell was started in the working directory]"
        if self.dead:
            return self._dead_result(t0, sink.text())
        return CommandResult(output=first + sink.text() + note, exit_code=exit_code, timed_out=timed_out,
                             duration_s=time.monotonic() - t0, truncated=bool(sink.omitted),
                             shell_restarted=self._restarts > restarts)

    def _reframe(self) -> str:
        """Replace a shell whose framing the last command broke (_command_line's probe failed)."""
        if not self._restart_session():
            return ""
        return ("\n[this command changed the shell so that the harness can no longer run commands in it "
                "(a builtin disabled or redefined, a harness variable made readonly); its exit status is "
                "unknown. "
                "A new shell was started: variables and cwd were reset]")

    def _recover(self, watermark: int, why: str, sink: Capped, nonce: str, answer: int) -> str:
        self.shell.kill(watermark)
        found, status = self.shell.read_until(f"\n{MARK}E{nonce} ".encode(), time.monotonic() + KILL_GRACE_S,
                                              sink)
        if found and _answered(status, answer):
            return f"\n[command {why} and was killed; the shell is still usable]"
        if not self._restart_session():
            return ""
        return (f"\n[command {why} and was killed; the shell had to be restarted, so variables and cwd "
                "were reset]")

    def check_disk(self):
        """End the terminal (dead) when what it holds on the host's disk is over disk_cap_mb: its
        writable layer (unless a storage quota caps it: disk_quota), its volumes, and files deleted
        while still open on either (test_hostile.test_disk_cap_*); each file is charged at least
        inspection.FILE_BLOCK, and more than inspection.FILES_LIMIT files end it, quota or not
        (test_hostile.test_file_count_is_capped_like_bytes)."""
        upper = self.layers[0]
        if upper and self.local and os.path.isdir(upper):
            used, files = disk_use(upper, self.volumes, self.host_pid, self.procs() or {}, self.disk_quota)
        elif self.disk_quota:
            return
        # a remote daemon: it measures the layer itself (slower); volumes and deleted files are not seen
        else:
            row = self.client.api.containers(all=True, size=True, filters={"id": self.id})[0]
            used, files = row.get("SizeRw", 0), 0
        if files > FILES_LIMIT:
            self.dead = f"the container holds more than {FILES_LIMIT} files"
        elif self.disk_cap_mb and used > self.disk_cap_mb << 20:
            self.dead = f"the container's files grew past its disk cap of {self.disk_cap_mb} MiB"
        if self.dead:
            self.shell.kill(self.floor, shell_too=True)

    def exec(self, cmd: str, timeout: float = 60, workdir: str | None = None, env: dict | None = None):
        """Run a command in a fresh process (not the agent's shell): (exit code, output). The deadline
        is kept from outside the container: at `timeout` the process tree is killed and the exit code
        is 124, whatever the container's `timeout` binary does (test_hostile.test_exec_and_grade_*)."""
        return bash_exec(self.client, self.id, cmd, timeout,
                         workdir or (self.task.workdir if self.task else "/"), env, self.cgroup,
                         self.host_pid if self.local else None)

    def agent_stopped(self) -> str | None:
        """Evidence when Docker answers but the container no longer runs: the agent killed the process
        that keeps it up, its failure rather than the daemon's (tests/test_tampering.py)."""
        with contextlib.suppress(Exception):
            state = self.client.api.inspect_container(self.id)["State"]
            if not state.get("Running"):
                # not the agent: the daemon or an operator (see `lost`)
                if stopped_by_docker(self.client.api, self.id):
                    return None
                return f"the container stopped during the episode (exit code {state.get('ExitCode')})"
            procs = self.procs()
            if procs is not None and first_child(self.host_pid, procs) is None:  # stopping right now
                return "the container stopped during the episode (its keep-alive process was killed)"
        return None

    def host_ok(self) -> bool:
        """Whether this container's host has not been drained since it started (no call to it)."""
        return self.host is None or (self.host.up and self.host.epoch == self._epoch)

    def adopt(self):
        """The container outlived its host's outage (it still runs once the host rejoined): serve on."""
        if self.host is not None:
            self._epoch = self.host.epoch

    def check_host(self):
        """Raise HostDown when this container's host was drained since it started (host_ok)."""
        if not self.host_ok():
            raise HostDown(f"docker host {self.host.name} stopped answering ({self.host.why or 'drained'}); "
                           "its containers are lost")

    def lost(self) -> str | None:
        """Why the container was lost to the infrastructure, or None: its Docker host was drained, does
        not answer now, or Docker itself stopped the container (a `kill` event: the daemon shutting
        down, an operator's `docker stop`; nothing inside a container can cause one). The latter two
        drain the host (host_answers, drain_host): it is tried again and rejoins when it answers."""
        if self.host_ok() and self._host_answers is not None and self._host_answers():
            with contextlib.suppress(Exception):  # removed: not lost to the infrastructure
                if not self.client.api.inspect_container(self.id)["State"]["Running"] and \
                        stopped_by_docker(self.client.api, self.id):
                    self._drain_host("Docker stopped a running episode's container (daemon shutting down?)")
        if self.host_ok():
            return None
        return f"docker host {self.host.name} stopped answering ({self.host.why}); the container is lost"

    def close(self):
        if not self.closed:
            self.closed = True
            self.shell.close()
            if self.host is not None and not self.host.up:
                # no call to a daemon that stopped answering (it may hang): removed when the host rejoins
                self.host.lost.add(self.id)
                forget(self.id)
            else:
                remove(self.client, self.id)
            if self._on_close is not None:
                self._on_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _holds(init_pid: int, pid: int, port: int, wait_s: float = 1.0) -> bool:
    """Whether host process pid holds the container's end of the loopback connection from `port`,
    asked again for up to wait_s: a connection refused here ends the start it belonged to."""
    end = time.monotonic() + wait_s
    while True:
        sock = loopback_socket(init_pid, port)
        if sock and sock in fd_targets(pid):
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(0.01)


def _answered(status: str, answer: int) -> bool:
    """Whether an end marker's fields are an exit status and the probe's known answer."""
    fields = status.split()
    return len(fields) == 2 and fields[0].isdigit() and fields[1] == str(answer)


def _watermark(text: str, floor: int) -> int:
    """The begin marker's last pid before the command (the shell reads it from /proc/loadavg)."""
    return int(text) if text.isdigit() else floor
