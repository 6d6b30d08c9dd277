import subprocess
from pathlib import Path

REPO = "/app/repo"


def git(*args):
    r = subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_file_restored_with_last_content():
    assert Path(REPO, "config/settings.ini").read_text() == \
        "[server]\nport = 8080\nworkers = 4\n\n[cache]\nttl = 300\n"


def test_restored_in_new_commit_on_main():
    assert git("rev-parse", "--abbrev-ref", "HEAD") == "main"
    assert git("log", "-1", "--format=%s") == "Restore settings.ini"
    assert "config/settings.ini" in git("show", "--name-only", "--format=", "HEAD").splitlines()
    assert git("show", "HEAD:config/settings.ini").startswith("[server]\nport = 8080")


def test_history_not_rewritten():
    subjects = git("log", "--format=%s").splitlines()
    assert subjects == ["Restore settings.ini", "Add README", "Friendlier greeting",
                        "Cleanup unused files", "Add logging module", "Tune server settings",
                        "Initial import"]
    # the previous tip (fixed hash: the history is built with fixed dates) must be the parent
    assert git("rev-parse", "HEAD~1") == "671be926a1e3d59049763deea69a158c277aa6e2"


def test_other_files_unchanged():
    assert Path(REPO, "src/app.py").read_text() == 'def main():\n    print("hello, world")\n'
    assert Path(REPO, "README.md").read_text() == "# demo app\n"
    assert Path(REPO, "src/log.py").exists()


def test_clean_worktree():
    assert git("status", "--porcelain") == ""
