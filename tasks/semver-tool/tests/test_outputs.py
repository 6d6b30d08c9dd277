import importlib.util
import subprocess
import sys

import pytest


def load():
    spec = importlib.util.spec_from_file_location("semver_under_test", "/app/semver.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def sv():
    return load()


def test_parse(sv):
    assert tuple(sv.parse("1.2.3")) == (1, 2, 3, ())
    assert tuple(sv.parse("10.20.30-rc.1+build.7")) == (10, 20, 30, ("rc", "1"))
    assert tuple(sv.parse("0.0.1+meta")) == (0, 0, 1, ())


@pytest.mark.parametrize("bad", ["1.2", "01.2.3", "1.2.3-", "a.b.c", "1.2.3.4", "", "1.2.3-rc..1", "-1.2.3"])
def test_parse_rejects(sv, bad):
    with pytest.raises(ValueError):
        sv.parse(bad)


def test_compare_core_numeric(sv):
    assert sv.compare("1.10.0", "1.9.0") == 1
    assert sv.compare("1.9.0", "1.10.0") == -1
    assert sv.compare("2.0.0", "2.0.0") == 0


def test_compare_prerelease_chain(sv):
    # the precedence example from the SemVer 2.0.0 specification
    chain = ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta", "1.0.0-beta.2",
             "1.0.0-beta.11", "1.0.0-rc.1", "1.0.0"]
    for lo, hi in zip(chain, chain[1:]):
        assert sv.compare(lo, hi) == -1, (lo, hi)
        assert sv.compare(hi, lo) == 1, (hi, lo)


def test_compare_ignores_build(sv):
    assert sv.compare("1.0.0+a", "1.0.0+b") == 0
    assert sv.compare("1.0.0-rc.1+x", "1.0.0-rc.1") == 0


def test_bump(sv):
    assert sv.bump("1.4.2", "patch") == "1.4.3"
    assert sv.bump("1.4.2", "minor") == "1.5.0"
    assert sv.bump("1.4.2", "major") == "2.0.0"
    assert sv.bump("1.4.2-rc.1", "minor") == "1.5.0"
    assert sv.bump("1.4.2-rc.1", "patch") == "1.4.2"
    assert sv.bump("1.4.2+build.9", "patch") == "1.4.3"
    with pytest.raises(ValueError):
        sv.bump("1.4.2", "micro")


def test_cli_sort():
    r = subprocess.run([sys.executable, "/app/semver.py", "sort", "/app/versions.txt"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0.9.12", "1.2.0-alpha", "1.2.0-alpha.1", "1.2.0-alpha.beta",
                                "1.2.0-beta.2", "1.2.0-beta.11", "1.2.0-rc.1", "1.2.0-rc.1+build.5",
                                "1.2.0", "1.10.0", "2.0.0"]


def test_cli_bump_and_errors():
    ok = subprocess.run([sys.executable, "/app/semver.py", "bump", "major", "0.9.12"],
                        capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0 and ok.stdout.strip() == "1.0.0"
    bad = subprocess.run([sys.executable, "/app/semver.py", "bump", "minor", "1.2"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and bad.stderr.strip()
