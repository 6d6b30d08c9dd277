#!/bin/bash
# Builds /app/webapp, a repository where build output, caches and a secrets file were committed.
set -e
export GIT_AUTHOR_DATE="2024-06-01T12:00:00Z" GIT_COMMITTER_DATE="2024-06-01T12:00:00Z"
git init -q -b main /app/webapp
cd /app/webapp
mkdir -p app/__pycache__ dist/assets tests
printf 'def handler():\n    return "ok"\n' > app/main.py
printf '' > app/__init__.py
printf 'compiled' > app/__pycache__/main.cpython-311.pyc
printf 'compiled' > app/legacy.pyc
printf 'bundle' > dist/app.js
printf 'css' > dist/assets/site.css
printf 'SECRET_KEY=dev-only-please-change\nDB_PASSWORD=hunter2\n' > .env
printf 'SECRET_KEY=\nDB_PASSWORD=\n' > .env.example
printf 'from app.main import handler\n\n\ndef test_handler():\n    assert handler() == "ok"\n' > tests/test_main.py
printf '# webapp\n' > README.md
git add -A && git commit -q -m "Initial commit"
printf 'def handler():\n    return "ok"\n\n\ndef health():\n    return "healthy"\n' > app/main.py
printf 'bundle v2' > dist/app.js
git add -A && GIT_COMMITTER_DATE="2024-06-02T12:00:00Z" git commit -q -m "Add health endpoint"
