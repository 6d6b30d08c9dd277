import subprocess
from pathlib import Path

REPO = "/app/service"


def git(*args):
    r = subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def settings():
    ns = {}
    exec(compile(Path(REPO, "settings.py").read_text(), "settings.py", "exec"), ns)
    return ns


def test_on_main_and_clean():
    assert git("rev-parse", "--abbrev-ref", "HEAD") == "main"
    assert git("status", "--porcelain") == ""
    assert not Path(REPO, ".git/MERGE_HEAD").exists()


def test_merge_commit_parents():
    parents = git("rev-list", "--parents", "-n", "1", "HEAD").split()[1:]
    assert parents == [MAIN_TIP, FEATURE_TIP]


def test_branches_not_rewritten():
    assert git("rev-parse", "feature/rate-limit") == FEATURE_TIP
    assert git("log", "--format=%s", f"{MAIN_TIP}").splitlines() == [
        "Raise timeouts and add backup host", "Initial settings"]


def test_no_conflict_markers():
    text = Path(REPO, "settings.py").read_text()
    for marker in ("<<<<<<<", "=======", ">>>>>>>"):
        assert marker not in text


def test_settings_values():
    ns = settings()
    assert ns["TIMEOUT_S"] == 30
    assert ns["MAX_RETRIES"] == 5
    assert ns["ALLOWED_HOSTS"] == ["orders.internal", "orders.backup.internal"]
    assert ns["RATE_LIMIT_PER_MIN"] == 120
    assert ns["SERVICE_NAME"] == "orders"


def test_committed_content():
    committed = git("show", "HEAD:settings.py")
    assert "RATE_LIMIT_PER_MIN = 120" in committed and "MAX_RETRIES = 5" in committed
    assert git("show", "HEAD:ratelimit.py").startswith("from settings import RATE_LIMIT_PER_MIN")


MAIN_TIP = "4e80ca7a56dfef5482ba148f515f691dc6179235"
FEATURE_TIP = "a5d0cdc8b7fe5dbb23c525b8f964592e1f0c8f48"
