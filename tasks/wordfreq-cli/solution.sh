#!/bin/bash
cat > /app/wordfreq.py <<'PY'
#!/usr/bin/env python3
"""Print the most frequent words of a text file."""
import argparse
import collections
import re
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=10, help="how many words to print")
    parser.add_argument("file", help="text file, or - for standard input")
    args = parser.parse_args()
    if args.file == "-":
        text = sys.stdin.read()
    else:
        try:
            with open(args.file, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except OSError as exc:
            print(f"wordfreq: cannot read {args.file}: {exc.strerror}", file=sys.stderr)
            return 1
    counts = collections.Counter(w.lower() for w in re.findall(r"[A-Za-z]+", text))
    for word, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[: args.n]:
        print(word, count)
    return 0


if __name__ == "__main__":
    sys.exit(main())
PY
chmod +x /app/wordfreq.py
python3 /app/wordfreq.py -n 3 /app/sample.txt
