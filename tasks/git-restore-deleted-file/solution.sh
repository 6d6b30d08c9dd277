#!/bin/bash
cd /app/repo
deleted_in=$(git log -n 1 --format=%H --diff-filter=D -- config/settings.ini)
git checkout "${deleted_in}^" -- config/settings.ini
git commit -m "Restore settings.ini"
git log --oneline -n 3
cd /app
