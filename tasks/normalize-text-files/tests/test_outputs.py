from pathlib import Path

import pytest

EXPECTED = {
    'assets/logo.png': b'\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR  \r\n',
    'blank-lines.txt': b'',
    'changelog.txt': b'v1.1 - fixed bugs\nv1.0 - initial release\n',
    'empty.txt': b'',
    'guides/mixed.txt': b'unix line\ndos line\nspaces\nold mac\rstays\n',
    'guides/setup.md': b'# Setup\n\nRun the installer.\nThen reboot.\n',
    'guides/usage.md': b'# Usage\n\n    indented code block stays indented\nlast line without newline\n',
    'intro.txt': b'Welcome to the project.\nThis file uses Windows line endings.\n\nEnd of intro.\n',
    'notes.TXT': b'upper-case extension is not matched   \r\n',
    'run.bat': b'@echo off\r\necho hello   \r\n',
}


@pytest.mark.parametrize("rel", sorted(k for k in EXPECTED if k.endswith((".txt", ".md"))))
def test_text_file_normalised(rel):
    assert (Path("/app/docs") / rel).read_bytes() == EXPECTED[rel]


@pytest.mark.parametrize("rel", sorted(k for k in EXPECTED if not k.endswith((".txt", ".md"))))
def test_other_files_untouched(rel):
    assert (Path("/app/docs") / rel).read_bytes() == EXPECTED[rel]


def test_no_crlf_left_in_text_files():
    for path in Path("/app/docs").rglob("*"):
        if path.suffix in (".txt", ".md"):
            assert b"\r\n" not in path.read_bytes(), path


def test_no_extra_files():
    files = sorted(str(p.relative_to("/app/docs")) for p in Path("/app/docs").rglob("*") if p.is_file())
    assert files == sorted(EXPECTED)
