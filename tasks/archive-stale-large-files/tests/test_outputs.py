import datetime as dt
from pathlib import Path

STORAGE = Path("/app/storage")
ARCHIVE = Path("/app/archive")
# relative path -> (size, mtime as UTC string)
MOVED = {
    "logs/app-2022.log": (350000, "2022-11-03 10:00:00"),
    "logs/app-2023.log": (180000, "2023-12-31 23:59:00"),
    "media/thumbs/t2.png": (102401, "2019-01-01 00:00:00"),
    "media/video-old.mp4": (1048576, "2020-07-14 12:00:00"),
    "reports/q1-2023.pdf": (240000, "2023-04-02 09:30:00"),
    "tmp/cache.bin": (900000, "2023-08-20 16:45:00"),
}
STAYED = {
    "logs/app-2024.log": 500000,
    "logs/small-2021.log": 2048,
    "media/video-new.mp4": 1048576,
    "media/thumbs/t1.png": 102400,
    "reports/q4-2023.pdf": 260000,
    "reports/summary.txt": 5000,
}


def epoch(s):
    return dt.datetime.strptime(s, "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.timezone.utc).timestamp()


def test_qualifying_files_moved():
    for rel, (size, _) in MOVED.items():
        assert not (STORAGE / rel).exists(), f"{rel} should have been moved out of storage"
        assert (ARCHIVE / rel).is_file(), f"{rel} missing from archive"
        assert (ARCHIVE / rel).stat().st_size == size


def test_mtimes_preserved():
    for rel, (_, when) in MOVED.items():
        assert abs((ARCHIVE / rel).stat().st_mtime - epoch(when)) < 2, f"{rel} lost its mtime"


def test_other_files_untouched():
    for rel, size in STAYED.items():
        assert (STORAGE / rel).is_file(), f"{rel} should have stayed in storage"
        assert (STORAGE / rel).stat().st_size == size
        assert not (ARCHIVE / rel).exists()


def test_archive_has_nothing_else():
    files = sorted(str(p.relative_to(ARCHIVE)) for p in ARCHIVE.rglob("*") if p.is_file())
    assert files == sorted(list(MOVED) + ["manifest.txt"])


def test_manifest():
    lines = [l.strip() for l in (ARCHIVE / "manifest.txt").read_text().splitlines() if l.strip()]
    assert lines == [f"{rel} {size}" for rel, (size, _) in sorted(MOVED.items())]
