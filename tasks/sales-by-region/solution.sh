#!/bin/bash
cd /app
awk 'NF == 5 && $1 !~ /^#/ && $1 != "date" { rev[tolower($2)] += $4 * $5 } END { for (r in rev) printf "%s %.2f\n", r, rev[r] }' sales.txt | sort -k2,2nr > region_totals.txt
awk '{ s += $2 } END { printf "TOTAL %.2f\n", s }' region_totals.txt >> region_totals.txt
