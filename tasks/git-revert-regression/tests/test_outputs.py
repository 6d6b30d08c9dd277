import subprocess
from pathlib import Path

REPO = "/app/shop"


def git(*args):
    r = subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_check_passes():
    r = subprocess.run(["bash", "check.sh"], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS" in r.stdout


def test_revert_commit_on_top():
    assert git("rev-parse", "--abbrev-ref", "HEAD") == "main"
    assert git("log", "-1", "--format=%s") == 'Revert "Refactor discount maths"'
    body = git("log", "-1", "--format=%b")
    bad = git("log", "--format=%H", "--grep", "^Refactor discount maths$")
    assert f"This reverts commit {bad}." in body


def test_revert_is_exact_inverse():
    bad = git("log", "--format=%H", "--grep", "^Refactor discount maths$")
    # compare the patches without the blob-hash "index" lines, which differ legitimately
    forward = [l for l in git("diff", "-U0", f"{bad}~1", bad).splitlines() if not l.startswith("index ")]
    backward = [l for l in git("diff", "-U0", "HEAD", "HEAD~1").splitlines() if not l.startswith("index ")]
    assert forward == backward
    assert not Path(REPO, "CHANGES.txt").exists()


def test_history_kept():
    subjects = git("log", "--format=%s").splitlines()
    assert subjects[1:] == ["Update README", "Add shipping cost", "Refactor discount maths",
                            "Add format_price", "Add README", "Add pricing helpers and check script"]
    assert git("rev-parse", "HEAD~1") == OLD_HEAD


def test_later_changes_kept():
    src = Path(REPO, "pricing.py").read_text()
    assert "def shipping_cost" in src and "def format_price" in src
    assert "Pricing and shipping helpers." in Path(REPO, "README.md").read_text()


def test_clean():
    assert git("status", "--porcelain") == ""
    assert not Path(REPO, ".git/BISECT_LOG").exists()
OLD_HEAD = "7f74e4d4ab8a51c97da3829689d8b3132d8e2f36"
