"""tiny.py: the locally built model and tokenizer work through the real transformers and vLLM paths."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from tiny import BASH_TOOL, IM_END, IM_START, PAD_TOKEN, TAG_TOKENS, build_tiny_model

ROOT = Path(__file__).resolve().parents[1]


def call(command, as_string=False):
    args = {"command": command}
    return {"type": "function", "function": {"name": "bash",
                                             "arguments": json.dumps(args) if as_string else args}}


# An agent episode as rollout.py builds it, with awkward tool output (unicode, CRLF, tabs, trailing
# spaces, a literal tag) and both ways of passing arguments (dict, JSON string).
CONVERSATION = [
    {"role": "system", "content": "You are an agent in a Linux terminal."},
    {"role": "user", "content": "Create hello.txt containing hello."},
    {"role": "assistant", "content": "I will look around.", "tool_calls": [call("ls -la")]},
    {"role": "tool", "content": "total 0\r\n\tdrwx  é ☃ 🙂  \n<tool_call> not a call "},
    {"role": "assistant", "content": "",
     "tool_calls": [call("echo 'hello' > hello.txt && cat hello.txt", True)]},
    {"role": "tool", "content": ""},
    {"role": "assistant", "content": "<think>\nDone.\n</think>\n\nThe file exists."},
]


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def render(tok, messages, add_generation_prompt=False):
    return tok.apply_chat_template(messages, tools=[BASH_TOOL], tokenize=False,
                                   add_generation_prompt=add_generation_prompt)


def encode(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_loads_with_auto_classes(tiny_model_dir, tok):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    cfg = model.config
    assert cfg.model_type == "qwen3" and cfg.head_dim == 64 and cfg.max_position_embeddings == 4096
    assert cfg.vocab_size == len(tok), "every id the model can sample must decode"
    assert tok.eos_token == IM_END and cfg.eos_token_id == tok.eos_token_id
    assert tok.pad_token == PAD_TOKEN and cfg.pad_token_id == tok.pad_token_id
    assert all(p.dtype == torch.float32 for p in model.parameters())
    ids = torch.tensor([encode(tok, render(tok, CONVERSATION[:2], True))])
    assert model(input_ids=ids).logits.shape == (1, ids.shape[1], len(tok))


def test_special_and_tag_tokens_are_single_ids(tok):
    for t in [PAD_TOKEN, IM_START, IM_END, *TAG_TOKENS]:
        assert len(encode(tok, t)) == 1, t
    ids = encode(tok, "<|im_start|>assistant\n<tool_call>\nx\n</tool_call><|im_end|>")
    # As in Qwen: tool/think tags are special=False, so skip_special_tokens keeps them.
    assert tok.decode(ids, skip_special_tokens=True) == "assistant\n<tool_call>\nx\n</tool_call>"


def test_chat_template_renders_qwen_tool_format(tok):
    text = render(tok, CONVERSATION)
    assert text.startswith("<|im_start|>system\nYou are an agent in a Linux terminal.\n\n# Tools\n")
    assert "<tools>\n" + json.dumps(BASH_TOOL, ensure_ascii=False) + "\n</tools>" in text
    assert ('<|im_start|>assistant\nI will look around.\n<tool_call>\n{"name": "bash", "arguments": '
            '{"command": "ls -la"}}\n</tool_call><|im_end|>\n') in text
    assert ("<|im_start|>user\n<tool_response>\ntotal 0\r\n\tdrwx  é ☃ 🙂  \n<tool_call> not a call "
            "\n</tool_response><|im_end|>\n") in text
    # A JSON-string argument renders exactly like the dict form; empty content adds no blank line.
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "bash", "arguments": {"command": '
            '"echo \'hello\' > hello.txt && cat hello.txt"}}\n</tool_call><|im_end|>\n') in text
    assert "<|im_start|>user\n<tool_response>\n\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n<think>\nDone.\n</think>\n\nThe file exists.<|im_end|>\n")
    assert render(tok, CONVERSATION[:2], add_generation_prompt=True).endswith(
        "Create hello.txt containing hello.<|im_end|>\n<|im_start|>assistant\n")


def test_rendering_is_prefix_stable(tok):
    """chat.ChatFormat takes observation deltas: messages[:n] must render (and tokenize) as a prefix
    of messages[:n+1]."""
    for n in range(1, len(CONVERSATION)):
        short, long = render(tok, CONVERSATION[:n]), render(tok, CONVERSATION[:n + 1])
        assert long.startswith(short), n
        short_ids, long_ids = encode(tok, short), encode(tok, long)
        assert long_ids[:len(short_ids)] == short_ids, n
        if CONVERSATION[n]["role"] == "assistant":
            # What the model samples after the generation prompt is the turn up to and including <|im_end|>.
            prompt = render(tok, CONVERSATION[:n], add_generation_prompt=True)
            assert long.startswith(prompt) and long.endswith(IM_END + "\n"), n
            prompt_ids = encode(tok, prompt)
            assert long_ids[:len(prompt_ids)] == prompt_ids, n


def test_encode_decode_round_trips_exactly(tok):
    text = render(tok, CONVERSATION, add_generation_prompt=True)
    ids = encode(tok, text)
    assert tok.decode(ids) == text
    assert tok.decode(ids[:len(ids) // 2]) + tok.decode(ids[len(ids) // 2:]) == text  # cut at an ASCII token
    assert tok.convert_tokens_to_ids("<tool_call>") in ids


def test_build_is_idempotent_seeded_and_uses_the_corpus(tmp_path, tiny_model_dir):
    weights = tiny_model_dir / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    assert build_tiny_model(tiny_model_dir) == tiny_model_dir and weights.stat().st_mtime_ns == mtime

    small = dict(num_layers=1, corpus=["cat zorblaxfile.txt | zorblax --frob"] * 20)
    a = build_tiny_model(tmp_path / "a", seed=3, **small)
    b = build_tiny_model(tmp_path / "b", seed=3, **small)
    c = build_tiny_model(tmp_path / "c", seed=4, **small)
    wa, wb, wc = (load_file(d / "model.safetensors") for d in (a, b, c))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not torch.equal(wa["model.embed_tokens.weight"], wc["model.embed_tokens.weight"])
    assert (a / "tokenizer.json").read_text() == (b / "tokenizer.json").read_text()
    # The corpus shapes the vocabulary: its made-up word becomes a few tokens.
    word = " zorblax"
    assert (len(encode(AutoTokenizer.from_pretrained(a), word))
            < len(encode(AutoTokenizer.from_pretrained(tiny_model_dir), word)))


def test_bad_arguments_fail_clearly(tmp_path):
    with pytest.raises(ValueError, match="head_dim"):
        build_tiny_model(tmp_path / "x", head_dim=16)
    with pytest.raises(TypeError, match="corpus"):
        build_tiny_model(tmp_path / "x", corpus=[b"bytes"])
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not made by tiny.py"):
        build_tiny_model(tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def hf_logprobs(model, ids):
    """lp[t] = log p(ids[t] | ids[:t]); lp[0] = 0 (the repo-wide convention)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0]
    lp = torch.log_softmax(logits[:-1].float(), -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
    return torch.cat([torch.zeros(1), lp])


@pytest.mark.slow
def test_vllm_cpu_serves_it_and_takes_weight_updates(tiny_model_dir):
    """vLLM loads the dir, its sampled-token logprobs equal transformers', and an in-place reload lands.

    Runs in a child process: deleting an in-process vllm.LLM tears down vLLM's global parallel state,
    which would break the session's shared engine (conftest's vllm_engine).
    """
    env = dict(os.environ,
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, __file__, str(tiny_model_dir)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["num_tokens"] == 32 and r["max_id"] < r["vocab"]
    assert r["v0_max_diff"] < 1e-4, r                          # vLLM == transformers at the built weights
    assert r["detok_is_prefix"], r
    assert r["v1_max_diff"] < 1e-4, r                          # after reload_weights: == the new weights
    assert r["v1_vs_old_max_diff"] > 1e-2, r                   # ... and not the old ones


def vllm_check(model_dir):
    """The child process of the test above: numbers for it to assert on."""
    from vllm import LLM, SamplingParams, TokensPrompt

    tok = AutoTokenizer.from_pretrained(model_dir)
    hf = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    prompt = encode(tok, render(tok, CONVERSATION[:2], add_generation_prompt=True))
    llm = LLM(model=model_dir, dtype="float32", max_model_len=1024, enforce_eager=True, seed=0)
    params = SamplingParams(temperature=1.0, max_tokens=32, logprobs=0, seed=0, ignore_eos=True)

    def sample():
        out = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)[0].outputs[0]
        return (list(out.token_ids),
                torch.tensor([lp[t].logprob for t, lp in zip(out.token_ids, out.logprobs)]), out.text)

    def max_diff(model, ids, lps):
        return (hf_logprobs(model, prompt + ids)[len(prompt):] - lps).abs().max().item()

    ids, lps, text = sample()
    r = dict(num_tokens=len(ids), max_id=max(ids), vocab=len(tok), v0_max_diff=max_diff(hf, ids, lps),
             # vLLM's detokenizer agrees with decode(), except that it withholds a trailing incomplete
             # UTF-8 sequence (random byte tokens) that decode() shows as U+FFFD: use ids, not out.text.
             detok_is_prefix=len(text) > 10 and tok.decode(ids, skip_special_tokens=True).startswith(text))
    torch.manual_seed(0)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    llm.collective_rpc("reload_weights",
                       kwargs={"weights_iterator": [(n, p.detach()) for n, p in hf.named_parameters()]})
    llm.reset_prefix_cache()  # the prompt's cached KV was computed with the old weights
    ids, lps, _ = sample()
    r.update(v1_max_diff=max_diff(hf, ids, lps),
             v1_vs_old_max_diff=max_diff(AutoModelForCausalLM.from_pretrained(model_dir).eval(), ids, lps))
    return r


if __name__ == "__main__":
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    print(json.dumps(vllm_check(sys.argv[1])))
