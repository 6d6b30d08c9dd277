#!/bin/bash
cd /app/storage
find . -type f -size +102400c ! -newermt '2024-01-01 00:00:00 UTC' | sed 's|^\./||' | sort > /tmp/stale.txt
while read -r rel; do mkdir -p "/app/archive/$(dirname "$rel")"; mv "$rel" "/app/archive/$rel"; done < /tmp/stale.txt
while read -r rel; do echo "$rel $(stat -c %s "/app/archive/$rel")"; done < /tmp/stale.txt > /tmp/manifest.txt
mv /tmp/manifest.txt /app/archive/manifest.txt
cd /app
