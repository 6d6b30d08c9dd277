import csv

EXPECTED = [
    ("alice martin", "alice.martin@example.com", "2022-12-01"),
    ("Bob Stone", "bob.stone@example.com", "2023-02-01"),
    ("Carla Diaz, PhD", "carla@example.org", "2023-03-07"),
    ("Dev Patel", "dev.patel@example.net", "2023-04-30"),
    ("Eve Adams", "eve@example.com", "2022-12-31"),
    ("Frank Ocean", "frank@example.com", "2024-01-09"),
    ("Ivy Chen", "ivy@example.com", "2023-09-18"),
]


def read():
    with open("/app/contacts_clean.csv", newline="") as fh:
        return [tuple(r) for r in csv.reader(fh) if r]


def test_header():
    assert read()[0] == ("name", "email", "signup_date")


def test_invalid_rows_dropped():
    emails = [r[1] for r in read()[1:]]
    assert "missing.name@example.com" not in emails
    assert "hank@example.com" not in emails
    assert all(e for e in emails)


def test_emails_unique_lowercase_sorted():
    emails = [r[1] for r in read()[1:]]
    assert emails == [e for _, e, _ in EXPECTED]


def test_dates_iso_and_earliest():
    assert {r[1]: r[2] for r in read()[1:]} == {e: d for _, e, d in EXPECTED}


def test_full_rows():
    assert read()[1:] == EXPECTED
