#!/bin/bash
mkdir -p /app/sorted/images /app/sorted/documents /app/sorted/archives /app/sorted/other
cd /app/inbox
for f in *; do lc=$(printf '%s' "$f" | tr 'A-Z' 'a-z'); case "$lc" in *.jpg|*.jpeg|*.png|*.gif) dest=images ;; *.pdf|*.txt|*.md|*.docx|*.xlsx|*.csv) dest=documents ;; *.tar.gz|*.tgz|*.zip) dest=archives ;; *) dest=other ;; esac; mv -- "$f" "/app/sorted/$dest/"; done
for c in archives documents images other; do echo "$c $(ls -A /app/sorted/$c | wc -l)"; done > /app/sorted/summary.txt
cd /app
