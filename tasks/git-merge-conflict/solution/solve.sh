#!/bin/bash
cd /app/service
git merge --no-edit feature/rate-limit
cat > settings.py <<'PY'
"""Service settings."""

SERVICE_NAME = "orders"
TIMEOUT_S = 30
MAX_RETRIES = 5
RATE_LIMIT_PER_MIN = 120
ALLOWED_HOSTS = ["orders.internal", "orders.backup.internal"]
PY
git add settings.py
git commit --no-edit
git log --oneline --graph -n 5
cd /app
