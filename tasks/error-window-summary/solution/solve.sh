#!/bin/bash
cd /app
awk '$1 >= "2024-03-10T14:00:00Z" && $1 <= "2024-03-10T14:59:59Z" && $1 ~ /^[0-9]{4}-[0-9]{2}-[0-9]{2}T/ && $2 == "[ERROR]" { sub(/:$/, "", $3); n[$3]++ } END { for (c in n) print c, n[c] }' logs/app.log | sort -k2,2nr -k1,1 > error_summary.txt
cat error_summary.txt
