import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest


@pytest.fixture
def proj(tmp_path):
    """A fresh copy of the project (without build output) so every test starts clean."""
    dst = tmp_path / "proj"
    shutil.copytree("/app", dst, ignore=shutil.ignore_patterns("build"))
    (dst / "clean").write_text("This file is here on purpose. Do not delete it.\n")
    return dst


def make(proj, *args):
    return subprocess.run(["make", "-C", str(proj), *args], capture_output=True, text=True, timeout=60)


def test_src_unchanged():
    assert Path("/app/src/alice.csv").read_text() == "quiz,7\nlab,12\nexam,55\n"
    assert Path("/app/clean").exists()


def test_build_from_scratch(proj):
    r = make(proj)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (proj / "build/report.txt").read_text().splitlines() == ["alice 74", "bob 80", "carol 70"]
    assert (proj / "build/bob.sum").read_text().strip() == "80"


def test_second_make_is_noop(proj):
    assert make(proj).returncode == 0
    q = make(proj, "-q")
    assert q.returncode == 0, "make -q says something is out of date right after a build"


def test_rebuilds_after_change(proj):
    assert make(proj).returncode == 0
    old = time.time() - 100  # age the build outputs so the edits below are clearly newer
    for f in (proj / "build").rglob("*"):
        os.utime(f, (old, old))
    (proj / "src/bob.csv").write_text("quiz,1\nlab,1\n")
    (proj / "src/dave.csv").write_text("quiz,10\n")
    assert make(proj).returncode == 0
    assert (proj / "build/report.txt").read_text().splitlines() == [
        "alice 74", "bob 2", "carol 70", "dave 10"]


def test_clean_with_file_named_clean(proj):
    assert make(proj).returncode == 0
    r = make(proj, "clean")
    assert r.returncode == 0
    assert not (proj / "build").exists()
    assert (proj / "src/alice.csv").exists()
