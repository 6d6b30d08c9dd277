"""hosts.py — the Docker daemons termrl's sandboxes run on.

Which host gets the next container (the least loaded one with free capacity), which hosts are
drained (they stopped answering) and when a drained host is tried again (doubling back-off), and
the per-host counts a run logs. env.Env owns a HostPool; nothing here starts a container.

A host is a URL of the forms DOCKER_HOST takes, with a capacity and optional labels:

    unix:///var/run/docker.sock                    this machine's daemon
    ssh://me@box2,capacity=32,labels=big:amd64     another machine's, over ssh (its ~/.ssh/config, agent)
    tcp://box3:2376,capacity=16,tls=~/.docker/box3 TLS with client certificates (ca.pem cert.pem key.pem)

No hosts configured: the daemon DOCKER_HOST names (the local socket by default), unlimited, as before.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

PROBE_TIMEOUT_S = 5.0    # a ping slower than this is a host that stopped answering
CHECK_EVERY_S = 2.0      # how often a live host is pinged (an episode's own failure checks at once)
BACKOFF_S = (1.0, 60.0)  # a drained host is retried after 1 s, then 2, 4, ... at most 60 s apart
TLS_FILES = ("ca.pem", "cert.pem", "key.pem")
log = logging.getLogger("termrl.hosts")


class HostsDown(RuntimeError):
    """Every Docker host stopped answering for longer than env.hosts_down_wait_s: the run stops
    here (not an InfraError: masking every episode would train on nothing without saying so)."""


@dataclass
class HostSpec:
    url: str                 # "" = the daemon DOCKER_HOST names (docker.from_env)
    capacity: int = 0        # containers at once on this host; 0 = no limit
    labels: list = field(default_factory=list)
    tls: str = ""            # folder of ca.pem, cert.pem, key.pem for tcp://
    name: str = ""


def parse_host(spec) -> HostSpec:
    """A host from a config entry: "URL[,capacity=N][,labels=a:b][,tls=DIR][,name=X]" or the same as
    a mapping. Plain tcp:// (no TLS) is refused: whoever reaches that port is root on the machine."""
    if isinstance(spec, str):
        url, *opts = [p.strip() for p in spec.split(",")]
        fields = {"url": url}
        for o in opts:
            k, eq, v = o.partition("=")
            if not eq:
                raise ValueError(f"docker host {spec!r}: {o!r} is not key=value "
                                 "(capacity=, labels=, tls=, name=)")
            fields[k.strip()] = v.strip()
    elif isinstance(spec, dict):
        fields = dict(spec)
    else:
        raise ValueError(f"docker host {spec!r}: expected 'URL,capacity=N' or a mapping with url and "
                         "capacity")
    unknown = set(fields) - {"url", "capacity", "labels", "tls", "name"}
    if unknown:
        raise ValueError(f"docker host {spec!r}: unknown field(s) {sorted(unknown)}; "
                         "known: url, capacity, labels, tls, name")
    labels = fields.get("labels") or []
    labels = [x for x in labels.split(":") if x] if isinstance(labels, str) else [str(x) for x in labels]
    try:
        capacity = int(fields.get("capacity") or 0)
    except ValueError:
        raise ValueError(f"docker host {spec!r}: capacity must be a whole number of containers") from None
    if capacity < 0:
        raise ValueError(f"docker host {spec!r}: capacity must be >= 0 (0 = no limit)")
    h = HostSpec(str(fields.get("url") or ""), capacity, labels,
                 os.path.expanduser(str(fields.get("tls") or "")), str(fields.get("name") or ""))
    check_transport(h)
    h.name = h.name or _short_name(h.url)
    return h


def _short_name(url: str) -> str:
    if not url:
        return "local"
    scheme, _, rest = url.partition("://")
    rest = rest.rstrip("/")
    return rest.rsplit("@", 1)[-1] if scheme in ("ssh", "tcp", "https") else rest


def check_transport(h: HostSpec):
    """Only authenticated transports: a local socket, ssh, or TCP with TLS client certificates."""
    scheme = h.url.partition("://")[0] if "://" in h.url else ""
    if not h.url or scheme in ("unix", "npipe", "ssh"):
        if h.tls:
            raise ValueError(f"docker host {h.url or 'local'}: tls= applies to tcp:// hosts only")
        return
    if scheme in ("tcp", "https", "http"):
        if not h.tls or scheme == "http":
            raise ValueError(
                f"docker host {h.url}: plain TCP is refused (anyone who reaches that port controls the "
                f"machine as root). Use ssh://user@{_short_name(h.url).split(':')[0]} (simplest: the ssh "
                "user must be in the docker group there), or serve the daemon with --tlsverify and add "
                ",tls=DIR with the client's ca.pem, cert.pem and key.pem")
        missing = [f for f in TLS_FILES if not (Path(h.tls) / f).is_file()]
        if missing:
            raise ValueError(f"docker host {h.url}: tls folder {h.tls} lacks {', '.join(missing)} "
                             "(the client certificate, its key and the CA that signed the daemon's)")
        return
    raise ValueError(f"docker host {h.url!r}: unknown scheme; use unix://, ssh:// or tcp:// with tls=DIR")


def connect(docker, h: HostSpec, timeout: float):
    """A docker client for the host (docker: the SDK module, imported by the caller)."""
    if not h.url:
        return docker.from_env(timeout=timeout, max_pool_size=64)
    tls = False
    if h.tls:
        d = Path(h.tls)
        tls = docker.tls.TLSConfig(client_cert=(str(d / "cert.pem"), str(d / "key.pem")),
                                   ca_cert=str(d / "ca.pem"), verify=True)
    url = "tcp://" + h.url.split("://", 1)[1] if h.url.startswith("https://") else h.url
    # ssh:// through the system's ssh client: its config, keys and agent, as the docker CLI does
    return docker.DockerClient(base_url=url, tls=tls, timeout=timeout, max_pool_size=64,
                               use_ssh_client=url.startswith("ssh://"))


class Host:
    """One daemon: its clients, its load, whether it answers. Counters change under the pool's lock;
    env.Env fills in what it learns of the daemon (clients, networks, images, storage quota)."""

    def __init__(self, spec: HostSpec):
        self.spec, self.name = spec, spec.name
        self.client = self.ops = self.probe = None  # docker clients: images (long timeout), containers, pings
        self.starts_gate = None          # at most env's max_concurrent_starts container starts at once
        self.networks: set[str] = set()
        self.images: dict[str, str] = {}
        self.disk_quota = False
        self.up = True
        self.epoch = 0             # +1 at each drain: a container started before it is lost
        self.running = 0           # containers held here (episodes, warm pool, starts under way)
        self.failed = 0            # containers lost at a drain (less those that outlived it), failed starts
        self.starts, self.start_s = 0, 0.0   # since the last stats(): container starts and their seconds
        self.retry_at, self.backoff = 0.0, BACKOFF_S[0]
        self.down_since: float | None = None
        self.probing_since = 0.0   # when the retry under way began (due)
        self.failed_probe: float | None = None  # when the last failed retry since the drain began
        self.why = ""
        # whether /proc, cgroups and the overlay dirs of this machine may be used for its containers:
        # only once /proc/<pid>/cgroup names the container (terminal.Terminal checks); a test sets it False
        # to take the Docker-API path a daemon on another machine needs
        self.host_side = True
        self.lost: set[str] = set()  # ids of containers lost at a drain, removed when the host rejoins

    def free(self) -> bool:
        return self.up and (not self.spec.capacity or self.running < self.spec.capacity)

    def load(self) -> float:
        return self.running / self.spec.capacity if self.spec.capacity else self.running / 1e6


class HostPool:
    """Placement and health of the hosts. `lock` is the Env's condition: a release or a rejoin wakes
    resets waiting for room."""

    def __init__(self, hosts: list[Host], lock: threading.Condition, down_wait_s: float):
        self.hosts, self.lock, self.down_wait_s = hosts, lock, down_wait_s
        self.events: list[tuple[float, str, str]] = []  # (time.time(), host, "drained: why" | "rejoined")

    def place(self, ok=lambda h: True, among: list | None = None) -> Host:
        """The least loaded live host of `among` (default: all) with room (call with lock held; waits
        for one). ok(h) may make room on h (e.g. by evicting a pooled container) and says whether h
        can take one now. HostsDown when none of them answered for down_wait_s."""
        among = self.hosts if among is None else among
        while True:
            self._fail_if_all_down(among)
            for h in sorted((h for h in among if h.up), key=lambda h: h.load()):
                if ok(h):
                    h.running += 1
                    return h
            self.lock.wait(0.5)

    def live(self) -> Host:
        """The first live host (call with lock held; waits while none is, HostsDown as place)."""
        while True:
            self._fail_if_all_down()
            if up := [h for h in self.hosts if h.up]:
                return up[0]
            self.lock.wait(0.5)

    def _fail_if_all_down(self, among: list | None = None):
        """HostsDown once every host of `among` is down and failed a retry begun after its
        down_wait_s: a daemon that answers again within the wait is always asked (due) before the
        run stops (tests/test_hosts.py::test_a_daemon_stopped_shorter_than_the_wait_loses_no_episode)."""
        among = self.hosts if among is None else among
        if any(h.up for h in among):
            return
        if all(h.failed_probe is not None and h.failed_probe >= (h.down_since or 0.0) + self.down_wait_s
               for h in among):
            which = " with the labels needed" if among != self.hosts else ""
            raise HostsDown(f"every Docker host{which} has stopped answering for over "
                            f"{self.down_wait_s:g} s ("
                            + "; ".join(f"{h.name}: {h.why}" for h in among)
                            + "); restart the daemons, or raise env.hosts_down_wait_s")

    def release(self, h: Host):
        with self.lock:
            h.running -= 1
            self.lock.notify_all()

    def drain(self, h: Host, why: str) -> bool:
        """Mark h down, under the lock (re-entrant: a caller may hold it); False when it already was.
        tests/test_hosts.py::test_a_daemon_down_at_start_is_named_by_its_own_error"""
        with self.lock:
            if not h.up:
                return False
            h.up, h.epoch, h.why = False, h.epoch + 1, why
            h.down_since, h.backoff, h.failed_probe = time.monotonic(), BACKOFF_S[0], None
            h.retry_at = h.down_since + h.backoff
            self.events.append((time.time(), h.name, f"drained: {why}"))
            log.warning("docker host %s stopped answering (%s): drained, its %d container(s) lost; "
                        "retried in %g s", h.name, why, h.running, h.backoff)
            self.lock.notify_all()
            return True

    def answers(self, h: Host) -> str | None:
        """None when h answers a ping within PROBE_TIMEOUT_S, else why not."""
        try:
            if h.probe is None:
                return "not connected"
            h.probe.ping()
            return None
        except Exception as e:
            return f"{type(e).__name__}: {str(e)[:200]}"

    def due(self) -> list[Host]:
        """Drained hosts whose back-off has run out (call with lock held); their next try is pushed back,
        never past the end of down_wait_s: the try that decides whether the run stops is made then."""
        now, out = time.monotonic(), []
        for h in self.hosts:
            if not h.up and now >= h.retry_at:
                h.backoff = min(BACKOFF_S[1], h.backoff * 2)
                deadline = (h.down_since or now) + self.down_wait_s
                h.retry_at = now + h.backoff if now >= deadline else min(now + h.backoff, deadline)
                h.probing_since = now
                out.append(h)
        return out

    def rejoin(self, h: Host, why: str | None = None):
        """A retry of h (begun at due) succeeded; or failed, why being the daemon's answer."""
        with self.lock:
            if why:
                h.failed_probe, h.why = h.probing_since, why
                self.lock.notify_all()
                return
            h.up, h.down_since, h.why = True, None, ""
            self.events.append((time.time(), h.name, "rejoined"))
            log.warning("docker host %s answers again: rejoined", h.name)
            self.lock.notify_all()

    def stats(self) -> dict:
        """Per host: running containers, lost/failed ones (cumulative), up, mean start latency of the
        starts since the last call (then reset), for metrics.jsonl."""
        out = {}
        with self.lock:
            for h in self.hosts:
                out[f"hosts/{h.name}/running"] = h.running
                out[f"hosts/{h.name}/failed"] = h.failed
                out[f"hosts/{h.name}/up"] = int(h.up)
                out[f"hosts/{h.name}/start_s"] = round(h.start_s / h.starts, 3) if h.starts else None
                h.starts, h.start_s = 0, 0.0
        return out

    def postfix(self) -> str:
        """One short string for a progress bar: name=running(/capacity), ! when drained."""
        return " ".join(f"{h.name}={h.running}" + (f"/{h.spec.capacity}" if h.spec.capacity else "")
                        + ("" if h.up else "!") for h in self.hosts)
