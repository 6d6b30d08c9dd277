import hashlib
from pathlib import Path

ROOT = Path("/app/photos")
# relative path -> sha256 prefix of the original content
KEPT = {
    "best/sunset-final.jpg": "54a9b72193b01035",
    "misc/empty1.txt": "e3b0c44298fc1c14",
    "misc/empty2.txt": "e3b0c44298fc1c14",
    "misc/notes.txt": "b14b59807b689222",
    "2023 trip/beach copy.jpg": "819f8454cae36ba6",
    "2023 trip/sunset.jpg": "fba88a4e43fb9a7b",
    "camera/IMG_0002.jpg": "29134b9dab362c8c",
    "camera/IMG_0003.jpg": "b024e668f739c201",
    "phone/dcim/a.jpg": "aa6bb1beb74ecdda",
    "phone/dcim/b.jpg": "1e5929382dce9719",
}
REMOVED = [
    "/app/photos/2023 trip/beach.jpg",
    "/app/photos/camera/IMG_0001.jpg",
    "/app/photos/camera/IMG_0004.jpg",
    "/app/photos/phone/backup/IMG_0002.jpg",
    "/app/photos/phone/dcim/c.jpg",
]


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def test_kept_files_present_and_unchanged():
    for rel, digest in KEPT.items():
        path = ROOT / rel
        assert path.is_file(), f"{path} should have been kept"
        assert sha(path) == digest, f"{path} was modified"


def test_duplicates_deleted():
    for path in REMOVED:
        assert not Path(path).exists(), f"{path} is a duplicate and should be gone"


def test_no_duplicates_left():
    seen = {}
    for path in ROOT.rglob("*"):
        if path.is_file() and path.stat().st_size > 0:
            digest = sha(path)
            assert digest not in seen, f"{path} duplicates {seen[digest]}"
            seen[digest] = path


def test_no_extra_files():
    files = sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file())
    assert files == sorted(KEPT)


def test_removed_list():
    text = Path("/app/removed.txt").read_text()
    assert text.splitlines() == REMOVED
