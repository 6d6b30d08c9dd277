#!/bin/bash
mkdir -p /app/extracted /tmp/unpack
cd /tmp/unpack
cp /app/incoming/* /tmp/unpack/
for round in 1 2 3 4; do for a in $(find . -type f \( -name '*.tar.gz' -o -name '*.tar.xz' -o -name '*.zip' \)); do d="${a}.d"; mkdir -p "$d"; case "$a" in *.zip) unzip -q -o "$a" -d "$d" ;; *) tar -xf "$a" -C "$d" ;; esac; rm -f "$a"; done; done
find . -type f -name '*.csv.gz' -exec gunzip -f {} \;
find . -type f -name '*.csv.bz2' -exec bunzip2 -f {} \;
find . -type f -name '*.csv.xz' -exec unxz -f {} \;
find . -type f -name '*.csv' -exec cp {} /app/extracted/ \;
cd /app/extracted
for f in $(ls *.csv | sort); do echo "$f $(( $(wc -l < "$f") - 1 ))"; done > /tmp/summary.txt
awk '{ s += $2 } END { print "TOTAL", s }' /tmp/summary.txt >> /tmp/summary.txt
mv /tmp/summary.txt /app/extracted/summary.txt
cat /app/extracted/summary.txt
cd /app
