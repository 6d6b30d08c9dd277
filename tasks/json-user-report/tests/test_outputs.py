import hashlib
import json
from pathlib import Path

USERS_SHA = "2fb908cfd2937738191fa30be11ee50641fc41697a0550b76d63426ba82a9146"


def load(name):
    return json.loads(Path("/app", name).read_text())


def test_users_untouched():
    assert hashlib.sha256(Path("/app/users.json").read_bytes()).hexdigest() == USERS_SHA


def test_admins_members():
    assert sorted(a["email"] for a in load("admins.json")) == [
        "ana@corp.example", "emma@corp.example", "omar@corp.example"]


def test_admins_exact():
    assert load("admins.json") == [
        {"name": "Ana Okafor", "email": "ana@corp.example"},
        {"name": "Emma Costa", "email": "emma@corp.example"},
        {"name": "Omar Okafor", "email": "omar@corp.example"},
    ]


def test_role_counts():
    assert load("role_counts.json") == {"admin": 3, "billing": 2, "dev": 3, "ops": 2, "support": 2}


def test_never_logged_in():
    ids = [l.strip() for l in Path("/app/never_logged_in.txt").read_text().splitlines() if l.strip()]
    assert ids == ["100", "102", "103", "107", "111", "112", "113"]
