from pathlib import Path

EXPECTED = [("api", 6), ("db", 4), ("payments", 4), ("search", 4), ("auth", 2), ("mailer", 2)]


def rows():
    return [tuple(l.split()) for l in Path("/app/error_summary.txt").read_text().splitlines() if l.strip()]


def test_components():
    assert sorted(r[0] for r in rows()) == sorted(c for c, _ in EXPECTED)


def test_counts():
    assert {r[0]: int(r[1]) for r in rows()} == dict(EXPECTED)


def test_window_boundaries_inclusive():
    got = {r[0]: int(r[1]) for r in rows()}
    # 14:00:00 (search) and 14:59:59 (mailer) are inside; 13:59:59 and 15:00:00 are outside
    assert got.get("search") == 4 and got.get("mailer") == 2 and got.get("auth") == 2


def test_order_and_format():
    assert rows() == [(c, str(n)) for c, n in EXPECTED]
