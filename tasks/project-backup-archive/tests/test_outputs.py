import subprocess
import tarfile
from pathlib import Path

import pytest

ARCHIVE = Path("/app/backups/project-backup.tar.gz")
FILES = {
    "project/src/index.js": 'console.log("app")\n',
    "project/src/utils/x.js": "export const x = 1\n",
    "project/src/catalog.js": "not a log\n",
    "project/docs/guide.md": "# docs\n",
    "project/docs/build.md": "build notes\n",
    "project/docs/build/info.txt": "nested build dir stays\n",
    "project/web/index.html": "<html></html>\n",
    "project/logs/README.txt": "keep me\n",
    "project/package.json": '{"name": "demo"}\n',
}


def norm(name):
    return name[2:] if name.startswith("./") else name


@pytest.fixture(scope="module")
def members():
    with tarfile.open(ARCHIVE, "r:gz") as tar:
        return {norm(m.name).rstrip("/"): (tar.extractfile(m).read().decode() if m.isfile() else None)
                for m in tar.getmembers()}


def test_is_gzip_tar():
    assert tarfile.is_tarfile(ARCHIVE)
    assert ARCHIVE.read_bytes()[:2] == b"\x1f\x8b"


def test_all_members_under_project(members):
    assert all(n == "project" or n.startswith("project/") for n in members)


def test_expected_files_with_content(members):
    files = {n: c for n, c in members.items() if c is not None}
    assert files == FILES


def test_exclusions(members):
    assert not any("node_modules" in n.split("/") for n in members)
    assert not any(n.endswith(".log") for n in members)
    assert not any(n == "project/build" or n.startswith("project/build/") for n in members)
    assert "project/docs/build/info.txt" in members


def test_checksum_file():
    r = subprocess.run(["sha256sum", "-c", "project-backup.tar.gz.sha256"], cwd="/app/backups",
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr


def test_project_untouched():
    assert (Path("/app/project/node_modules/left-pad/index.js")).exists()
    assert (Path("/app/project/debug.log")).exists()
    assert (Path("/app/project/build/bundle.js")).exists()
