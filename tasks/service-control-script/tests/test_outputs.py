import os
import re
import subprocess
import time
from pathlib import Path

import pytest

PIDFILE = Path("/app/run/worker.pid")
LOG = Path("/app/logs/worker.log")


def ctl(action):
    # a generous timeout: "start" must return promptly even though the worker keeps running
    return subprocess.run(["bash", "/app/workerctl.sh", action], capture_output=True, text=True,
                          timeout=30, stdin=subprocess.DEVNULL)


def alive(pid):
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_for(pred, timeout=15.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


def worker_pids():
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and alive(d.name):
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "/app/worker.py" in cmd and "workerctl" not in cmd:
                pids.append(int(d.name))
    return pids


@pytest.fixture(autouse=True)
def no_worker_before_and_after():
    for pid in worker_pids():
        os.kill(pid, 9)
    wait_for(lambda: not worker_pids())
    PIDFILE.unlink(missing_ok=True)
    yield
    for pid in worker_pids():
        os.kill(pid, 9)


def cmdline(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def started_pid(r):
    m = re.fullmatch(r"started \(pid (\d+)\)", r.stdout.strip())
    assert m, f"unexpected output: {r.stdout!r}"
    pid = int(m.group(1))
    # `cmd &` forks first and execs python a moment later: until then the new pid still shows the
    # script's command line, which a loaded machine stretches to a visible window
    assert wait_for(lambda: "/app/worker.py" in cmdline(pid)), f"pid {pid} never became /app/worker.py"
    return pid


def test_start_runs_worker_in_background():
    t0 = time.monotonic()
    r = ctl("start")
    assert time.monotonic() - t0 < 10, "start did not return promptly"
    assert r.returncode == 0, r.stderr
    pid = started_pid(r)
    assert PIDFILE.read_text().strip() == str(pid)
    assert wait_for(lambda: alive(pid))
    assert wait_for(lambda: LOG.exists() and "heartbeat" in LOG.read_text()), "no heartbeat in the log"


def test_status_running_and_start_is_idempotent():
    pid = started_pid(ctl("start"))
    s = ctl("status")
    assert s.returncode == 0 and s.stdout.strip() == f"running (pid {pid})"
    again = ctl("start")
    assert again.returncode == 0 and again.stdout.strip() == f"already running (pid {pid})"
    assert worker_pids() == [pid]


def test_stop():
    before = LOG.stat().st_size if LOG.exists() else 0
    pid = started_pid(ctl("start"))
    # the worker installs its SIGTERM handler before its first heartbeat
    assert wait_for(lambda: LOG.exists() and "heartbeat" in LOG.read_text()[before:])
    r = ctl("stop")
    assert r.returncode == 0 and r.stdout.strip() == "stopped"
    assert not alive(pid)
    assert not PIDFILE.exists()
    assert wait_for(lambda: "worker stopping" in LOG.read_text()[before:]), "worker was not stopped with SIGTERM"


def test_status_and_stop_when_not_running():
    s = ctl("status")
    assert s.returncode == 3 and s.stdout.strip() == "stopped"
    r = ctl("stop")
    assert r.returncode == 0 and r.stdout.strip() == "not running"


def test_stale_pidfile():
    PIDFILE.parent.mkdir(parents=True, exist_ok=True)
    dead = subprocess.Popen(["true"])
    dead.wait()
    PIDFILE.write_text(f"{dead.pid}\n")
    s = ctl("status")
    assert s.returncode == 3 and s.stdout.strip() == "stopped"
    assert not PIDFILE.exists(), "stale PID file not removed"
    r = ctl("start")
    assert r.returncode == 0 and started_pid(r) != dead.pid


def test_pidfile_pointing_at_other_process():
    PIDFILE.parent.mkdir(parents=True, exist_ok=True)
    PIDFILE.write_text("1\n")  # PID 1 exists but is not the worker
    s = ctl("status")
    assert s.returncode == 3 and s.stdout.strip() == "stopped"
