import re
import stat
from pathlib import Path

import pytest

CRONFILE = Path("/etc/cron.d/maintenance")
NAMES = {
    "month": {m: i + 1 for i, m in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split())},
    "dow": {d: i for i, d in enumerate("sun mon tue wed thu fri sat".split())},
}
RANGES = {"minute": (0, 59), "hour": (0, 23), "dom": (1, 31), "month": (1, 12), "dow": (0, 7)}


def expand(field, kind):
    """Set of values a cron field matches (supports *, lists, ranges, steps and names)."""
    lo, hi = RANGES[kind]
    names = NAMES.get(kind, {})
    out = set()
    for part in field.lower().split(","):
        rng, _, step = part.partition("/")
        step = int(step) if step else 1
        if rng == "*":
            a, b = lo, hi
        elif "-" in rng:
            a, b = (int(names.get(x, x)) for x in rng.split("-"))
        else:
            a = int(names.get(rng, rng))
            b = hi if step != 1 else a
        assert lo <= a <= b <= hi, f"bad {kind} field {field!r}"
        out.update(range(a, b + 1, step))
    if kind == "dow" and 7 in out:
        out = (out - {7}) | {0}
    return out


def parse():
    env, jobs = {}, []
    for line in CRONFILE.read_text().splitlines():
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)$", s)
        if m and not s.startswith(("*", "@")) and not s[0].isdigit():
            env[m.group(1)] = m.group(2).strip().strip('"')
            continue
        f = s.split(None, 6)
        assert len(f) == 7, f"not a cron.d job line: {line!r}"
        jobs.append({"minute": expand(f[0], "minute"), "hour": expand(f[1], "hour"),
                     "dom": expand(f[2], "dom"), "month": expand(f[3], "month"),
                     "dow": expand(f[4], "dow"), "user": f[5], "command": " ".join(f[6].split())})
    return env, jobs


ALL = {k: set(range(lo, hi + 1)) for k, (lo, hi) in RANGES.items()}
ALL["dow"] = set(range(7))
EXPECTED = {
    "/opt/maint/backup.sh": dict(minute={30}, hour={2}, dom=ALL["dom"], month=ALL["month"], dow=ALL["dow"], user="root"),
    "/opt/maint/rotate-logs.sh --compress": dict(minute={0, 15, 30, 45}, hour=set(range(8, 19)), dom=ALL["dom"],
                                                 month=ALL["month"], dow={1, 2, 3, 4, 5}, user="www-data"),
    "/opt/maint/report.sh monthly": dict(minute={0}, hour={6}, dom={1}, month=ALL["month"], dow=ALL["dow"], user="root"),
    "/opt/maint/cleanup-tmp.sh": dict(minute={45}, hour={23}, dom=ALL["dom"], month=ALL["month"], dow={0}, user="nobody"),
}


def test_file_format_basics():
    data = CRONFILE.read_bytes()
    assert data.endswith(b"\n"), "cron ignores the last line without a trailing newline"
    st = CRONFILE.stat()
    assert st.st_uid == 0
    assert stat.S_IMODE(st.st_mode) == 0o644


def test_environment_lines():
    env, _ = parse()
    assert env == {"SHELL": "/bin/bash", "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                   "MAILTO": "ops@example.org"}


def test_exactly_four_jobs_with_given_commands():
    _, jobs = parse()
    assert sorted(j["command"] for j in jobs) == sorted(EXPECTED)


@pytest.mark.parametrize("command", sorted(EXPECTED))
def test_job_schedule(command):
    _, jobs = parse()
    (job,) = [j for j in jobs if j["command"] == command]
    want = EXPECTED[command]
    for key in ("minute", "hour", "dom", "month", "dow", "user"):
        assert job[key] == want[key], f"{command}: wrong {key}"


def test_scripts_executable():
    for script in sorted(Path("/opt/maint").glob("*.sh")):
        assert stat.S_IMODE(script.stat().st_mode) == 0o755, script
    assert len(list(Path("/opt/maint").glob("*.sh"))) == 4
