import stat
from pathlib import Path

import pytest

ROOT = Path("/srv/www")
EXPECTED = {
    ".": 0o755, "public": 0o755, "public/css": 0o755, "public/img": 0o755, "bin": 0o755,
    "config": 0o755, "config/secrets": 0o700, "uploads": 0o733,
    "public/index.html": 0o644, "public/css/site.css": 0o644, "public/img/logo.png": 0o644,
    "bin/deploy.sh": 0o755, "bin/restart.sh": 0o755, "bin/README": 0o644,
    "config/app.ini": 0o644, "config/secrets/db.ini": 0o600, "config/secrets/api.key": 0o600,
    "uploads/avatar.png": 0o644,
}


def mode(rel):
    return stat.S_IMODE((ROOT / rel).stat().st_mode)


def test_tree_unchanged():
    found = {str(p.relative_to(ROOT)) for p in ROOT.rglob("*")} | {"."}
    assert found == set(EXPECTED)
    assert (ROOT / "config/secrets/db.ini").read_text() == "db_password=s3cret\n"


@pytest.mark.parametrize("rel", sorted(k for k in EXPECTED if (ROOT / k).is_dir()))
def test_directory_mode(rel):
    assert oct(mode(rel)) == oct(EXPECTED[rel])


@pytest.mark.parametrize("rel", sorted(k for k in EXPECTED if not (ROOT / k).is_dir()))
def test_file_mode(rel):
    assert oct(mode(rel)) == oct(EXPECTED[rel])
