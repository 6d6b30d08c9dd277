#!/bin/bash
cat > /app/stats.py <<'PY'
#!/usr/bin/env python3
"""Summary statistics for a file of numbers (one per line)."""
import sys


def read_numbers(path):
    values = []
    with open(path) as fh:
        for lineno, line in enumerate(fh, 1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            try:
                values.append(float(text))
            except ValueError:
                sys.exit(f"line {lineno}: not a number: {text!r}")
    return sorted(values)


def median(values):
    n = len(values)
    mid = n // 2
    return values[mid] if n % 2 else (values[mid - 1] + values[mid]) / 2


def main():
    values = read_numbers(sys.argv[1])
    if not values:
        sys.exit("no data")
    print(f"count: {len(values)}")
    print(f"mean: {sum(values) / len(values):.2f}")
    print(f"median: {median(values):.2f}")
    print(f"min: {values[0]:.2f}")
    print(f"max: {values[-1]:.2f}")


if __name__ == "__main__":
    main()
PY
python3 /app/stats.py /app/times.txt
