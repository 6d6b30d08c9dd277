import csv
from pathlib import Path

EXPECTED = [
    ("1", "Smith, John", "US", "9", "1631.88"),
    ("6", "Dubois, Claire", "FR", "5", "1406.13"),
    ("5", 'Lopez "Lola" Maria', "ES", "7", "1276.93"),
    ("10", "Khan, Imran", "PK", "4", "1158.45"),
    ("2", "Müller, Anna", "DE", "5", "1086.42"),
    ("3", "Chen Wei", "CN", "2", "739.08"),
    ("4", "O'Brien, Pat", "IE", "2", "500.50"),
    ("9", "Silva, Ana", "BR", "3", "368.41"),
]


def read():
    with open("/app/report.csv", newline="", encoding="utf-8") as fh:
        return [tuple(c.strip() for c in row) for row in csv.reader(fh) if row]


def test_header():
    assert read()[0] == ("customer_id", "name", "country", "completed_orders", "total_amount")


def test_customers_included():
    assert sorted(r[0] for r in read()[1:]) == sorted(r[0] for r in EXPECTED)


def test_counts_and_totals():
    got = {r[0]: (r[3], r[4]) for r in read()[1:]}
    assert got == {r[0]: (r[3], r[4]) for r in EXPECTED}


def test_names_survive_csv_quoting():
    got = {r[0]: (r[1], r[2]) for r in read()[1:]}
    assert got == {r[0]: (r[1], r[2]) for r in EXPECTED}


def test_row_order():
    assert read()[1:] == EXPECTED
