#!/bin/bash
# Builds /app/storage with fixed sizes and modification times (part of the image build).
mkfile() { mkdir -p "$(dirname "$1")"; head -c "$2" /dev/urandom > "$1"; touch -d "$3" "$1"; }
cd /app/storage
mkfile logs/app-2022.log        350000 "2022-11-03 10:00:00 UTC"
mkfile logs/app-2023.log        180000 "2023-12-31 23:59:00 UTC"
mkfile logs/app-2024.log        500000 "2024-02-10 08:00:00 UTC"
mkfile logs/small-2021.log        2048 "2021-05-01 00:00:00 UTC"
mkfile media/video-old.mp4     1048576 "2020-07-14 12:00:00 UTC"
mkfile media/video-new.mp4     1048576 "2024-06-01 12:00:00 UTC"
mkfile media/thumbs/t1.png      102400 "2019-01-01 00:00:00 UTC"
mkfile media/thumbs/t2.png      102401 "2019-01-01 00:00:00 UTC"
mkfile reports/q1-2023.pdf      240000 "2023-04-02 09:30:00 UTC"
mkfile reports/q4-2023.pdf      260000 "2024-01-01 00:00:01 UTC"
mkfile reports/summary.txt        5000 "2022-01-01 00:00:00 UTC"
mkfile tmp/cache.bin            900000 "2023-08-20 16:45:00 UTC"
