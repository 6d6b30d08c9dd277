#!/bin/bash
cd /app
python3 - <<'PY'
import hashlib, os
groups = {}
for dirpath, _, files in os.walk("/app/photos"):
    for name in files:
        path = os.path.join(dirpath, name)
        if os.path.isfile(path) and not os.path.islink(path) and os.path.getsize(path) > 0:
            digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
            groups.setdefault(digest, []).append(path)
removed = []
for paths in groups.values():
    paths.sort(key=os.fsencode)
    removed.extend(paths[1:])
for path in removed:
    os.remove(path)
removed.sort(key=os.fsencode)
with open("/app/removed.txt", "w") as out:
    out.writelines(p + "\n" for p in removed)
PY
