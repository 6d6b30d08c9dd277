#!/bin/bash
# Scrambles the permissions of /srv/www (part of the image build).
cd /srv/www
chmod 777 public public/css uploads
chmod 700 public/img
chmod 666 public/index.html public/css/site.css
chmod 600 public/img/logo.png
chmod 644 bin/deploy.sh
chmod 777 bin/restart.sh
chmod 755 bin/README
chmod 755 config config/secrets
chmod 644 config/secrets/db.ini config/secrets/api.key
chmod 664 config/app.ini
chmod 777 uploads/avatar.png
chmod 4755 public/css/site.css
