#!/bin/bash
cd /app
grep 'Failed password' /var/log/auth.log | sed -E 's/.* from ([0-9.]+) port .*/\1/' | sort | uniq -c | sort -k1,1nr > /tmp/fail_counts.txt
awk '$1 >= 5 {print $2}' /tmp/fail_counts.txt | sort -t. -k1,1n -k2,2n -k3,3n -k4,4n > /app/blocklist.txt
printf '{"total_failed": %d, "unique_ips": %d, "blocked": %d, "top_ip": "%s"}\n' "$(awk '{s += $1} END {print s}' /tmp/fail_counts.txt)" "$(wc -l < /tmp/fail_counts.txt)" "$(wc -l < /app/blocklist.txt)" "$(head -n 1 /tmp/fail_counts.txt | awk '{print $2}')" > /app/summary.json
cat /app/blocklist.txt /app/summary.json
