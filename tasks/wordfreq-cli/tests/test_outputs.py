import subprocess
from pathlib import Path

SCRIPT = "/app/wordfreq.py"


def run(args, stdin=None):
    return subprocess.run(["python3", SCRIPT, *args], input=stdin, capture_output=True, text=True, timeout=30)


def test_example_from_instructions():
    r = run(["-n", "3", "/app/sample.txt"])
    assert r.returncode == 0
    assert r.stdout.splitlines() == ["the 5", "fox 3", "quick 3"]


def test_default_is_ten_and_ties_alphabetical(tmp_path):
    text = " ".join(["zeta"] * 4 + ["alpha"] * 4 + ["Mid"] * 2 + ["mid"] + list("ab" * 3)) + "\n"
    text += " ".join(chr(ord("c") + i) * 2 for i in range(12))
    f = tmp_path / "t.txt"
    f.write_text(text)
    r = run([str(f)])
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    assert len(lines) == 10
    assert lines[:5] == ["alpha 4", "zeta 4", "a 3", "b 3", "mid 3"]
    assert lines[5:] == ["cc 1", "dd 1", "ee 1", "ff 1", "gg 1"]


def test_apostrophes_and_digits_split_words(tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("Don't stop: abc123def ABC x-ray\n")
    r = run(["-n", "20", str(f)])
    assert sorted(r.stdout.splitlines()) == sorted(
        ["abc 2", "def 1", "don 1", "ray 1", "stop 1", "t 1", "x 1"])


def test_stdin():
    r = run(["-n", "2", "-"], stdin="b a b c b a\n")
    assert r.returncode == 0
    assert r.stdout.splitlines() == ["b 3", "a 2"]


def test_no_words(tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("123 456 ... !!!\n")
    r = run([str(f)])
    assert r.returncode == 0
    assert r.stdout.strip() == ""


def test_missing_file():
    r = run(["/app/definitely-missing.txt"])
    assert r.returncode == 1
    assert r.stdout == ""
    assert r.stderr.strip() != ""
