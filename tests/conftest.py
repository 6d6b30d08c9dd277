"""Session-scoped fixtures shared by the whole suite: one tiny model, one vLLM engine, one Env.

Each section is owned by one script's tests; edit only your own section.
"""
import os
import sys
from pathlib import Path

# vLLM must run in-process (no engine subprocess) and with a small CPU KV cache in tests.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: end-to-end tests that take minutes")


# --- env (Docker) -------------------------------------------------------------------------

# --- tiny model ---------------------------------------------------------------------------

# --- rollout (vLLM engine) ----------------------------------------------------------------

# --- train --------------------------------------------------------------------------------

# --- evaluate -----------------------------------------------------------------------------
