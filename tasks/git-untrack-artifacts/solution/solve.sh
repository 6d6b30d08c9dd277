#!/bin/bash
cd /app/webapp
printf 'dist/\n__pycache__/\n*.pyc\n.env\n' > .gitignore
git rm -r -q --cached dist app/__pycache__ app/legacy.pyc .env
git add .gitignore
git commit -m "Stop tracking generated files"
git status --short
cd /app
