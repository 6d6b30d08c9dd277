"""inspection.py — a local daemon's container seen from the host: its processes (/proc), cgroups,
sockets, the files of its root and its overlay's writable layer.

The container is the agent's, so every read here is one it cannot turn against the host: paths are
resolved inside the container's root without following a link out of it, nothing on another
filesystem (a device, /proc/kmsg, a bind mount) is read, and every read is bounded in bytes or
entries (tests/test_tampering.py::test_host_side_inspection_*). No Docker call and no task: container.py,
terminal.py and grading.py call these; for a remote daemon none applies (its pids mean nothing here).
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import re
import socket
import stat
import struct
import threading
from pathlib import Path


def proc_stat(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name, which may hold spaces and parentheses
    (so the split is at its last ")"): [0] the state, [1] the parent pid, [19] the start time
    (proc(5) fields 3, 4 and 22). OSError when the process is gone. KILL_INSIDE's `_field` parses the
    same way."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def repair_dev_null(host_pid: int):
    """Recreate a container's /dev/null from the host if the agent deleted it: `docker exec` cannot
    start any process without it (test_hostile.test_deleted_dev_null_*). A no-op for a remote daemon.
    Every call works on the container's /dev by dir fd, so a link the agent put there is never
    followed on the host (the chmod goes to the node just made, checked to be one)."""
    with contextlib.suppress(OSError):
        dev = open_in_root(f"/proc/{host_pid}/root", "/dev")
        try:
            try:
                st = os.stat("null", dir_fd=dev, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is not None and not stat.S_ISLNK(st.st_mode):
                return
            if st is not None:
                os.unlink("null", dir_fd=dev)
            os.mknod("null", 0o666 | stat.S_IFCHR, os.makedev(1, 3), dir_fd=dev)
            node = os.open("null", os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dev)
            try:
                if stat.S_ISCHR(os.fstat(node).st_mode):
                    os.chmod(f"/proc/self/fd/{node}", 0o666)
            finally:
                os.close(node)
        finally:
            os.close(dev)


_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_LINKS = 40  # symlinks followed in one lookup, as the kernel allows


def open_in_root(root: str, path: str) -> int:
    """An O_PATH fd of path as a process whose root is `root` sees it: every component is opened by
    dir fd without following it, and a symlink is resolved by its text inside root (an absolute
    target or `..` never leaves root), so no link the container made is followed on the host
    (tests/test_tampering.py::test_host_side_inspection_never_reads_a_host_file). OSError when absent."""
    stack = [os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)]
    parts, links = [p for p in path.split("/") if p], 0
    try:
        while parts:
            part = parts.pop(0)
            if part == ".":
                continue
            if part == "..":
                if len(stack) > 1:
                    os.close(stack.pop())
                continue
            fd = os.open(part, _PATH_FLAGS, dir_fd=stack[-1])
            st = os.fstat(fd)
            if stat.S_ISLNK(st.st_mode):
                os.close(fd)
                links += 1
                if links > _MAX_LINKS:
                    raise OSError(40, "too many levels of symbolic links", path)
                target = os.readlink(part, dir_fd=stack[-1])
                if target.startswith("/"):
                    while len(stack) > 1:
                        os.close(stack.pop())
                parts[:0] = [p for p in target.split("/") if p]
            elif parts and not stat.S_ISDIR(st.st_mode):
                os.close(fd)
                raise NotADirectoryError(20, "not a directory", path)
            else:
                stack.append(fd)
        fd = stack.pop() if len(stack) > 1 else os.dup(stack[0])
        return fd
    finally:
        for fd in stack:
            os.close(fd)


def exists_in_root(root: str, path: str) -> bool:
    """Whether path resolves inside the container's root (open_in_root)."""
    try:
        os.close(open_in_root(root, path))
        return True
    except OSError:
        return False


def read_in_root(root: str, path: str, cap: int) -> bytes | None:
    """The first cap bytes of a regular file of the container's own root filesystem (path resolved by
    open_in_root), or None: nothing on another filesystem is read, so no device, no /proc (/proc/kmsg
    blocks: test_tampering.test_host_side_inspection_reads_no_device), no bind mount of the host."""
    with contextlib.suppress(OSError):
        fd = open_in_root(root, path)
        try:
            st = os.fstat(fd)
            rdev = os.stat(root).st_dev
            if not stat.S_ISREG(st.st_mode) or st.st_dev != rdev or st.st_size > cap:
                return None
            rfd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
            try:
                return os.read(rfd, cap)
            finally:
                os.close(rfd)
        finally:
            os.close(fd)
    return None


def write_new_dir(root: str, path: str, files: dict, exist_ok: bool = False) -> bool:
    """Make the directory `path` of the container's root (and its missing parents) and write `files`
    (relative path -> bytes; a ".sh" executable) below it, owned as the root is, from the host: no
    program of the container runs, and every step goes by dir fd, the parents resolved by open_in_root
    and nothing made here followed through a link. False when path exists and not exist_ok, or on any
    OSError: the caller then takes its other way (grading.verify: rm, mkdir and put_archive)."""
    parts = [p for p in path.split("/") if p]
    fds = []
    try:
        owner = os.stat(root)
        for i, part in enumerate(parts):
            base = fds[-1] if fds else None
            if i == len(parts) - 1 and not exist_ok:
                fds.append(_new_dir(base, root, part, owner))  # FileExistsError: the caller cleans first
            else:
                with contextlib.suppress(FileExistsError):
                    os.close(_new_dir(base, root, part, owner))
                fds.append(open_in_root(root, "/".join(parts[:i + 1])))
        for rel, data in sorted(files.items()):
            names = rel.split("/")
            if any(n in ("", ".", "..") for n in names):
                raise ValueError(f"not a relative path: {rel!r}")
            d = fds[-1]
            for n in names[:-1]:
                with contextlib.suppress(FileExistsError):
                    os.close(_new_dir(d, root, n, owner))
                fds.append(d := os.open(n, _DIR_FLAGS, dir_fd=d))
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(names[-1], flags, 0o600, dir_fd=d)
            try:
                os.fchown(fd, owner.st_uid, owner.st_gid)
                os.fchmod(fd, 0o755 if rel.endswith(".sh") else 0o644)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
        return True
    except OSError:
        return False
    finally:
        for fd in fds:
            os.close(fd)


def _new_dir(parent: int | None, root: str, name: str, owner) -> int:
    """A directory made in parent (the root when None), mode 0755 and owned by owner: its open fd."""
    base = parent if parent is not None else os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.mkdir(name, 0o700, dir_fd=base)
        fd = os.open(name, _DIR_FLAGS, dir_fd=base)
    finally:
        if parent is None:
            os.close(base)
    os.fchown(fd, owner.st_uid, owner.st_gid)
    os.fchmod(fd, 0o755)
    return fd


def readlink(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def fd_targets(hpid: int) -> set:
    try:
        return {readlink(f"/proc/{hpid}/fd/{fd}") for fd in os.listdir(f"/proc/{hpid}/fd")}
    except OSError:
        return set()


def names_container(host_pid: int, container_id: str) -> bool:
    """Whether this machine's process host_pid is in the container's cgroup: the daemon is local."""
    try:
        return container_id in Path(f"/proc/{host_pid}/cgroup").read_text()
    except OSError:
        return False


def cgroup_dirs(host_pid: int, container_id: str) -> dict:
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
            bases = (["/sys/fs/cgroup/unified", "/sys/fs/cgroup"] if c == "unified"
                     else [f"/sys/fs/cgroup/{c}"])
            d = next((b + path for b in bases if os.path.isfile(b + path + "/cgroup.procs")), None)
            if d:
                dirs[c] = d
    if "pids" not in dirs and "unified" in dirs and os.path.exists(dirs["unified"] + "/pids.max"):
        dirs["pids"] = dirs["unified"]  # cgroup v2: one directory for every controller
    return dirs


def cgroup_read(cgroup: dict, controller: str, name: str) -> str:
    try:
        return Path(cgroup[controller], name).read_text().strip()
    except (KeyError, OSError):
        return ""


def cgroup_pids(cgroup: dict) -> list | None:
    text = cgroup_read(cgroup, "pids", "cgroup.procs")
    if "pids" not in cgroup or not (text or os.path.isdir(cgroup["pids"])):
        return None
    return [int(x) for x in text.split()]


def container_procs(init_pid: int, cgroup: dict | None = None) -> dict | None:
    """{host pid: pid inside the container} for a local daemon we may signal, else None."""
    hpids = cgroup_pids(cgroup or {})
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


_READ_NR = {"x86_64": 0, "aarch64": 63}.get(os.uname().machine)  # read(2), as /proc/PID/syscall names it


def chars_read(hpid: int) -> int:
    """Bytes the process has read so far (/proc/PID/io rchar), -1 when unknown."""
    with contextlib.suppress(OSError, ValueError, TypeError, IndexError):
        with open(f"/proc/{hpid}/io") as f:
            return int(f.readline().split()[1])
    return -1


def reading_pipe(hpid: int, pipe: str) -> bool:
    """Whether the process is blocked in read(2) on `pipe` (a readlink target such as 'pipe:[123]')."""
    if _READ_NR is None:
        return False
    try:
        with open(f"/proc/{hpid}/syscall") as f:
            fields = f.read().split()
    except OSError:
        return False
    return (len(fields) >= 2 and fields[0] == str(_READ_NR)
            and readlink(f"/proc/{hpid}/fd/{int(fields[1], 16)}") == pipe)


def pid_limit_hits(cgroup: dict) -> int:
    """How often a fork in the container failed at its pid limit (the cgroup's pids.events)."""
    m = re.search(r"^max (\d+)", cgroup_read(cgroup, "pids", "pids.events"), re.M)
    return int(m.group(1)) if m else 0


def deleted_open_bytes(hpids, devices: set) -> int:
    """Disk blocks of files on `devices` that are deleted but still held open by one of hpids: no
    walk of a directory sees them, yet they fill the disk until the last holder closes them."""
    seen, total = set(), 0
    for hpid in hpids:
        try:
            fds = os.listdir(f"/proc/{hpid}/fd")
        except OSError:
            continue
        for fd in fds:
            link = readlink(f"/proc/{hpid}/fd/{fd}") or ""
            if not link.endswith(" (deleted)"):
                continue
            with contextlib.suppress(OSError):
                st = os.stat(f"/proc/{hpid}/fd/{fd}")
                if stat.S_ISREG(st.st_mode) and st.st_dev in devices and (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_blocks * 512
    return total


# the least disk a file costs (an inode, a block): what the disk cap charges an empty file
FILE_BLOCK = 4096
# files in a container's writable layer, whatever its disk cap (an inode flood ends the episode)
FILES_LIMIT = 200_000
WALK_LIMIT = 2 * FILES_LIMIT  # entries one walk of a writable layer visits before it gives up (WalkLimit)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_ANCHOR = 32             # a walk keeps every 32nd directory of its path open and reopens the rest from there


class WalkLimit(RuntimeError):
    """A writable layer held more entries than a walk visits."""


def _entries(fd: int, room: int) -> list:
    out = []
    with os.scandir(fd) as it:
        for e in it:
            if len(out) >= room:
                raise WalkLimit(f"more than {WALK_LIMIT} files in the container's writable layer")
            with contextlib.suppress(OSError):
                st = e.stat(follow_symlinks=False)
                out.append((e.name, st.st_mode, st.st_blocks, st.st_rdev))
    return out


def _frame_fd(frames: list, i: int) -> int:
    """The dir fd of frames[i], reopened by name from the nearest open directory above it."""
    if frames[i][0] is None:
        j = max(k for k in range(i) if frames[k][0] is not None)
        fd = frames[j][0]
        for k in range(j + 1, i + 1):
            new = os.open(frames[k][1].rsplit("/", 1)[1], _DIR_FLAGS, dir_fd=fd)
            if fd != frames[j][0]:
                os.close(fd)
            fd = new
        frames[i][0] = fd
    return frames[i][0]


def walk(root: str, limit: int = WALK_LIMIT):
    """Yield (path under root, mode, blocks, rdev, dir fd or None) of every entry below the host
    directory root, depth first. No recursion and no whole paths: each directory is opened by name
    from its parent's fd without following links, so a 1,100-deep tree or a path longer than PATH_MAX
    walks like any other (test_tampering.test_deep_trees_are_graded_normally) and nothing outside
    root is visited. At most `limit` entries, then WalkLimit. A directory's fd is valid while yielded."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    frames, seen = [[fd, "", []]], 0   # [dir fd or None (closed, reopen by name), path, entries left]
    try:
        frames[0][2] = _entries(fd, limit)
        while frames:
            top = frames[-1]
            if not top[2]:
                if top[0] is not None:
                    os.close(top[0])
                frames.pop()
                continue
            name, mode, blocks, rdev = top[2].pop()
            seen += 1
            if seen > limit:
                raise WalkLimit(f"more than {limit} files in the container's writable layer")
            rel = f"{top[1]}/{name}"
            if not stat.S_ISDIR(mode):
                yield rel, mode, blocks, rdev, None
                continue
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=_frame_fd(frames, len(frames) - 1))
            except OSError:
                yield rel, mode, blocks, rdev, None
                continue
            frames.append([child, rel, []])
            with contextlib.suppress(OSError):
                frames[-1][2] = _entries(child, limit - seen)
            if (len(frames) - 2) % _ANCHOR:
                os.close(top[0])
                top[0] = None
            yield rel, mode, blocks, rdev, child
    finally:
        for f in frames:
            if f[0] is not None:
                os.close(f[0])


def dir_usage(path: str, limit: int = FILES_LIMIT) -> tuple[int, int]:
    """(bytes charged, entries) of a container's writable layer: each entry costs its blocks, and at
    least FILE_BLOCK, so files are capped like bytes; counting stops past limit (returns limit + 1)."""
    total = n = 0
    try:
        for _, _, blocks, _, _ in walk(path, limit):
            total += max(blocks * 512, FILE_BLOCK)
            n += 1
    except WalkLimit:
        return total, limit + 1
    return total, n


def disk_use(upper: str, volumes: list, host_pid: int, procs: dict, quota: bool) -> tuple[int, int]:
    """(bytes, files) a local container holds on the host's disk: its volumes, its writable layer
    (bytes not counted when a storage quota caps the layer: files always are), and files deleted
    while still open on either."""
    volumes = [v for v in volumes if os.path.isdir(v)]
    devices = {os.stat(p).st_dev for p in volumes}
    used = files = 0
    for v in volumes:
        b, n = dir_usage(v, FILES_LIMIT)
        used, files = used + b, files + n
    b, n = dir_usage(upper, FILES_LIMIT)
    files += n
    if not quota:
        devices.add(os.stat(f"/proc/{host_pid}/root").st_dev)  # the overlay, as the container sees it
        used += b
    return used + deleted_open_bytes(procs, devices), files


def overlay_changes(upper: str, lowers: list[str]) -> list[tuple[str, str]]:
    """What docker diff reports, from the overlay dirs: whiteouts are deletions, a file also in a
    lower layer (the image's, which the agent cannot change) was changed, else added; an opaque
    directory (removed, then made again) changed. A path is looked up only in the layers where each
    directory above it is a real directory (lstat: no link of a layer is followed on the host,
    tests/test_tampering.py::test_the_overlay_scan_follows_no_link_of_the_images_layers), which also
    spares the lookups under a directory no layer has."""
    out, below = [], {"": tuple(lowers)}  # directory -> the lower layers that hold it as a directory
    for p, mode, _, rdev, fd in walk(upper):
        layers = below.get(p.rsplit("/", 1)[0], ())
        if fd is not None:
            below[p] = tuple(lo for lo in layers if stat.S_ISDIR(_lstat_mode(lo + p)))
            with contextlib.suppress(OSError):
                if os.getxattr(fd, "trusted.overlay.opaque") == b"y":
                    out.append((p, "C"))
        elif stat.S_ISCHR(mode) and rdev == 0:
            out.append((p, "D"))
        elif not stat.S_ISDIR(mode):
            out.append((p, "C" if any(_lstat_mode(lo + p) for lo in layers) else "A"))
    return out


def _lstat_mode(path: str) -> int:
    """st_mode of path, not following a link at its end; 0 when there is nothing there."""
    try:
        return os.lstat(path).st_mode
    except OSError:
        return 0


def first_child(init_pid: int, procs: dict) -> int | None:
    """The oldest child of the container's init: the sleep that keeps the container up."""
    kids = []
    for h in procs:
        with contextlib.suppress(OSError, IndexError, ValueError):
            f = proc_stat(h)
            if int(f[1]) == init_pid:
                kids.append((int(f[19]), h))
    return min(kids)[1] if kids else None


CLONE_NEWNET = 0x40000000
NET_READ = 4 << 20  # bytes of each /proc/<pid>/net table read: a container may open sockets without end


def _net_table(init_pid: int, table: str) -> list:
    """The rows of /proc/<init>/net/<table> (the container's network namespace), split; [] when unreadable."""
    try:
        fd = os.open(f"/proc/{init_pid}/net/{table}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        data = b""
        while len(data) < NET_READ and (chunk := os.read(fd, 1 << 16)):
            data += chunk
    finally:
        os.close(fd)
    return [line.split() for line in data.decode("ascii", "replace").splitlines()[1:]]


def _listening_inodes(init_pid: int) -> set:
    """Inodes of the sockets that listen in the network namespace of the container's init: TCP in
    LISTEN (st 0A), UDP bound to a port (st 07), unix sockets accepting connections (__SO_ACCEPTCON)."""
    found = set()
    for table in ("tcp", "tcp6", "udp", "udp6", "unix"):
        for f in _net_table(init_pid, table):
            with contextlib.suppress(IndexError, ValueError):
                if table == "unix" and int(f[3], 16) & 0x10000:
                    found.add(f[6])
                elif (table.startswith("tcp") and f[3] == "0A") or \
                        (table.startswith("udp") and f[3] == "07" and not f[1].endswith(":0000")):
                    found.add(f[9])
    return found


def loopback_socket(init_pid: int, port: int) -> str | None:
    """The fd link ('socket:[N]') of the container's TCP socket bound to 127.0.0.1:port, or None."""
    local = f"0100007F:{port:04X}"
    return next((f"socket:[{f[9]}]" for f in _net_table(init_pid, "tcp") if len(f) > 9 and f[1] == local),
                None)


def listen_inside(init_pid: int) -> socket.socket | None:
    """A TCP listener on 127.0.0.1 inside the network namespace of the container whose init is
    init_pid: a thread of ours joins that namespace, makes the socket and ends (the socket stays
    there). None where this process may not join it (it needs CAP_SYS_ADMIN)."""
    made = []

    def make():
        try:
            ns = os.open(f"/proc/{init_pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return
        try:
            if ctypes.CDLL(None, use_errno=True).setns(ns, CLONE_NEWNET) != 0:
                return
        finally:
            os.close(ns)
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            s.bind(("127.0.0.1", 0))
            s.listen(4)
            made.append(s)
        except OSError:  # no loopback in that namespace
            s.close()

    t = threading.Thread(target=make, name="termrl-listen", daemon=True)  # setns moves only its own thread
    t.start()
    t.join()
    return made[0] if made else None


def services(init_pid: int, hpids) -> set:
    """The host pids among hpids that hold a listening socket (a server the agent started), with
    their descendants among hpids: what grading.stop_agent leaves running."""
    inodes = {f"socket:[{i}]" for i in _listening_inodes(init_pid)}
    return descendants({h for h in hpids if fd_targets(h) & inodes}, hpids)


def descendants(roots: set, hpids) -> set:
    """roots and every process among hpids that descends from one of them (host pids)."""
    parent = {}
    for h in hpids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            parent[h] = int(proc_stat(h)[1])
    tree, grew = set(roots), True
    while grew:
        new = {h for h, p in parent.items() if p in tree} - tree
        tree |= new
        grew = bool(new)
    return tree


class ReadWatch:
    """The files opened in a container while the block runs (inotify IN_OPEN on each directory of its
    root outside the system's, walked without following a link): what a task's tests read, for
    tasktool validate's truth_in_reach. Paths are the container's; at most MAX_DIRS directories."""
    SKIP = ("/proc", "/sys", "/dev", "/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/etc",
            "/tests", "/logs", "/tmp", "/run", "/boot", "/var/lib/dpkg", "/var/lib/apt", "/var/cache",
            "/var/log")
    MAX_DIRS = 4096

    def __init__(self, host_pid: int):
        self.root, self.dirs, self.opened = f"/proc/{host_pid}/root", {}, set()

    def __enter__(self):
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        todo = ["/"]
        while todo and len(self.dirs) < self.MAX_DIRS:
            d = todo.pop()
            with contextlib.suppress(OSError):
                dfd = os.open(self.root + d, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    wd = libc.inotify_add_watch(self.fd, f"/proc/self/fd/{dfd}".encode(), 0x20)  # IN_OPEN
                finally:
                    os.close(dfd)
                if wd >= 0:
                    self.dirs[wd] = d
                with os.scandir(self.root + d) as it:
                    todo += [c for e in it if e.is_dir(follow_symlinks=False) and
                             not (c := os.path.join(d, e.name)).startswith(tuple(k + "/" for k in self.SKIP))
                             and c not in self.SKIP]
        return self

    def __exit__(self, *exc):
        try:
            while True:
                try:
                    data = os.read(self.fd, 1 << 16)
                except BlockingIOError:
                    break
                i = 0
                while i + 16 <= len(data):
                    wd, mask, _, n = struct.unpack_from("iIII", data, i)
                    name = data[i + 16:i + 16 + n].rstrip(b"\0").decode("utf-8", "replace")
                    if wd in self.dirs and name and not mask & 0x40000000:  # IN_ISDIR: a directory listed
                        self.opened.add(os.path.join(self.dirs[wd], name))
                    i += 16 + n
        finally:
            os.close(self.fd)


def zombie(hpid: int) -> bool:
    try:
        return proc_stat(hpid)[0] in ("Z", "X")
    except (OSError, IndexError):
        return True  # gone


DESCRIBE_READ = 1 << 16  # bytes of a command line, and of each script it names, that describe reads
DESCRIBE_FILES = 8       # files named by one command line that describe reads


def describe(hpid: int) -> str:
    """A process's command line and the text of the scripts it names (what it will do), bounded: the
    scripts are read inside the container's root (read_in_root), never through its links on the host."""
    try:
        fd = os.open(f"/proc/{hpid}/cmdline", os.O_RDONLY | os.O_CLOEXEC)
        try:
            argv = os.read(fd, DESCRIBE_READ).split(b"\0")
        finally:
            os.close(fd)
        cwd = os.readlink(f"/proc/{hpid}/cwd")
    except OSError:
        return ""
    text = b" ".join(argv).decode("utf-8", "replace")
    for a in [a for a in argv[1:] if a.startswith(b"/") or b"." in a][:DESCRIBE_FILES]:
        body = read_in_root(f"/proc/{hpid}/root", os.path.join(cwd, os.fsdecode(a)), DESCRIBE_READ)
        if body:
            text += "\n" + body.decode("utf-8", "replace")
    return text
