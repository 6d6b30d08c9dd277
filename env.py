"""env.py — the environment: terminals for tasks on one or more Docker hosts.

Images built once (tagged by content) and shared between hosts, each container placed on the least
loaded live host, a warm pool of started containers, a host that stops answering drained and retried,
a disk watchdog where the storage driver has no quota. The terminal itself is terminal.py's, grading
grading.py's; `python tasktool.py validate|shell` is the command line.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import os
import re
import shlex
import tarfile
import threading
import time
import weakref
from collections import defaultdict
from functools import partial
from pathlib import Path

import grading
from container import (CAPS, LABEL, SHUTDOWN, BuildError, HostDown, InfraError, install_cleanup, owner_labels,
                       register, remove, sweep_stale)
from hosts import CHECK_EVERY_S, PROBE_TIMEOUT_S, Host, HostPool, connect, parse_host
from task_folders import HIDDEN_FILES, Task, safe_files
from terminal import OUTPUT_CAP, Terminal

FILE_SIZE_LIMIT = 1 << 30   # RLIMIT_FSIZE in containers: one runaway `yes > f` cannot fill the host disk
CONTAINER_CALL_TIMEOUT_S = 60  # the Docker client's timeout for calls about one container (not builds)
# the disk watchdog's period, where the storage driver has no quota (README "Disk cap")
DISK_CHECK_S = 0.5



def _context_files(task: Task) -> list[tuple[str, Path]]:
    """The build context's files, checked again as the loader checked them (safe_files): a folder
    changed after load, a file swapped for a link to a host file, is a TaskError here, not a host
    file in the image
    (tests/test_task_folders.py::test_a_context_file_linked_out_after_load_is_refused_at_build)."""
    ctx = task.build_context
    skip = HIDDEN_FILES if task.layout == "tb1" else set()
    return [(str(p.relative_to(ctx)), p) for p in safe_files(ctx, task.path or ctx)
            if not (set(p.relative_to(ctx).parts[:1]) & skip)]


def _connect(docker, h: Host, max_starts: int) -> str | None:
    """Clients for h (max_starts container starts at a time) and what Env needs to know of its daemon;
    None, or why it failed."""
    try:
        if h.client is None:
            h.client = connect(docker, h.spec, 600)  # builds and image loads take minutes
            # container calls take seconds: a daemon that hangs (not refuses) holds an episode's
            # call in flight this long at most, not 600 s (the drain ends its later ones at once)
            h.ops = connect(docker, h.spec, CONTAINER_CALL_TIMEOUT_S)
            h.probe = connect(docker, h.spec, PROBE_TIMEOUT_S)
            h.starts_gate = threading.Semaphore(max_starts)
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


def _connect_all(docker, pool: HostPool, max_starts: int) -> list[Host]:
    """The hosts of pool that answer, connected (_connect), the others drained; InfraError naming each
    host's own error when none answers."""
    for h in pool.hosts:
        if why := _connect(docker, h, max_starts):
            pool.drain(h, why)
    live = [h for h in pool.hosts if h.up]
    if not live:
        raise InfraError("cannot reach the Docker daemon"
                         + "".join(f"; {h.name}: {h.why}" for h in pool.hosts)
                         + " (run `bash scripts/setup.sh` for this machine's)")
    return live


def _networks(live: list, build: str, agent: str, grading: str) -> tuple[str, str, str]:
    """The three networks (README "Running official Terminal-Bench tasks"): image builds, the agent's
    episode (only tasks that allow_internet, and only when this is not "none"), and grading, joined
    once the agent's processes are gone by tasks whose tests install their runner. "default" is the
    daemon's bridge where it has one, else none. Every live host must have the networks named."""
    names = live[0].networks
    resolve = lambda n: ("bridge" if "bridge" in names else "none") if n == "default" else n  # noqa: E731
    for what, n in [("build", build), ("agent", agent), ("grading", grading)]:
        for h in live:
            if resolve(n) not in h.networks | {"none"}:
                raise ValueError(f"env.{what}_network {n!r}: host {h.name} has no such docker network; "
                                 "`docker network ls` lists them (or use none / default)")
    return "default" if resolve(build) == "bridge" else resolve(build), resolve(agent), resolve(grading)


def _fits(h: Host, key: tuple) -> bool:
    """Whether h has every label the task of key needs (Task.host_labels)."""
    return set(key[8]) <= set(h.spec.labels)


def _create(client, key: tuple, labels: dict, disk_quota: bool) -> str:
    """Create (not start) a container for key: the image's ENTRYPOINT runs as in Harbor, with `sleep
    infinity` as its command (what it starts is the image's: grading.stop_agent keeps it); none:
    sleep itself."""
    image, _, _, _, _, workdir, variables, _, _ = key
    entry = client.api.inspect_image(image)["Config"].get("Entrypoint") or None
    return client.api.create_container(
        image, entrypoint=entry or ["sleep", "infinity"], command=["sleep", "infinity"] if entry else [],
        working_dir=workdir, labels=labels, environment=dict(variables), hostname="termrl",
        host_config=client.api.create_host_config(**_limits(key, disk_quota)))["Id"]


def _sweep_own(h: Host, token: str, live: dict):
    """What a rejoining host still holds of the Env whose containers carry token: a container that
    outlived the outage (still running) was not lost after all (h.failed counted it at the drain): it
    goes on serving its open terminal (`live`, by id: adopted) or is removed by label; one that
    stopped with its daemon is removed and stays counted. Then stale containers
    (tests/test_hosts.py::test_a_daemon_stopped_shorter_than_the_wait_loses_no_episode)."""
    for c in h.client.api.containers(all=True, filters={"label": f"{LABEL}.env={token}"}):
        if c.get("State") == "running":
            h.failed = max(0, h.failed - 1)
            if c["Id"] in live and not live[c["Id"]].closed:
                live[c["Id"]].adopt()
                continue
        remove(h.client, c["Id"])
    h.lost.clear()
    sweep_stale(h.client)


def _limits(key: tuple, disk_quota: bool) -> dict:
    """The Docker host config of a container for key: its task's limits, every capability but CAPS
    dropped, and a storage quota where the host's driver has one (else Env's disk watchdog)."""
    _, memory_mb, cpus, pids, net, _, _, disk_mb, _ = key
    fsize = min(FILE_SIZE_LIMIT, disk_mb << 20)
    host_config = dict(
        init=True, network_mode=net, mem_limit=f"{memory_mb}m", memswap_limit=f"{memory_mb}m",
        nano_cpus=int(cpus * 1e9), pids_limit=pids, cap_drop=["ALL"], cap_add=CAPS,
        security_opt=["no-new-privileges"], privileged=False,
        ulimits=[{"Name": "fsize", "Soft": fsize, "Hard": fsize}],
        # no log: the container's stdout (anything may write to /proc/1/fd/1) would go to a file on
        # the host's disk that no cap covers (test_hostile.test_disk_cap_counts_deleted_open_files_*)
        log_config={"Type": "none", "Config": {}})
    if disk_quota:
        host_config["storage_opt"] = {"size": f"{disk_mb}M"}
    return host_config


class _Images:
    """The tasks' images on every host: given, or built once from a task's Dockerfile (tagged by its
    content); a host that lacks one loads it from a host that has it (`docker save | docker load`)."""

    def __init__(self, hosts: list, lock, docker, build_network: str):
        self._hosts, self._lock, self._docker, self.build_network = hosts, lock, docker, build_network
        self._build_locks: dict[str, threading.Lock] = defaultdict(threading.Lock)

    def image(self, task: Task, host: Host) -> str:
        """The image tag for task: given, or built from its Dockerfile once (tag = content hash) on
        host; other hosts load it from one that has it when they first need it (ensure)."""
        if task.image:
            self.ensure(task.image, host)
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
        self.ensure(tag, host, lambda: self._build(host, task, tag, files))
        return tag

    def ensure(self, tag: str, host: Host, build=None):
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
                src = next((h for h in self._hosts if h is not host and h.up and tag in h.images), None)
                if src is not None:
                    try:
                        host.client.api.load_image(src.client.api.get_image(tag))
                    except Exception as e:
                        raise InfraError(f"copying image {tag} from host {src.name} to {host.name} "
                                         f"failed: {e}") from None
                elif build is not None:
                    build()
                else:
                    raise InfraError(f"image {tag} is not available locally (host {host.name}) nor on "
                                     "another live host; run `bash scripts/setup.sh` to seed it") from None
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
                    raise BuildError(f"building {task.name} ({task.dockerfile}) failed: "
                                     f"{chunk['error'].strip()}\n" + "".join(log[-20:]))
                log.append(chunk.get("stream", ""))
        except InfraError:
            raise
        except Exception as e:
            raise InfraError(f"building {task.name} ({task.dockerfile}) failed: {e}") from None


class _WarmPool:
    """Started containers kept ready per container config (image + limits), `warm` per live host, once
    that config was reset 3 times or passed to Env.warmup; only the `max_pools` most recently used
    configs keep theirs. Every call is made with Env's lock held."""

    def __init__(self, warm: int, max_pools: int):
        self.warm, self.max_pools = warm, max_pools
        # container config -> ready terminals (any host), least recent first
        self.ready: dict[tuple, list[Terminal]] = {}
        # (config, host name) -> starts under way for the pool
        self.starting: dict[tuple, int] = defaultdict(int)
        self._resets: dict[tuple, int] = defaultdict(int)
        self._warmed: set[tuple] = set()

    def want(self, keys: set):
        """Keep pools for these configs from now on (Env.warmup)."""
        self._warmed |= keys
        for k in keys:
            self.ready.setdefault(k, [])

    def take(self, key: tuple) -> tuple[Terminal | None, list[Terminal]]:
        """A ready terminal for key (or None), and the terminals of the pools given up to keep max_pools."""
        self._resets[key] += 1
        pool, term = self.ready.pop(key, []), None
        ready = [t for t in pool if t.host_ok()]
        if ready:  # the one on the least loaded host
            term = min(ready, key=lambda t: t.host.load())
            pool.remove(term)
        if key in self._warmed or self._resets[key] >= 3:  # one-off configs get no pool
            self.ready[key] = pool  # now the most recently used config
        evicted = []
        while len(self.ready) > self.max_pools:  # keep pools only for the configs in use lately
            evicted += self.ready.pop(next(iter(self.ready)))
        return term, evicted

    def deficit(self, hosts: list):
        """(config, host) of a pool short of `warm` containers (started or starting) on a host with room,
        or None."""
        for k, v in self.ready.items():
            for h in hosts:
                held = sum(t.host is h for t in v) + self.starting[k, h.name]
                if h.free() and _fits(h, k) and held < self.warm:
                    return k, h
        return None

    def short(self, keys: set, hosts: list) -> bool:
        """Whether a pool of keys has fewer than `warm` ready containers on a host with room."""
        return any(sum(t.host is h for t in self.ready.get(k, [])) < self.warm
                   for k in keys for h in hosts if h.free() and _fits(h, k))

    def give_up(self, h: Host) -> Terminal | None:
        """A pooled terminal on h, out of its pool (a full host makes room for an episode), or None."""
        victim = next((t for pool in self.ready.values() for t in pool if t.host is h), None)
        if victim is not None:
            for pool in self.ready.values():
                if victim in pool:
                    pool.remove(victim)
        return victim

    def drop_host(self, h: Host) -> list[Terminal]:
        """The pooled terminals on h (drained), out of their pools."""
        lost = [t for pool in self.ready.values() for t in pool if t.host is h]
        for pool in self.ready.values():
            pool[:] = [t for t in pool if t.host is not h]
        return lost

    def clear(self) -> list[Terminal]:
        """Every pooled terminal, the pools emptied."""
        pooled = [t for v in self.ready.values() for t in v]
        self.ready.clear()
        return pooled


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
            raise ValueError(f"env.hosts: two hosts share a name ({[s.name for s in specs]}); "
                             "add name=X to one")
        self._lock = threading.Condition()
        self._hosts = HostPool([Host(s) for s in specs], self._lock, hosts_down_wait_s)
        self._token = os.urandom(6).hex()  # labels this Env's containers: a rejoining host is swept of them
        live = _connect_all(self._docker, self._hosts, self._max_starts)
        self.client = live[0].client  # the first live host's: image lookups, `tasktool.py shell`
        self.output_cap = output_cap
        self.build_network, self.agent_network, self.grading_network = _networks(
            live, build_network, agent_network, grading_network)
        self._images = _Images(self._hosts.hosts, self._lock, docker, self.build_network)
        if multi_reward not in ("mean", "min", "error"):
            raise ValueError(f"multi_reward must be mean, min or error, got {multi_reward!r}")
        self.multi_reward = multi_reward
        self._pool = _WarmPool(warm, max_pools)
        self._closed = False
        self._terms = weakref.WeakSet()  # every terminal started here (the disk watchdog's list)
        self.swept = sum(sweep_stale(h.client) for h in live)
        install_cleanup()
        self._fillers = [threading.Thread(target=self._fill_loop, daemon=True)
                         for _ in range(min(2, max_concurrent_starts))]
        self._fillers += [threading.Thread(target=self._disk_loop, daemon=True),
                          threading.Thread(target=self._host_loop, daemon=True)]
        for th in self._fillers:
            th.start()

    # -- hosts ---------------------------------------------------------------------------------
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
        """Treat h as down: its containers lost (HostDown; failed, less survivors: _sweep_own); retried."""
        with self._lock:
            if not self._hosts.drain(h, why):
                return
            h.failed += h.running
            lost = self._pool.drop_host(h)
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
                if (why := _connect(self._docker, h, self._max_starts)) is None:
                    with contextlib.suppress(Exception):  # what is left is swept at the next start
                        _sweep_own(h, self._token, {t.id: t for t in list(self._terms) if t.host is h})
                self._hosts.rejoin(h, why)  # why: it still does not answer
            time.sleep(CHECK_EVERY_S)

    def host_stats(self) -> dict:
        """Per host: running / failed containers, up, mean start latency lately (metrics.jsonl)."""
        return self._hosts.stats()

    def hosts_postfix(self) -> str:
        """name=running[/capacity] per host, `!` after a drained one; "" with the one default host."""
        return self._hosts.postfix() if len(self._hosts.hosts) > 1 or self._hosts.hosts[0].spec.url else ""

    def live_host(self) -> Host:
        """The first live host (waits while none is; HostsDown when none is left)."""
        with self._lock:
            return self._hosts.live()

    # -- images -------------------------------------------------------------------------------
    def image(self, task: Task) -> str:
        """The image tag for task (_Images.image) on a live host."""
        return self._images.image(task, self.live_host())

    # -- containers ----------------------------------------------------------------------------
    def network(self, task: Task) -> str:
        """The network task's container starts on: env.agent_network when the task allows the
        internet, else "none"."""
        return self.agent_network if task.allow_internet else "none"

    def _key(self, task: Task) -> tuple:
        net = self.network(task)
        return (self.image(task), task.memory_mb, task.cpus, task.pids, net, task.workdir,
                tuple(sorted(task.env.items())), task.disk_mb, tuple(sorted(task.host_labels)))

    def _room(self, h: Host) -> bool:
        """Whether h can take one more container now (call with lock held); a full host gives up a
        pooled container (closed in the background) so an episode never waits on the warm pool."""
        if self._closed:
            raise InfraError("Env is closed")
        if h.free():
            return True
        victim = self._pool.give_up(h) if h.up else None
        if victim is not None:
            threading.Thread(target=victim.close, daemon=True).start()
        return False

    def _place(self, key: tuple) -> Host:
        """Reserve room on the least loaded live host with the labels key needs (waits for one;
        HostsDown when none of them answers)."""
        fit = [h for h in self._hosts.hosts if _fits(h, key)]
        if not fit:
            raise InfraError(f"the task needs Docker host labels {list(key[8])}; no host in env.hosts has "
                             "them all (" + ", ".join(f"{h.name}: {h.spec.labels}" for h in self._hosts.hosts)
                             + ")")
        with self._lock:
            if self._closed or SHUTDOWN.is_set():
                raise InfraError("Env is closed" if self._closed else "shutting down (SIGINT/SIGTERM)")
            return self._hosts.place(self._room, fit)

    def _start(self, key: tuple, host: Host) -> Terminal:
        """A new container for key on host, where room was reserved (released if this fails). HostDown
        when the host stopped answering."""
        image, _, _, _, net, _, _, disk_mb, _ = key
        client, t0 = host.ops, time.monotonic()
        with host.starts_gate:
            try:
                if SHUTDOWN.is_set():
                    raise InfraError("shutting down (SIGINT/SIGTERM): no new containers")
                self._images.ensure(image, host)
                try:
                    labels = {**owner_labels(), f"{LABEL}.env": self._token}
                    cid = _create(client, key, labels, host.disk_quota)
                except self._docker.errors.APIError as e:
                    if not (host.disk_quota and "storage" in str(e).lower()):
                        raise
                    host.disk_quota = False  # e.g. xfs mounted without pquota: the watchdog instead
                    raise _Retry() from None
                register(client, cid)
                client.api.start(cid)
                if SHUTDOWN.is_set():  # the signal's cleanup may have run before this container existed
                    raise InfraError("shutting down (SIGINT/SIGTERM): no new containers")
                term = Terminal(
                    client, cid, key, self.output_cap, host,
                    host_answers=partial(self.check_host, host, fresh=True),
                    drain_host=partial(self.drain, host), on_close=partial(self._hosts.release, host),
                    harness_runs=self.harness_runs, grading_network=self.grading_network,
                    multi_reward=self.multi_reward, disk_cap_mb=disk_mb, disk_quota=host.disk_quota,
                    network=net)
                self._terms.add(term)
                with self._lock:
                    host.starts, host.start_s = host.starts + 1, host.start_s + time.monotonic() - t0
                return term
            except _Retry:
                err = None
            except Exception as e:
                err = e
                if "cid" in locals():
                    remove(client, cid)
        if err is None:
            return self._start(key, host)
        self._hosts.release(host)
        if not isinstance(err, BuildError) and not self.check_host(host, fresh=True):
            with self._lock:
                host.failed += 1
            raise HostDown(f"docker host {host.name} stopped answering while starting a container: "
                           f"{err}") from None
        if isinstance(err, InfraError):
            raise err
        raise InfraError(f"starting a container from {image} on {host.name} failed: {err}") from None

    def _start_placed(self, key: tuple) -> Terminal:
        """_start on the least loaded live host, elsewhere while a host fails (HostsDown: none left)."""
        while True:
            try:
                return self._start(key, self._place(key))
            except HostDown:
                continue

    def _fill_loop(self):
        while True:
            with self._lock:
                while not self._closed and not (slot := self._pool.deficit(self._hosts.hosts)):
                    self._lock.wait(1.0)
                if self._closed:
                    return
                key, host = slot
                host.running += 1  # reserved, as _place does
                self._pool.starting[key, host.name] += 1  # so the other filler moves on to the next slot
            try:
                term = self._start(key, host)
            except Exception:
                term = None
            with self._lock:
                self._pool.starting[key, host.name] -= 1
                if term is not None and not self._closed and key in self._pool.ready and term.host.up:
                    self._pool.ready[key].append(term)
                    self._lock.notify_all()
                    continue
            if term is not None:
                term.close()
            else:
                time.sleep(1.0)  # the daemon is struggling: back off instead of hammering it

    def _disk_loop(self):
        """The disk cap (what no storage quota covers: Terminal.check_disk) and the file-count ceiling
        (which no storage quota keeps): a terminal past either is ended
        (test_hostile.test_disk_cap_stops_writes_past_it, test_file_count_is_capped_like_bytes)."""
        while not self._closed:
            for term in list(self._terms):
                if (term.disk_cap_mb or term.local) and not term.closed and not term.dead and term.host_ok():
                    with contextlib.suppress(Exception):  # a container removed meanwhile
                        term.check_disk()
            time.sleep(DISK_CHECK_S)

    def warmup(self, tasks, wait: bool = True, timeout: float = 120):
        """Keep `warm` started containers ready for each distinct container config of tasks, on every
        live host with room for them."""
        keys = {self._key(t) for t in tasks}
        with self._lock:
            self._pool.want(keys)
            self._lock.notify_all()
            end = time.monotonic() + timeout
            while wait and self._pool.warm and self._pool.short(keys, self._hosts.hosts):
                if time.monotonic() > end:
                    break
                self._lock.wait(0.2)

    def reset(self, task: Task) -> Terminal:
        """A fresh terminal for task (from the warm pool when one is ready). May raise InfraError, or
        HostsDown when every Docker host has stopped answering for env.hosts_down_wait_s."""
        key = self._key(task)
        with self._lock:
            if self._closed or SHUTDOWN.is_set():
                raise InfraError("Env is closed" if self._closed else "shutting down (SIGINT/SIGTERM)")
            term, evicted = self._pool.take(key)
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
                    raise HostDown(f"docker host {term.host.name} stopped answering during task "
                                   f"{task.name}'s setup")
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
                return not grading.verify(term)[1]
        except InfraError:
            return False

    def close(self):
        with self._lock:
            self._closed = True
            pooled = self._pool.clear()
            self._lock.notify_all()
        for t in pooled:
            t.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _Retry(Exception):
    """The daemon refused a storage quota: start again without one."""


def make_env(cfg) -> Env:
    """The Env of a run config's env section; a bad setting or an unreachable daemon ends the
    program with what to fix (training and evaluation both start here)."""
    try:
        return Env(**dataclasses.asdict(cfg.env))
    except ValueError as e:  # a setting of the config's env section
        raise SystemExit(f"config: {e}") from None
    except Exception as e:  # docker SDK errors differ by cause; the fix is the same
        raise SystemExit(f"Docker is not reachable ({type(e).__name__}: {e}). Start the daemon (dockerd "
                         f"or `systemctl start docker`) and make sure this user may use "
                         f"/var/run/docker.sock.")
