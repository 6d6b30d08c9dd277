import hashlib
import json
from pathlib import Path

LOG_SHA = "90562454773145f0e62dcd85b48a9129b447f6297ea550ff289551af3e661e33"
BLOCKED = ["45.33.12.9", "100.64.0.12", "192.0.2.66", "198.51.100.7", "203.0.113.45"]


def blocklist():
    return [l.strip() for l in Path("/app/blocklist.txt").read_text().splitlines() if l.strip()]


def test_log_untouched():
    assert hashlib.sha256(Path("/var/log/auth.log").read_bytes()).hexdigest() == LOG_SHA


def test_blocklist_members():
    assert sorted(blocklist()) == sorted(BLOCKED)


def test_blocklist_threshold_edges():
    # 192.0.2.66 has exactly 5 failures (in), 192.0.2.6 has 4 (out)
    assert "192.0.2.66" in blocklist() and "192.0.2.6" not in blocklist()


def test_blocklist_numeric_order():
    assert blocklist() == BLOCKED


def test_summary():
    data = json.loads(Path("/app/summary.json").read_text())
    assert data == {"total_failed": 62, "unique_ips": 8, "blocked": 5, "top_ip": "203.0.113.45"}
