from pathlib import Path

import pytest

SORTED = Path("/app/sorted")
EXPECTED = {
    "images": ["photo.JPG", "diagram.png", "holiday photo.jpeg", "logo.GIF"],
    "documents": ["report.pdf", "notes.txt", "data.csv", "budget.xlsx", "README.md",
                  "letter.docx", "tax return 2023.PDF"],
    "archives": ["archive.tar.gz", "backup.zip", "old.tgz"],
    "other": ["script.sh", "song.mp3", "Makefile", "notes.txt.bak"],
}


@pytest.mark.parametrize("category", sorted(EXPECTED))
def test_category_contains_exactly_expected_files(category):
    folder = SORTED / category
    assert folder.is_dir(), f"{folder} missing"
    assert sorted(p.name for p in folder.iterdir()) == sorted(EXPECTED[category])


def test_contents_unchanged():
    for category, names in EXPECTED.items():
        for name in names:
            assert (SORTED / category / name).read_text() == f"content of {name}\n"


def test_inbox_empty_but_present():
    inbox = Path("/app/inbox")
    assert inbox.is_dir()
    assert list(inbox.iterdir()) == []


def test_summary():
    lines = (SORTED / "summary.txt").read_text().strip().splitlines()
    assert [l.strip() for l in lines] == ["archives 3", "documents 7", "images 4", "other 4"]
