#!/usr/bin/env python3
"""A tiny long-running worker: prints a heartbeat every half second until told to stop."""
import signal
import sys
import time

running = True


def stop(signum, frame):
    global running
    running = False


signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
n = 0
while running:
    n += 1
    print(f"heartbeat {n}", flush=True)
    time.sleep(0.5)
print("worker stopping", flush=True)
sys.exit(0)
