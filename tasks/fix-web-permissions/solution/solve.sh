#!/bin/bash
cd /srv/www
find /srv/www -type d -exec chmod 0755 {} +
find /srv/www -type f -exec chmod 0644 {} +
find /srv/www/bin -maxdepth 1 -type f -name '*.sh' -exec chmod 0755 {} +
chmod 0700 /srv/www/config/secrets
find /srv/www/config/secrets -type f -exec chmod 0600 {} +
chmod 0733 /srv/www/uploads
find /srv/www -printf '%m %p\n' | sort -k2
cd /app
