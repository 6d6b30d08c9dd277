#!/bin/bash
cd /app
awk '{print $1}' access.log | sort | uniq -c | sort -k1,1nr -k2,2 | head -n 5 | awk '{print $1, $2}' > top_ips.txt
awk '$9 == 404 {print $7}' access.log | sort | uniq -c | awk '{print $1, $2}' | LC_ALL=C sort -k1,1nr -k2,2 > not_found.txt
