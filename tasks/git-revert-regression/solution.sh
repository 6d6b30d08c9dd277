#!/bin/bash
cd /app/shop
git bisect start HEAD "$(git rev-list --max-parents=0 HEAD)"
git bisect run bash check.sh
bad=$(git rev-parse refs/bisect/bad)
git bisect reset
git revert --no-edit "$bad"
bash check.sh
cd /app
