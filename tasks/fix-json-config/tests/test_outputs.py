import hashlib
import json
import subprocess
from pathlib import Path

CHECK_SHA = "f9382fbd6efdcd1ef0f623a4758bf71cfc1a798a5178376537fb57c4d63d041f"
EXPECTED = {
    "name": "billing-api",
    "port": 8080,
    "log_level": "debug",
    "workers": 4,
    "database": {"host": "db.internal", "port": 5432, "pool_size": 10},
    "features": ["invoices", "refunds", "exports"],
    "timeout_s": 30,
    "allowed_origins": ["https://app.example.com"],
}


def test_check_script_untouched():
    assert hashlib.sha256(Path("/app/service/check.py").read_bytes()).hexdigest() == CHECK_SHA


def test_strict_json():
    json.loads(Path("/app/service/config.json").read_text())


def test_values_preserved():
    cfg = json.loads(Path("/app/service/config.json").read_text())
    assert cfg == EXPECTED
    assert type(cfg["port"]) is int


def test_check_passes():
    r = subprocess.run(["python3", "/app/service/check.py"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0
    assert r.stdout.strip() == "OK"
