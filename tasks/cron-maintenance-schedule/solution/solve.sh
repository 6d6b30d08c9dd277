#!/bin/bash
mkdir -p /etc/cron.d
cat > /etc/cron.d/maintenance <<'CRON'
# Maintenance jobs (cron.d format: min hour dom month dow user command)
SHELL=/bin/bash
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
MAILTO=ops@example.org

30 2 * * * root /opt/maint/backup.sh
*/15 8-18 * * 1-5 www-data /opt/maint/rotate-logs.sh --compress
0 6 1 * * root /opt/maint/report.sh monthly
45 23 * * 0 nobody /opt/maint/cleanup-tmp.sh
CRON
chmod 0644 /etc/cron.d/maintenance
chmod 0755 /opt/maint/*.sh
cat /etc/cron.d/maintenance
