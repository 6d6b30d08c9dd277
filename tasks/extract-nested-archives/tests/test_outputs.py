import hashlib
from pathlib import Path

import pytest

OUT = Path("/app/extracted")
ROWS = {"2024-01.csv": 31, "2024-02.csv": 29, "2024-03.csv": 31, "2024-04.csv": 30,
        "2024-05.csv": 31, "2024-06.csv": 30}


def expected_csv(month, n):
    lines = ["date,store,amount"]
    for i in range(1, n + 1):
        lines.append(f"{month}-{(i % 28) + 1:02d},store{i % 4},{i * 7 % 100}.{i % 10}0")
    return "\n".join(lines) + "\n"


def test_only_expected_files():
    assert OUT.is_dir()
    assert sorted(p.name for p in OUT.iterdir()) == sorted(list(ROWS) + ["summary.txt"])
    assert all(p.is_file() for p in OUT.iterdir())


@pytest.mark.parametrize("name", sorted(ROWS))
def test_csv_decompressed_and_intact(name):
    assert (OUT / name).read_text() == expected_csv(name[:-4], ROWS[name])


def test_summary():
    lines = [l.split() for l in (OUT / "summary.txt").read_text().splitlines() if l.strip()]
    assert lines == [[n, str(c)] for n, c in sorted(ROWS.items())] + [["TOTAL", str(sum(ROWS.values()))]]


def test_incoming_untouched():
    names = sorted(p.name for p in Path("/app/incoming").iterdir())
    assert names == ["2024-06.csv", "CHECKSUMS.txt", "batch1.tar.gz", "batch2.zip"]
