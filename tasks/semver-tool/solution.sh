#!/bin/bash
cat > /app/semver.py <<'PY'
"""Semantic Versioning 2.0.0: parse, compare (precedence) and bump."""
import functools
import re
import sys

_NUM = r"0|[1-9]\d*"
_IDENT = r"[0-9A-Za-z-]+"
_RE = re.compile(
    rf"^({_NUM})\.({_NUM})\.({_NUM})"
    rf"(?:-({_IDENT}(?:\.{_IDENT})*))?"
    rf"(?:\+({_IDENT}(?:\.{_IDENT})*))?$"
)


def parse(version):
    m = _RE.match(version.strip()) if isinstance(version, str) else None
    if not m:
        raise ValueError(f"not a semantic version: {version!r}")
    pre = tuple(m.group(4).split(".")) if m.group(4) else ()
    for ident in pre:
        if ident.isdigit() and len(ident) > 1 and ident[0] == "0":
            raise ValueError(f"numeric prerelease identifier with leading zero in {version!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3)), pre


def _cmp(x, y):
    return (x > y) - (x < y)


def _cmp_ident(a, b):
    if a.isdigit() and b.isdigit():
        return _cmp(int(a), int(b))
    if a.isdigit() != b.isdigit():
        return -1 if a.isdigit() else 1
    return _cmp(a, b)


def compare(a, b):
    pa, pb = parse(a), parse(b)
    core = _cmp(pa[:3], pb[:3])
    if core or pa[3] == pb[3]:
        return core
    if not pa[3] or not pb[3]:
        return 1 if not pa[3] else -1
    for x, y in zip(pa[3], pb[3]):
        c = _cmp_ident(x, y)
        if c:
            return c
    return _cmp(len(pa[3]), len(pb[3]))


def bump(version, part):
    major, minor, patch, pre = parse(version)
    if part == "major":
        return f"{major + 1}.0.0"
    if part == "minor":
        return f"{major}.{minor + 1}.0"
    if part == "patch":
        return f"{major}.{minor}.{patch if pre else patch + 1}"
    raise ValueError(f"unknown part {part!r}: use major, minor or patch")


def main(argv):
    try:
        if len(argv) == 2 and argv[0] == "sort":
            with open(argv[1]) as fh:
                versions = [line.strip() for line in fh if line.strip()]
            for v in versions:
                parse(v)
            for v in sorted(versions, key=functools.cmp_to_key(compare)):
                print(v)
            return 0
        if len(argv) == 3 and argv[0] == "bump":
            print(bump(argv[2], argv[1]))
            return 0
        raise ValueError("usage: semver.py sort FILE | semver.py bump PART VERSION")
    except (ValueError, OSError) as exc:
        print(f"semver: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
PY
python3 /app/semver.py sort /app/versions.txt
