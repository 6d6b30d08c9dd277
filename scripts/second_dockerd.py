"""A second Docker daemon on this machine, beside the first: its own socket, data root, exec root
and pid file, no bridge and no iptables (as scripts/setup.sh starts the first). tests/test_hosts.py
and `bench/bench_env.py --hosts 2` use it to exercise termrl's several-host paths on one machine.

    python scripts/second_dockerd.py [/tmp/termrl-d2]   # starts it, prints its URL; Ctrl-C stops it
                                                       # and removes the folder
"""
import contextlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


class Dockerd:
    """One dockerd under `root` (short: a unix socket path holds at most 107 bytes)."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root or tempfile.mkdtemp(prefix="termrl-d2-", dir="/tmp"))
        self.url = f"unix://{self.root}/docker.sock"
        self.proc = None

    def start(self, timeout: float = 60):
        import docker
        self.root.mkdir(parents=True, exist_ok=True)
        log = open(self.root / "dockerd.log", "ab")
        self.proc = subprocess.Popen(
            ["dockerd", "-H", self.url, "--data-root", str(self.root / "data"),
             "--exec-root", str(self.root / "exec"), "--pidfile", str(self.root / "docker.pid"),
             "--bridge=none", "--iptables=false", "--ip6tables=false"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with contextlib.suppress(Exception):
                docker.DockerClient(base_url=self.url, timeout=5).ping()
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the second dockerd did not come up; see {self.root / 'dockerd.log'}")

    def stop(self, timeout: float = 60):
        """SIGTERM, as `systemctl stop docker` does: the API closes, then the containers are stopped."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def remove(self):
        """Stop it and delete its folder, unmounting what the daemon left mounted there."""
        self.stop()
        mounts = [ln.split()[1] for ln in Path("/proc/mounts").read_text().splitlines()
                  if ln.split()[1].startswith(str(self.root) + "/")]
        for m in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", m], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)


def main():
    d = Dockerd(Path(sys.argv[1]) if len(sys.argv) > 1 else None).start()
    print(f"second dockerd up: {d.url}  (pid {d.proc.pid}); Ctrl-C stops it", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        d.remove()


if __name__ == "__main__":
    main()
