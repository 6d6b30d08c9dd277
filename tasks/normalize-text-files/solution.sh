#!/bin/bash
cd /app
python3 - <<'PY'
import re
from pathlib import Path
for path in Path("/app/docs").rglob("*"):
    if not path.is_file() or not path.name.endswith((".txt", ".md")):
        continue
    data = path.read_bytes().replace(b"\r\n", b"\n")
    lines = [re.sub(rb"[ \t]+$", b"", line) for line in data.split(b"\n")]
    data = b"\n".join(lines).rstrip(b"\n")
    path.write_bytes(data + b"\n" if data else b"")
PY
