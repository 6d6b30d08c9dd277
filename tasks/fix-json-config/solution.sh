#!/bin/bash
cd /app/service
cat > config.json <<'JSON'
{
  "name": "billing-api",
  "port": 8080,
  "log_level": "debug",
  "workers": 4,
  "database": {
    "host": "db.internal",
    "port": 5432,
    "pool_size": 10
  },
  "features": ["invoices", "refunds", "exports"],
  "timeout_s": 30,
  "allowed_origins": ["https://app.example.com"]
}
JSON
python3 /app/service/check.py
cd /app
