#!/bin/bash
# Builds /app/incoming: CSV files hidden in nested archives (part of the image build).
set -e
w=$(mktemp -d)
cd "$w"
mkcsv() { { echo "date,store,amount"; for i in $(seq 1 "$2"); do echo "$1-$(printf %02d $(( (i % 28) + 1 ))),store$((i % 4)),$((i * 7 % 100)).$((i % 10))0"; done; } > "$1.csv"; }
mkcsv 2024-01 31; mkcsv 2024-02 29; mkcsv 2024-03 31; mkcsv 2024-04 30; mkcsv 2024-05 31; mkcsv 2024-06 30
mkdir -p b1/data b1/misc && mv 2024-01.csv b1/data/ && echo "not data" > b1/misc/readme.txt
mkdir -p z && mv 2024-02.csv z/ && echo "notes" > z/notes.txt && (cd z && zip -q -X ../reports.zip 2024-02.csv notes.txt) && mv reports.zip b1/misc/
tar -czf batch1.tar.gz -C b1 data misc
bzip2 2024-03.csv
mkdir -p inner && mv 2024-04.csv inner/ && tar -cJf q2-part.tar.xz -C inner 2024-04.csv
gzip 2024-05.csv
zip -q -X batch2.zip 2024-03.csv.bz2 q2-part.tar.xz 2024-05.csv.gz
mkdir -p /app/incoming
mv batch1.tar.gz batch2.zip /app/incoming/
mv 2024-06.csv /app/incoming/2024-06.csv
echo "ignore me" > /app/incoming/CHECKSUMS.txt
cd / && rm -rf "$w"
