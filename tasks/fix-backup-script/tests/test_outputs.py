import os
import subprocess
from pathlib import Path

import pytest


def make_tree(root):
    files = {
        "a.txt": "alpha\n",
        "README.md": "# readme\n",
        "photo.jpg": "binary\n",
        "my notes/meeting 1.txt": "meeting\n",
        "my notes/todo.md": "- [ ] x\n",
        "my notes/draft.txt.bak": "old\n",
        "deep/er/still.txt": "deep\n",
        "deep/er/script.sh": "echo\n",
    }
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return files


COPIED = ["README.md", "a.txt", "deep/er/still.txt", "my notes/meeting 1.txt", "my notes/todo.md"]


def run(*args, cwd):
    return subprocess.run(["bash", "/app/backup.sh", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, timeout=60)


@pytest.fixture
def work(tmp_path):
    src = tmp_path / "source dir"
    src.mkdir()
    files = make_tree(src)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    return src, files, tmp_path / "back up", cwd


def test_copies_right_files(work):
    src, files, dest, cwd = work
    r = run(src, dest, cwd=cwd)
    assert r.returncode == 0, r.stderr
    got = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert got == sorted(COPIED + ["MANIFEST"])
    for rel in COPIED:
        assert (dest / rel).read_text() == files[rel]


def test_output_and_manifest(work):
    src, _, dest, cwd = work
    r = run(src, dest, cwd=cwd)
    assert r.stdout.splitlines() == ["backed up 5 files"]
    assert (dest / "MANIFEST").read_text().splitlines() == COPIED


def test_trailing_slashes(work):
    src, _, dest, cwd = work
    r = run(f"{src}/", f"{dest}/", cwd=cwd)
    assert r.returncode == 0
    assert (dest / "MANIFEST").read_text().splitlines() == COPIED
    assert (dest / "my notes/todo.md").is_file()


def test_zero_files(tmp_path):
    src = tmp_path / "empty src"
    src.mkdir()
    (src / "x.png").write_text("x")
    r = run(src, tmp_path / "out", cwd=tmp_path)
    assert r.returncode == 0
    assert r.stdout.splitlines() == ["backed up 0 files"]
    assert (tmp_path / "out" / "MANIFEST").read_text() == ""


def test_missing_source(tmp_path):
    r = run(tmp_path / "nope", tmp_path / "dest", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip()
    assert r.stdout == ""
    assert not (tmp_path / "dest").exists()


def test_no_junk_in_cwd(work):
    src, _, dest, cwd = work
    run(src, dest, cwd=cwd)
    assert os.listdir(cwd) == []
