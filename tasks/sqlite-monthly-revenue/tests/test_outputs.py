import csv
import sqlite3

EXPECTED = [
    ("2024-01", 4, "424.37"), ("2024-02", 4, "920.89"), ("2024-03", 5, "3076.71"),
    ("2024-04", 3, "1286.85"), ("2024-05", 4, "3230.30"), ("2024-06", 6, "3036.19"),
    ("2024-07", 2, "388.41"), ("2024-08", 4, "1650.30"), ("2024-09", 1, "259.94"),
    ("2024-10", 4, "1562.83"), ("2024-11", 3, "759.92"), ("2024-12", 4, "2001.84"),
]


def db():
    return sqlite3.connect("file:/app/shop.db?mode=ro", uri=True)


def test_data_unchanged():
    con = db()
    assert con.execute("SELECT COUNT(*), SUM(id) FROM orders").fetchone() == (85, 3655)
    assert con.execute("SELECT COUNT(*), SUM(quantity) FROM order_items").fetchone() == (185, 492)
    assert con.execute("SELECT SUM(price_cents) FROM products").fetchone() == (35446,)


def test_view_exists_with_columns():
    con = db()
    assert con.execute("SELECT type FROM sqlite_master WHERE name = 'monthly_revenue'").fetchone() == ("view",)
    cols = [d[0] for d in con.execute("SELECT * FROM monthly_revenue").description]
    assert cols == ["month", "orders", "revenue_cents"]


def test_view_rows():
    rows = db().execute("SELECT month, orders, revenue_cents FROM monthly_revenue ORDER BY month").fetchall()
    assert rows == [(m, n, int(r.replace(".", ""))) for m, n, r in EXPECTED]


def test_csv_header_and_rows():
    with open("/app/monthly_revenue_2024.csv", newline="") as fh:
        rows = [r for r in csv.reader(fh) if r]
    assert rows[0] == ["month", "orders", "revenue"]
    assert rows[1:] == [[m, str(n), r] for m, n, r in EXPECTED]


def test_empty_order_counted_in_june():
    with open("/app/monthly_revenue_2024.csv", newline="") as fh:
        june = [r for r in csv.reader(fh) if r and r[0] == "2024-06"]
    assert june == [["2024-06", "6", "3036.19"]]
