from pathlib import Path

EXPECTED = [
    ("west", "38931.66"),
    ("north", "27462.93"),
    ("central", "23791.62"),
    ("south", "21037.25"),
    ("east", "12481.91"),
]


def rows():
    return [l.split() for l in Path("/app/region_totals.txt").read_text().splitlines() if l.strip()]


def test_has_all_regions_lowercase():
    names = [r[0] for r in rows() if r[0] != "TOTAL"]
    assert sorted(names) == sorted(n for n, _ in EXPECTED)


def test_region_revenues():
    got = {r[0]: r[1] for r in rows() if r[0] != "TOTAL"}
    assert got == dict(EXPECTED)


def test_order_by_revenue():
    assert [r[0] for r in rows()][:5] == [n for n, _ in EXPECTED]


def test_total_line_last():
    assert rows()[-1] == ["TOTAL", "123705.37"]
    assert len(rows()) == 6
