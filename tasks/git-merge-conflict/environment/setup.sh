#!/bin/bash
# Builds /app/service: main and feature/rate-limit both edited settings.py (conflicting merge).
set -e
export GIT_AUTHOR_DATE="2024-05-01T09:00:00Z" GIT_COMMITTER_DATE="2024-05-01T09:00:00Z"
git init -q -b main /app/service
cd /app/service
cat > settings.py <<'PY'
"""Service settings."""

SERVICE_NAME = "orders"
TIMEOUT_S = 10
MAX_RETRIES = 3
ALLOWED_HOSTS = ["orders.internal"]
PY
printf '__pycache__/\n' > .gitignore
git add -A && git commit -q -m "Initial settings"
git checkout -q -b feature/rate-limit
cat > settings.py <<'PY'
"""Service settings."""

SERVICE_NAME = "orders"
TIMEOUT_S = 10
MAX_RETRIES = 3
RATE_LIMIT_PER_MIN = 120
ALLOWED_HOSTS = ["orders.internal"]
PY
printf 'from settings import RATE_LIMIT_PER_MIN\n\n\ndef allow(count):\n    return count < RATE_LIMIT_PER_MIN\n' > ratelimit.py
GIT_COMMITTER_DATE="2024-05-02T09:00:00Z" git add -A && GIT_COMMITTER_DATE="2024-05-02T09:00:00Z" git commit -q -m "Add rate limiting"
git checkout -q main
cat > settings.py <<'PY'
"""Service settings."""

SERVICE_NAME = "orders"
TIMEOUT_S = 30
MAX_RETRIES = 5
ALLOWED_HOSTS = ["orders.internal", "orders.backup.internal"]
PY
GIT_COMMITTER_DATE="2024-05-03T09:00:00Z" git commit -q -am "Raise timeouts and add backup host"
