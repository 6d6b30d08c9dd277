#!/bin/bash
# Builds the repository /app/repo with a fixed history (part of the image build).
set -e
export GIT_AUTHOR_DATE="2024-03-01T10:00:00Z" GIT_COMMITTER_DATE="2024-03-01T10:00:00Z"
git init -q -b main /app/repo
cd /app/repo
mkdir -p config src
printf 'def main():\n    print("hello")\n' > src/app.py
printf '[server]\nport = 8000\nworkers = 2\n' > config/settings.ini
git add . && git commit -q -m "Initial import"
printf '[server]\nport = 8080\nworkers = 4\n\n[cache]\nttl = 300\n' > config/settings.ini
git add . && GIT_COMMITTER_DATE="2024-03-02T10:00:00Z" git commit -q -m "Tune server settings"
printf 'import logging\n\nlog = logging.getLogger("app")\n' > src/log.py
git add . && GIT_COMMITTER_DATE="2024-03-03T10:00:00Z" git commit -q -m "Add logging module"
git rm -q config/settings.ini
printf 'build/\n' > .gitignore
git add . && GIT_COMMITTER_DATE="2024-03-04T10:00:00Z" git commit -q -m "Cleanup unused files"
printf 'def main():\n    print("hello, world")\n' > src/app.py
git add . && GIT_COMMITTER_DATE="2024-03-05T10:00:00Z" git commit -q -m "Friendlier greeting"
printf '# demo app\n' > README.md
git add . && GIT_COMMITTER_DATE="2024-03-06T10:00:00Z" git commit -q -m "Add README"
