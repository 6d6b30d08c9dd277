#!/bin/bash
cd /app
python3 - <<'PY'
import csv
from decimal import Decimal
with open("/app/data/customers.csv", newline="", encoding="utf-8") as fh:
    customers = {row["customer_id"]: row for row in csv.DictReader(fh)}
totals = {}
with open("/app/data/orders.csv", newline="", encoding="utf-8") as fh:
    for row in csv.DictReader(fh):
        if row["status"] == "completed" and row["customer_id"] in customers:
            count, amount = totals.get(row["customer_id"], (0, Decimal(0)))
            totals[row["customer_id"]] = (count + 1, amount + Decimal(row["amount"]))
rows = sorted(totals.items(), key=lambda kv: (-kv[1][1], int(kv[0])))
with open("/app/report.csv", "w", newline="", encoding="utf-8") as fh:
    out = csv.writer(fh)
    out.writerow(["customer_id", "name", "country", "completed_orders", "total_amount"])
    for cid, (count, amount) in rows:
        c = customers[cid]
        out.writerow([cid, c["name"], c["country"], count, f"{amount:.2f}"])
PY
