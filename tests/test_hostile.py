"""Hostile commands against the terminal harness (issue 17): each case asserts containment, that the
terminal or the episode ends in a defined state, and host health (no leaked container, process or
disk). Cases share one container per group where one case cannot spoil the next."""
import dataclasses
import os
import re
import signal
import subprocess
import sys
import time

import pytest


import inspection
import env as E
import grading
import task_folders as T
import terminal
from conftest import ROOT


def _procs(term) -> dict:
    cgroup = term.cgroup  # a consistent snapshot where the cgroup is readable
    procs = inspection.container_procs(term.host_pid, cgroup or None)
    assert procs is not None, "tests run next to a local Docker daemon"
    return procs


def _frozen_procs(env, term) -> dict:
    """The container's processes counted while its cgroup is frozen: a fork bomb forks and exits
    faster than a scan of /proc or cgroup.procs reads, so an unfrozen count can see a process that
    exited and the one that took its pid slot, and exceed the limit it never broke."""
    env.client.api.pause(term.id)
    try:
        return _procs(term)
    finally:
        env.client.api.unpause(term.id)


def _settles(ok, why, within: float = 3.0):
    """ok() becomes true within `within` s: a SIGKILLed process leaves the table only once the kernel
    has reaped it, which on a loaded machine can come after the next command has returned; a process
    really left behind is still there when the time is up."""
    end = time.monotonic() + within
    while not ok():
        assert time.monotonic() < end, why()
        time.sleep(0.05)


def _gone(env, term):
    """Host health after an episode: its container is removed and no process of it survives."""
    assert not env.client.api.containers(all=True, filters={"id": term.id})
    assert not os.path.exists(f"/proc/{term.host_pid}")


def _task(easy_tasks, i, **kw):
    return dataclasses.replace(easy_tasks[i], **kw)


# --- framing: nothing the shell prints or redefines decides where a command ends or its exit code ---

def _forgeries(text: str) -> str:
    """Shell code that prints an end marker with exit code 0 for every token-like string seen so far,
    in every marker format the harness has used (what an agent reading its own trace could do)."""
    toks = sorted(set(re.findall(r"[0-9a-f]{16,}", text)))
    fmts = ["\\n__termrl_%s_E 0\\n"] + [f.replace("%", "%%").replace("{}", "%s")
                                        for f in terminal.FORGERY_FORMATS]
    return "; ".join(f"builtin printf '{f}' {t}" for t in toks for f in fmts) or "true"


def test_framing_survives_traces_traps_and_redefined_builtins(docker_env, easy_tasks):
    """Bugs: `set -x` / a DEBUG trap printed the terminal's marker token, so a command could print
    the end marker early (rc 0, empty output, its real output bled into the next command), and a
    function named `printf` made every later exit code 0."""
    with docker_env.reset(easy_tasks[0]) as term:
        seen = term.run("set -x; true").output + term.run("trap 'echo \"$BASH_COMMAND\"' DEBUG; true").output
        assert term.run("set +x; trap - DEBUG").exit_code == 0
        seen += term.run("set -x; true; set +x").output
        # replay every token the trace showed as a forged end marker, then do the real work
        r = term.run(f"{_forgeries(seen)}; sleep 0.3; echo real; (exit 7)", timeout=10)
        assert (r.exit_code, r.timed_out) == (7, False) and r.output.rstrip().endswith("real"), r
        assert term.run("echo next").output == "next\n"  # nothing of the forged command bled in
        # builtins the harness could rely on, redefined as functions and aliases
        term.run("printf() { builtin printf \"$1\" \"$2\" 0; }; builtin() { command \"$@\"; }; "
                 "command() { :; }; read() { :; }; shopt -s expand_aliases; alias printf=true builtin=true")
        for want in (1, 0, 5):
            r = term.run(f"(exit {want})")
            assert r.exit_code == want and not r.timed_out, r
        assert term.run("unset -f printf builtin command read; unalias -a; echo ok").output == "ok\n"
        # a redirected stdout keeps the framing intact; the output goes where the agent sent it
        assert term.run("exec 3>&1 1>/tmp/o 2>&1; echo hidden").exit_code == 0
        assert term.run("exec 1>&3 2>&1; cat /tmp/o").output == "hidden\n"
        # unbalanced quotes and binary output still come back as a defined result
        assert term.run("echo 'open").exit_code == 2
        assert term.run(r"printf 'a\x00b\xffc\n'").output == "a\x00b\ufffdc\n"
        assert term.run("cat").output == ""  # stdin is empty
    _gone(docker_env, term)


def test_a_shell_whose_framing_a_command_broke_is_restarted(docker_env, easy_tasks):
    """Bugs: a readonly function `builtin` wrapping printf made every later `false` report 0;
    after `enable -n eval` every later command failed with 127 and the shell was never restarted;
    a harness variable made readonly made a 5 s run time out. Each now restarts the shell at once,
    and the command after it runs as in a fresh shell."""
    wrap = ('builtin() { if [ "$1" = printf ]; then shift; command printf "${@:1:$#-1}" 0; '
            'else command builtin "$@"; fi; }; readonly -f builtin')
    breakers = [wrap, "enable -n eval", "enable -n printf", "enable -n trap", "readonly __termrl_last",
                "readonly __termrl_wm",
                "__termrl_rc() { return 0; }; readonly -f __termrl_rc"]
    with docker_env.reset(easy_tasks[9]) as term:
        start = term.run("pwd").output
        for cmd in breakers:
            assert term.run("cd /tmp; X=1").exit_code == 0
            t0 = time.monotonic()
            r = term.run(cmd, timeout=5)
            r2 = term.run("false", timeout=5)
            took = time.monotonic() - t0
            restarted = r.shell_restarted or r2.shell_restarted
            assert restarted and not r.timed_out and not r2.timed_out, (cmd, r, r2)
            assert took < 5 and r2.exit_code in (1, None), (cmd, took, r, r2)
            for want in (1, 0, 5):
                r = term.run(f"(exit {want})")
                assert (r.exit_code, r.timed_out, r.shell_restarted) == (want, False, False), (cmd, r)
            assert term.run("pwd; echo ${X-unset}").output == start + "unset\n", cmd  # a fresh shell
    _gone(docker_env, term)


def test_traces_to_a_file_never_show_a_marker(docker_env, easy_tasks):
    """Bug: `exec 2>/tmp/x; set -x` wrote the begin marker's printf, nonce and all, into a file the
    command could read and forge its end marker from; `set -v` wrote whole command lines."""
    with docker_env.reset(easy_tasks[10]) as term:
        for flag in ("x", "v"):
            assert term.run(f"exec 3>&2 2>/tmp/trace; set -{flag}").exit_code == 0
            r = term.run("echo a; cat /tmp/trace >> /tmp/seen")
            assert r.output == "a\n" and r.exit_code == 0, r
            assert flag in term.run("echo $-").output  # the agent's own flags stay as it set them
            assert term.run(f"set +{flag}; exec 2>&3").exit_code == 0
        seen = term.run("cat /tmp/trace /tmp/seen").output
        assert "echo a" in seen and "\x1e" not in seen and "036" not in seen, seen
        r = term.run(f"{_forgeries(seen)}; sleep 0.3; echo real; (exit 7)", timeout=10)
        assert (r.exit_code, r.timed_out) == (7, False) and r.output.rstrip().endswith("real"), r
    _gone(docker_env, term)


# --- restarts and timeouts ------------------------------------------------------------------------

def test_timeout_ends_a_shell_that_ignores_signals_within_the_margin(docker_env, easy_tasks):
    """Bug: a shell ignoring the signal used to stop it kept spinning after the restart (35% CPU;
    a 5 s timeout took 11.2 s). The restart must SIGKILL the old tree and the timeout be kept."""
    with docker_env.reset(easy_tasks[1]) as term:
        base = set(_procs(term))
        old_shell = [h for h, n in _procs(term).items() if n == term.shell_pid]
        t0 = time.monotonic()
        r = term.run("trap '' USR1 INT TERM HUP; while :; do :; done", timeout=5)
        took = time.monotonic() - t0
        assert r.timed_out and r.exit_code is None and "timed out after 5s" in r.output, r
        print(f"5 s timeout, shell ignoring signals: returned after {took:.2f} s")
        assert took <= 5 + terminal.TIMEOUT_MARGIN_S, took
        assert term.run("echo fresh").output == "fresh\n"
        time.sleep(0.2)
        assert not any(os.path.exists(f"/proc/{h}") for h in old_shell)  # the spinning shell is gone
        assert len(_procs(term)) == len(base), _procs(term)  # init, sleep and one shell: nothing else
        # the shell replaced by exit / exec / kill -9 $$ leaves nothing behind either
        for cmd in ["exit 3", "exec bash --norc", "kill -9 $$", "sleep infinity"]:
            r = term.run(cmd, timeout=2)
            assert term.run("echo up").output == "up\n", cmd
            _settles(lambda: len(_procs(term)) == len(base), lambda: (cmd, _procs(term)))
    _gone(docker_env, term)


# --- background work --------------------------------------------------------------------------------

def test_background_output_stays_out_of_later_commands(docker_env, easy_tasks):
    """Bug: `yes > /dev/stdout &` filled every later command's output with 16 KiB of `y`. Background
    jobs keep running between commands, but what they write is not a later command's output."""
    with docker_env.reset(easy_tasks[2]) as term:
        r = term.run("(while :; do echo tick; sleep 0.1; done) & echo $! > /tmp/ticker; echo started")
        assert r.output.startswith("started\n") or r.output.startswith("tick\nstarted\n"), r.output
        assert term.run("sleep 0.5; echo mine").output == "mine\n"
        assert term.run("kill -0 $(cat /tmp/ticker) && echo alive").output == "alive\n"  # still running
        term.run("yes > /dev/stdout & echo $! > /tmp/yes")
        for word in ("one", "two"):
            r = term.run(f"sleep 0.3; echo {word}")
            assert r.output == f"{word}\n" and r.exit_code == 0, r.output[:200]
        term.run("kill $(cat /tmp/yes) $(cat /tmp/ticker)")
        assert term.run("echo done").output == "done\n"
    _gone(docker_env, term)


def test_no_process_reads_the_shells_next_command(docker_env, easy_tasks):
    """Bug: a background `cat /proc/$$/fd/0` read the shell's next command line from its input pipe;
    that command never ran (it timed out and the shell was restarted). The shell now reads its
    commands from a connection of its own, which /proc cannot reopen; `/dev/stdout` and
    `/dev/stderr` still work in commands (their output stays a pipe)."""
    with docker_env.reset(easy_tasks[3]) as term:
        # it opens the shell's input once the command has ended and the shell waits for the next
        steal = "(sleep 0.3; cat /proc/$$/fd/0 > /tmp/stolen 2>/tmp/why; echo $? >> /tmp/why) & echo armed"
        assert term.run(steal).output == "armed\n"
        time.sleep(1)
        for word in ("one", "two"):
            r = term.run(f"echo {word}", timeout=5)
            assert (r.output, r.timed_out, r.shell_restarted) == (f"{word}\n", False, False), r
        why = term.run("cat /tmp/stolen /tmp/why").output
        assert "echo" not in why and "No such device or address" in why, why
        # after a restart the new shell's input is its own connection too
        assert term.run("exit 3").exit_code is None
        assert term.run(steal).output == "armed\n"
        time.sleep(1)
        assert term.run("echo three", timeout=5).output == "three\n"
        r = term.run("echo x > /dev/stdout; echo y > /dev/stderr; echo z | tee /dev/stderr > /dev/null")
        assert r.output == "x\ny\nz\n", r
    _gone(docker_env, term)


def test_a_session_start_cut_short_is_tried_again(docker_env, easy_tasks):
    """Bug: a shell that ended before it answered the harness (its start cut short) made the start
    fail: the episode ended as an infrastructure error, or a restart declared the terminal dead. A
    `bash` first on PATH that exits the first time it runs stands for such a start: the session
    starts on the second try, and a bash that never starts still ends the terminal."""
    with docker_env.reset(easy_tasks[4]) as term:
        once = ("printf '#!/bin/sh\\n[ -e /tmp/once ] || { : > /tmp/once; exit 1; }\\n"
                "exec /bin/bash \"$@\"\\n' "
                "> /usr/local/bin/bash && chmod +x /usr/local/bin/bash && echo planted")
        assert term.run(once).output == "planted\n"
        r = term.run("exit 3")
        assert r.exit_code is None and r.shell_restarted and "a new shell was started" in r.output, r
        assert term.dead is None
        assert term.run("echo ok; ls /tmp/once").output == "ok\n/tmp/once\n"
        assert term.run("printf '#!/bin/sh\\nexit 1\\n' > /usr/local/bin/bash; exit 3").exit_code is None
        assert term.dead and "no new shell can start" in term.dead
    _gone(docker_env, term)


def test_fork_bomb_and_cpu_burners_are_contained(docker_env, easy_tasks):
    """Bug: a fork bomb returned rc 0 at once and kept the pid limit exhausted, so later commands
    could not fork. Containment: the pid limit; a command that ends at the limit ends the bomb."""
    task = _task(easy_tasks, 3, pids=64)
    with docker_env.reset(task) as term:
        term.run("for i in $(seq 16); do (while :; do :; done) & done; echo burning", timeout=10)
        assert term.run("echo alive").output == "alive\n"
        term.run("pkill -f 'while' ; kill $(jobs -p) 2>/dev/null; true")
        assert docker_env.client.api.inspect_container(term.id)["HostConfig"]["PidsLimit"] == 64
        term.run(":(){ :|:& };:", timeout=5)
        time.sleep(1)
        assert len(_frozen_procs(docker_env, term)) <= 64
        r = term.run("ls / | wc -l", timeout=30)  # needs to fork: the bomb must not starve it
        assert r.exit_code == 0 and int(r.output.split()[-1]) > 5, r.output[-300:]
        # the bomb is over: init, sleep, the shell and the harness's output relays are left
        assert len(_procs(term)) <= 3 + len(term.shell.relays), len(_procs(term))
        assert term.run("echo alive").output == "alive\n"
    _gone(docker_env, term)


def test_memory_flood_network_and_sleep_are_contained(docker_env, easy_tasks):
    """Cases that already held (kept from regressing): a memory hog is OOM-killed, an output flood is
    capped and killed, a sleep is timed out, the network is unreachable; the shell stays usable."""
    with docker_env.reset(_task(easy_tasks, 4, memory_mb=128)) as term:
        r = term.run("python3 -c \"b = b'x' * (1 << 30); print('survived')\"", timeout=60)
        assert r.exit_code == 137 and "survived" not in r.output.splitlines(), r
        r = term.run("yes", timeout=3)
        assert r.timed_out and r.truncated and len(r.output) < terminal.OUTPUT_CAP + 500
        r = term.run("cat /dev/urandom", timeout=3)
        assert r.timed_out and len(r.output) < 4 * terminal.OUTPUT_CAP
        assert term.run("sleep 100", timeout=1).timed_out
        r = term.run("python3 -c \"import socket; socket.create_connection(('10.1.2.3', 80), 3)\"")
        assert r.exit_code != 0 and "unreachable" in r.output.lower()
        assert term.run("echo alive").output == "alive\n"
    _gone(docker_env, term)


# --- a broken container -----------------------------------------------------------------------------

def test_deleted_dev_null_does_not_break_the_harness(docker_env, easy_tasks):
    """Bug: the harness redirected every command from /dev/null; once it was deleted every later
    command failed with '/dev/null: No such file or directory'."""
    with docker_env.reset(easy_tasks[5]) as term:
        assert term.run("rm -f /dev/null; echo gone").output == "gone\n"
        r = term.run("echo still here; cat")
        assert r.output == "still here\n" and r.exit_code == 0, r.output
        term.run("exit")  # a restart must not need it either
        assert term.run("echo restarted").output == "restarted\n"
    _gone(docker_env, term)


def test_rm_rf_root_ends_the_episode_as_the_agents_doing(docker_env, easy_tasks):
    """Bug: after `rm -rf /` every later command failed and no restart helped; the harness must not
    depend on the container's files, and a terminal that cannot start a shell is reported dead:
    the episode ends and is graded as a failure, not as an infrastructure error."""
    with docker_env.reset(easy_tasks[6]) as term:
        term.run("rm -rf --no-preserve-root / 2>&1 | tail -1", timeout=30)
        r = term.run("echo survivor")
        assert r.output == "survivor\n", r.output  # the running shell keeps working
        r = term.run("exit")
        r = term.run("echo again")
        assert getattr(term, "dead", None), r  # no bash left to start: the terminal is dead ...
        assert "terminal" in r.output.lower() and r.exit_code is None
        t0 = time.monotonic()
        g = grading.grade(term)
        assert (g.reward, g.infra_error) == (0.0, None), g  # ... and that is the agent's doing
        assert time.monotonic() - t0 < 10
    _gone(docker_env, term)


# --- disk ---------------------------------------------------------------------------------------------

def test_disk_cap_stops_writes_past_it(docker_env, easy_tasks):
    """Bug: only a 1 GiB per-file limit existed: two files wrote 2.2 GB to the host's Docker disk.
    The container's writable layer is capped; writing past the cap ends the episode."""
    cap_mb = 200
    task = _task(easy_tasks, 7, **({"disk_mb": cap_mb} if "disk_mb" in T.Task.__dataclass_fields__ else {}))
    with docker_env.reset(task) as term:
        upper = docker_env.client.api.inspect_container(term.id)["GraphDriver"]["Data"]["UpperDir"]
        # up to 2 GB in 50 MB files: unchecked, all of it lands; with the watchdog the episode ends
        # one check interval after the cap (DISK_CHECK_S), however fast this machine writes
        r = term.run("for i in $(seq 40); do head -c 50M /dev/zero > /big$i || break; done; echo wrote",
                     timeout=60)
        time.sleep(E.DISK_CHECK_S * 2)
        used = int(subprocess.run(["du", "-sm", upper], capture_output=True, text=True).stdout.split()[0])
        print(f"disk cap {cap_mb} MiB: the writable layer held {used} MiB when the episode ended")
        # the cap plus one check interval of writes at up to ~2 GB/s (an idle machine's page cache);
        # 229-249 MiB measured on the loaded 2-core machine, 450+ possible on an idle one
        assert used <= cap_mb + 1000, used
        r = term.run("echo after")
        assert getattr(term, "dead", None) and "disk" in r.output.lower(), r
    _gone(docker_env, term)


def test_file_count_is_capped_like_bytes(docker_env, easy_tasks):
    """Bug: 100k empty files used no bytes, so the disk cap never saw them, yet each grade walked them
    all (seconds each). Every file is charged at least one block against the disk cap, and the count
    has a ceiling of its own (inspection.FILES_LIMIT), so an inode flood ends the episode too."""
    cap_mb = 100
    n = 30_000  # 117 MiB at 4 KiB a file
    with docker_env.reset(_task(easy_tasks, 9, disk_mb=cap_mb)) as term:
        term.run(f"mkdir /many && cd /many && python3 -c \"import os\n"
                 f"for i in range({n}): os.close(os.open(str(i), os.O_CREAT))\"", timeout=120)
        time.sleep(E.DISK_CHECK_S * 4)
        r = term.run("echo after")
        assert term.dead and "files" in r.output, r
    _gone(docker_env, term)


def test_disk_cap_counts_deleted_open_files_and_the_containers_log(docker_env, easy_tasks):
    """Bugs: files opened and then deleted held 800 MiB against a 100 MiB cap while the watchdog
    saw 0, and what a process writes to the container's own stdout went to Docker's log file on
    the host's disk, uncapped. Deleted files still held open count; the container keeps no log."""
    task = _task(easy_tasks, 11, disk_mb=100)
    with docker_env.reset(task) as term:
        log = docker_env.client.api.inspect_container(term.id).get("LogPath") or ""
        r = term.run("head -c 200M /dev/zero > /proc/1/fd/1; echo sent", timeout=60)
        assert "sent" in r.output and not term.dead, r
        assert not log or not os.path.exists(log) or os.path.getsize(log) < 1 << 20, \
            (log, os.path.getsize(log))
        r = term.run("for i in 1 2 3 4 5 6; do exec {fd}>/held$i; rm /held$i; head -c 80M /dev/zero >&$fd; "
                     "done; echo wrote", timeout=60)
        time.sleep(E.DISK_CHECK_S * 4)
        r = term.run("echo after")
        assert term.dead and "disk" in r.output.lower(), r
    _gone(docker_env, term)


def test_disk_cap_counts_the_images_volumes(docker_env, tmp_path):
    """Bug: a task image's `VOLUME` gave each container an anonymous volume on the host's disk, which
    neither the writable layer's quota nor its watchdog covers. Its files count against the cap,
    and the volume goes with the container."""
    import shutil
    from conftest import FIXTURE_TASKS
    d = shutil.copytree(FIXTURE_TASKS / "tb2-partial", tmp_path / "tb2-volume")
    (d / "environment" / "Dockerfile").write_text("FROM termrl-base:bookworm\nVOLUME /data\nWORKDIR /app\n")
    task = dataclasses.replace(T.load_tasks(tmp_path)[0], disk_mb=100)
    with docker_env.reset(task) as term:
        mounts = docker_env.client.api.inspect_container(term.id)["Mounts"]
        volumes = [m["Name"] for m in mounts if m["Type"] == "volume"]
        assert volumes, mounts
        term.run("for i in $(seq 8); do head -c 50M /dev/zero > /data/big$i || break; done; echo wrote",
                 timeout=60)
        time.sleep(E.DISK_CHECK_S * 4)
        r = term.run("echo after")
        assert term.dead and "disk" in r.output.lower(), r
    _gone(docker_env, term)
    names = {v["Name"] for v in docker_env.client.api.volumes().get("Volumes") or []}
    assert not set(volumes) & names, volumes


# --- deadlines from outside the container --------------------------------------------------------------

def test_exec_and_grade_have_a_host_side_deadline(docker_env, easy_tasks):
    """Bug: grading ran through `timeout` inside the container; with it replaced, grade() waited for
    the Docker client's 600 s. Every call into a container has a deadline enforced from outside."""
    task = _task(easy_tasks, 8, test_timeout_s=3)
    with docker_env.reset(task) as term:
        term.run("printf '#!/bin/bash\\nwhile :; do :; done\\n' > /usr/bin/timeout")
        t0 = time.monotonic()
        code, out = term.exec("echo hi; sleep 100", timeout=2)
        assert time.monotonic() - t0 < 2 + 3 and code in (124, 137), (code, out)
        term.run("printf '#!/bin/bash\\nwhile :; do :; done\\n' > /usr/local/bin/bash; "
                 "chmod +x /usr/local/bin/bash")
        t0 = time.monotonic()
        g = grading.grade(term)
        assert time.monotonic() - t0 < 3 + 5, g
        assert g.infra_error is None and g.reward == 0.0, g
    _gone(docker_env, term)


# --- shutdown -------------------------------------------------------------------------------------

_ROLLOUT_CHILD = """
import sys, time, threading
sys.path.insert(0, {root!r})
from transformers import AutoTokenizer
import env as E, generated_tasks as G, policy as P, rollout as R
tok = AutoTokenizer.from_pretrained({model!r})
policy = P.ScriptedPolicy(tok, mode="fixed", commands=("sleep 2",) * 40, latency_s=0.05)
cfg = R.RolloutConfig(num_workers=3, group_size=4, max_turns=50, command_timeout_s=30)
e = E.Env()
print("ready", flush=True)
try:
    R.collect(G.generate_easy_tasks(12, seed=0), policy, e, cfg, progress=False)
finally:
    print("left collect", flush=True)
"""


def test_sigterm_during_rollout_stops_at_once_and_leaks_nothing(docker_env, tiny_model_dir):
    """Bug: SIGTERM during a rollout exited only after 25 s, having started 26 new episodes after the
    signal. Now no episode starts after it, running ones end, the process exits within seconds."""
    code = _ROLLOUT_CHILD.format(root=str(ROOT), model=str(tiny_model_dir))
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    api = docker_env.client.api
    pid_filter = {"label": f"termrl.pid={child.pid}"}
    try:
        assert child.stdout.readline().strip() == "ready"
        t_end = time.monotonic() + 60
        while len(api.containers(all=True, filters=pid_filter)) < 3 and time.monotonic() < t_end:
            time.sleep(0.2)
        time.sleep(1)
        since = time.time()
        child.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        assert child.stdout.readline().strip() == "left collect"
        stopped = time.monotonic() - t0
        child.wait(30)
        exited = time.monotonic() - t0
        events = api.events(since=int(since) - 1, until=int(time.time()) + 1, decode=True,
                            filters={"type": "container", "event": "create",
                                     "label": f"termrl.pid={child.pid}"})
        started_after = [e for e in events if e["timeNano"] > since * 1e9]
        assert stopped < 5, stopped  # the running episodes' commands (sleep 2) end with their containers
        assert exited < 30, exited   # + Python tearing torch down, slow on a busy machine
        assert not started_after, started_after
        assert not api.containers(all=True, filters=pid_filter)
        print(f"SIGTERM: rollout stopped after {stopped:.1f}s, process exited after {exited:.1f}s")
    finally:
        child.kill()


# --- infra is the world's fault: nothing inside the container ends an episode as infra ------------

# A command that makes the shell's own watermark read 0 from then on, the framing intact: a
# readonly function `builtin` that passes every call through but `read`.
HIJACK = ("builtin() { if [ \"$1\" = read ]; then __termrl_wm=0; else command builtin \"$@\"; fi; }; "
          "readonly -f builtin")
TAKEDOWNS = {
    "hijacked watermark, then a timeout": (HIJACK, "sleep 30", "echo after"),
    "kill -9 -1": ("kill -9 -1", "echo after"),
    "init killed through the harness: hijacked watermark, then a flood": (HIJACK, "yes", "echo after"),
    "init's child ended by a signal to init": ("kill -TERM 1", "echo after"),
    "init the memory limit's victim": ("for p in /proc/[0-9]*; do echo 1000 > $p/oom_score_adj; done "
                                        "2>/dev/null; python3 -c 'x = bytearray(1 << 34)'", "echo after"),
    "the pid limit full, init's sleep killed": ("for i in $(seq 400); do sleep 300 & done 2>/dev/null; "
                                                "pkill -x sleep", "echo after"),
    "the harness's own exec made to fail": ("chmod 0 /bin/bash /usr/bin/bash; kill -9 $$", "echo after"),
}


@pytest.mark.parametrize("way", list(TAKEDOWNS))
def test_no_command_inside_the_container_makes_its_episode_infra(docker_env, easy_tasks, tiny_tokenizer, way):
    """Bug: a command that redefined `builtin` so the harness's watermark read 0, then a command that
    timed out, had the harness kill the container's init: the episode ended as an infrastructure
    error (masked out of training), an escape from its negative reward. However the container is
    taken down from inside, the episode is the agent's failure: valid, reward 0, the terminal itself
    saying it is dead (no InfraError from it); and what the harness kills is never init."""
    import rollout as R
    from policy import ScriptedPolicy
    with ScriptedPolicy(tiny_tokenizer, "fixed", commands=TAKEDOWNS[way]) as policy:
        traj = R.run_episode(easy_tasks[3], policy, docker_env,
                             R.RolloutConfig(max_turns=4, command_timeout_s=3))
    assert traj.valid and traj.reward == 0.0, (way, traj.finish_reason, traj.error, traj.grade)
    assert traj.finish_reason != "container_stopped", (way, traj.grade)  # the terminal raised InfraError
    if "hijacked" in way:  # the harness's kill spared init: the container still ran at grading
        assert "stopped" not in (traj.grade.get("tampered") or ""), (way, traj.grade)
    if way == "hijacked watermark, then a timeout":
        assert traj.messages[-2]["content"].startswith("after\n"), traj.messages[-2]


def test_close_takes_under_a_second_whatever_is_left_running(docker_env, easy_tasks):
    """Bug: `yes > /dev/stdout &` left running made Terminal.close() take 20 s. A background ticker
    and a writer to the terminal both end with the container within a second."""
    for left in ("while :; do date; sleep 0.1; done &", "yes > /dev/stdout &"):
        term = docker_env.reset(easy_tasks[4])
        term.run(left)
        term.run("sleep 0.5")
        t0 = time.monotonic()
        term.close()
        took = time.monotonic() - t0
        assert took < 1.0, (left, took)
        _gone(docker_env, term)


PRINTER = "(while :; do echo x; sleep 0.1; done) &"


@pytest.mark.parametrize("cmd", [f"readonly __termrl_out; {PRINTER}", f"exec() {{ :; }}; {PRINTER}",
                                 f"readonly __termrl_in; {PRINTER}", f"exec() {{ {PRINTER} }}; {PRINTER}"])
def test_the_command_that_broke_the_framing_carries_the_notice(docker_env, easy_tasks, cmd):
    """Bug: a command that made a harness variable readonly, or defined a function `exec`, and left a
    background printer broke the move of the shell's output away from it: the notice and the unknown
    exit status landed on the next, innocent command, which was not run. Now that command's own
    result says so, and the next one runs normally."""
    with docker_env.reset(easy_tasks[5]) as term:
        r = term.run(cmd, timeout=5)
        r2 = term.run("echo next", timeout=5)
        assert (r2.output, r2.exit_code, r2.shell_restarted) == ("next\n", 0, False), (cmd, r, r2)
        if r.exit_code is None:  # the framing broke: this command's result says so
            assert r.shell_restarted and "changed the shell" in r.output, (cmd, r)
        else:
            assert (r.exit_code, r.shell_restarted) == (0, False), (cmd, r)


def test_an_exec_socket_closed_as_the_session_starts_is_an_ended_exec_tried_again(easy_tasks, monkeypatch):
    """The Docker client's socket for a session's exec can be closed before the session reads it
    (its file descriptor -1: the client's HTTP response was finalised): that start ends as an exec
    that ended (tried once more), not as an error that makes the episode infra (ValueError: file
    descriptor cannot be a negative integer)."""
    import docker
    real, closed = docker.api.client.APIClient.exec_start, []

    def first_one_closed(self, exec_id, *args, **kw):
        out = real(self, exec_id, *args, **kw)
        if kw.get("socket") and not closed:
            closed.append(exec_id)
            sock = out._sock   # the reader, then the socket closed: its descriptor is gone (-1)
            out.close()
            sock.close()
            out._sock = sock
        return out
    monkeypatch.setattr(docker.api.client.APIClient, "exec_start", first_one_closed)
    e = E.Env(warm=0)
    try:
        with e.reset(easy_tasks[0]) as term:
            assert closed and term.run("echo ok").output == "ok\n"
    finally:
        e.close()


def test_the_docker_clients_socket_closed_under_a_running_shell_is_not_its(easy_tasks, monkeypatch):
    """When the garbage collector finalises the Docker client's HTTP response for an exec, urllib3
    closes the reader and then the connection's socket, from whichever thread collects. The shell
    reads a socket of its own, so its commands still run, and so do docker_exec's (the harness's
    kills and reads), which take their socket the same way."""
    import docker
    real, theirs = docker.api.client.APIClient.exec_start, []

    def recorded(self, exec_id, *args, **kw):
        out = real(self, exec_id, *args, **kw)
        if kw.get("socket"):
            theirs.append((out, out._sock))
        return out
    monkeypatch.setattr(docker.api.client.APIClient, "exec_start", recorded)
    e = E.Env(warm=0)
    try:
        with e.reset(easy_tasks[0]) as term:
            assert term.run("echo one").output == "one\n"
            for reader, sock in theirs:  # as urllib3's HTTPResponse.close does: the reader, the socket
                reader.close()
                sock.close()
            out = term.run("sleep 5 & echo two")  # the background job moves the shell to a relay
            assert out.output == "two\n" and out.exit_code == 0, out
            for reader, sock in theirs:
                reader.close()
                sock.close()
            assert term.run("echo three").output == "three\n"
    finally:
        e.close()
