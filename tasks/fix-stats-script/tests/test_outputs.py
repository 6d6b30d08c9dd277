import subprocess

import pytest


def stats(tmp_path, text):
    f = tmp_path / "data.txt"
    f.write_text(text)
    return subprocess.run(["python3", "/app/stats.py", str(f)], capture_output=True, text=True, timeout=30)


def parse(out):
    return dict(line.split(": ", 1) for line in out.strip().splitlines())


def test_example_file():
    r = subprocess.run(["python3", "/app/stats.py", "/app/times.txt"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines() == [
        "count: 5", "mean: 28.90", "median: 12.00", "min: 7.50", "max: 101.00"]


def test_numeric_not_lexicographic(tmp_path):
    r = stats(tmp_path, "9\n10\n100\n")
    assert parse(r.stdout) == {"count": "3", "mean": "39.67", "median": "10.00", "min": "9.00", "max": "100.00"}


def test_even_count_median_and_negatives(tmp_path):
    r = stats(tmp_path, "-4\n  3.5 \n# note\n\n   # indented comment\n1\n-10\n")
    assert r.returncode == 0, r.stderr
    assert parse(r.stdout) == {"count": "4", "mean": "-2.38", "median": "-1.50", "min": "-10.00", "max": "3.50"}


def test_mean_not_floored(tmp_path):
    r = stats(tmp_path, "1\n2\n")
    assert parse(r.stdout)["mean"] == "1.50"


def test_no_data(tmp_path):
    r = stats(tmp_path, "# nothing\n\n")
    assert r.returncode == 1
    assert "no data" in r.stderr
    assert r.stdout == ""


def test_bad_line(tmp_path):
    r = stats(tmp_path, "1\n2\n\nabc\n")
    assert r.returncode == 1
    assert "line 4" in r.stderr
