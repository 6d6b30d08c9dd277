#!/bin/bash
cd /app
python3 - <<'PY'
import csv
import datetime as dt


def parse_date(text):
    for fmt in ("%Y-%m-%d", "%d/%m/%Y", "%b %d %Y"):
        try:
            return dt.datetime.strptime(text.strip(), fmt).date()
        except ValueError:
            pass
    return None


best = {}
with open("/app/contacts_raw.csv", newline="") as fh:
    for row in csv.DictReader(fh):
        name = (row.get("name") or "").strip()
        email = (row.get("email") or "").strip().lower()
        date = parse_date(row.get("signup_date") or "")
        if not name or not email or date is None:
            continue
        if email not in best or date < best[email][1]:
            best[email] = (name, date)
with open("/app/contacts_clean.csv", "w", newline="") as fh:
    out = csv.writer(fh)
    out.writerow(["name", "email", "signup_date"])
    for email in sorted(best):
        out.writerow([best[email][0], email, best[email][1].isoformat()])
PY
