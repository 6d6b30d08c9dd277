#!/bin/bash
cd /app/config
grep -rlE --exclude-dir=archive --include='*.conf' --include='*.yaml' --include='*.env' 'db01\.old-dc\.internal|cache01\.old-dc\.internal' . | sed 's|^\./||' | sort > /app/changed_files.txt
xargs -d '\n' sed -i -e 's/db01\.old-dc\.internal/db-primary.new-dc.internal/g' -e 's/cache01\.old-dc\.internal/cache.new-dc.internal/g' < /app/changed_files.txt
cd /app
