#!/bin/bash
cat > /app/csv2json.py <<'PY'
#!/usr/bin/env python3
"""Convert a CSV file with a header row into JSON, inferring simple value types."""
import argparse
import csv
import json
import re
import sys

INT_RE = re.compile(r"-?(0|[1-9][0-9]*)")


def convert(value):
    if value == "":
        return None
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    if INT_RE.fullmatch(value):
        return int(value)
    if re.search(r"[.eE]", value) and not re.search(r"[a-df-zA-DF-Z]", value):
        try:
            return float(value)
        except ValueError:
            pass
    return value


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("--key")
    args = parser.parse_args()
    try:
        with open(args.input, newline="", encoding="utf-8") as fh:
            reader = csv.reader(fh)
            header = next(reader, [])
            rows = [row for row in reader if row]
    except OSError as exc:
        print(f"csv2json: cannot read {args.input}: {exc.strerror}", file=sys.stderr)
        return 1
    objects = [{h: convert(v) for h, v in zip(header, row)} for row in rows]
    result = objects
    if args.key is not None:
        if args.key not in header:
            print(f"csv2json: no column named {args.key!r}", file=sys.stderr)
            return 1
        idx = header.index(args.key)
        result = {}
        for row, obj in zip(rows, objects):
            if row[idx] in result:
                print(f"csv2json: duplicate key {row[idx]!r} in column {args.key!r}", file=sys.stderr)
                return 1
            result[row[idx]] = obj
    with open(args.output, "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=2, ensure_ascii=False)
        fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
PY
chmod +x /app/csv2json.py
python3 /app/csv2json.py /app/inventory.csv /tmp/inventory.json && cat /tmp/inventory.json
