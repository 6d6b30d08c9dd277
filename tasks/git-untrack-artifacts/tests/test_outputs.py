import subprocess
from pathlib import Path

REPO = "/app/webapp"


def git(*args, check=True):
    r = subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True, timeout=30)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def tracked():
    return set(git("ls-files").stdout.split())


def test_generated_files_untracked():
    t = tracked()
    for path in ("dist/app.js", "dist/assets/site.css", "app/__pycache__/main.cpython-311.pyc",
                 "app/legacy.pyc", ".env"):
        assert path not in t, f"{path} is still tracked"


def test_other_files_still_tracked():
    assert {"app/main.py", "app/__init__.py", "tests/test_main.py", "README.md", ".env.example",
            ".gitignore"} <= tracked()


def test_files_kept_on_disk():
    assert Path(REPO, ".env").read_text().startswith("SECRET_KEY=dev-only")
    assert Path(REPO, "dist/app.js").read_text() == "bundle v2"
    assert Path(REPO, "app/__pycache__/main.cpython-311.pyc").exists()
    assert Path(REPO, "app/legacy.pyc").exists()


def test_gitignore_rules():
    for path in ("dist/new.js", "lib/__pycache__/x.pyc", "deep/dir/mod.pyc", ".env"):
        assert git("check-ignore", "-q", "--no-index", path, check=False).returncode == 0, f"{path} not ignored"
    for path in (".env.example", "app/main.py", "distribution.txt"):
        assert git("check-ignore", "-q", "--no-index", path, check=False).returncode == 1, f"{path} ignored"


def test_commit():
    log = git("log", "--format=%s").stdout.split("\n")
    assert log[:3] == ["Stop tracking generated files", "Add health endpoint", "Initial commit"]
    assert git("rev-parse", "HEAD~1").stdout.strip() == OLD_HEAD
    assert git("rev-parse", "--abbrev-ref", "HEAD").stdout.strip() == "main"


def test_clean_tree():
    assert git("status", "--porcelain").stdout.strip() == ""
OLD_HEAD = "d7f4447f7c6ecaae5e801344e3ba5e03beacf632"
