#!/usr/bin/env python3
"""Validate the service configuration before a deploy. Prints OK or the first problem found."""
import json
import sys

PATH = "/app/service/config.json"
LEVELS = {"debug", "info", "warning", "error"}


def fail(msg):
    print(f"config error: {msg}")
    sys.exit(1)


def main():
    try:
        with open(PATH) as fh:
            cfg = json.load(fh)
    except json.JSONDecodeError as exc:
        fail(f"invalid JSON: {exc}")
    required = {"name": str, "port": int, "log_level": str, "workers": int, "database": dict,
                "features": list, "timeout_s": int, "allowed_origins": list}
    for key, typ in required.items():
        if key not in cfg:
            fail(f"missing key {key!r}")
        if not isinstance(cfg[key], typ) or isinstance(cfg[key], bool):
            fail(f"{key!r} must be of type {typ.__name__}")
    if not 1 <= cfg["port"] <= 65535:
        fail("port out of range")
    if cfg["log_level"] not in LEVELS:
        fail(f"log_level must be one of {sorted(LEVELS)}")
    db = cfg["database"]
    for key in ("host", "port", "pool_size"):
        if key not in db:
            fail(f"database.{key} missing")
    if db["port"] == cfg["port"]:
        fail("database port clashes with service port")
    print("OK")


if __name__ == "__main__":
    main()
