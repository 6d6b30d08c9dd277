#!/bin/bash
mkdir -p /app/backups
cd /app
tar -czf /app/backups/project-backup.tar.gz --exclude='node_modules' --exclude='*.log' --exclude='./project/build' ./project
cd /app/backups
sha256sum project-backup.tar.gz > project-backup.tar.gz.sha256
tar -tzf project-backup.tar.gz
cd /app
