#!/usr/bin/env python3
"""Summary statistics for a file of numbers (one per line)."""
import sys


def read_numbers(path):
    with open(path) as fh:
        return sorted(line.strip() for line in fh)


def median(values):
    n = len(values)
    return values[n // 2]


def main():
    values = read_numbers(sys.argv[1])
    total = 0
    for v in values:
        total += float(v)
    mean = total // len(values)
    print(f"count: {len(values)}")
    print(f"mean: {mean:.2f}")
    print(f"median: {float(median(values)):.2f}")
    print(f"min: {float(values[0]):.2f}")
    print(f"max: {float(values[-1]):.2f}")


if __name__ == "__main__":
    main()
