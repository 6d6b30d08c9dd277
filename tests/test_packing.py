"""A micro-batch's rows packed into one sequence (position ids restarting at each row, a
block-diagonal causal mask) give the padded path's log-probs and entropies: to fp32 rounding in
fp32 and to bf16 tolerance in bf16, on a tiny Qwen3 model and on SmolLM2-135M (Llama layout),
with rows of different lengths; and an RL step packed moves the weights as the padded one."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import learner

ROOT = Path(__file__).resolve().parents[1]
LENGTHS = [37, 5, 22, 1, 30]  # a one-token row too: its only log-prob is position 0's


def rows_of(vocab: int, lengths=LENGTHS, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (len(lengths), max(lengths)), generator=g)
    att = torch.zeros_like(ids)
    for b, n in enumerate(lengths):
        att[b, :n] = 1
        ids[b, n:] = 0
    return ids, att


def both_paths(model, ids, att, lengths, **kw):
    real = att.bool()
    out = []
    for packed in (False, True):
        lp, ent = learner.model_logprobs(model, ids, att, lengths if packed else None, with_entropy=True,
                                         **kw)
        out.append((lp.float()[real], ent.float()[real]))
    return out


def tiny_qwen3(dtype, attn=None):
    from transformers import AutoModelForCausalLM, Qwen3Config
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False)
    kw = {"attn_implementation": attn} if attn else {}
    return AutoModelForCausalLM.from_config(cfg, **kw).to(dtype).eval()


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-5), (torch.bfloat16, 0.1)])
def test_packed_logprobs_equal_the_padded_paths_on_a_tiny_model(dtype, tol):
    model = tiny_qwen3(dtype)
    ids, att = rows_of(300)
    with torch.no_grad():
        (lp, ent), (plp, pent) = both_paths(model, ids, att, LENGTHS, temperature=0.9, top_k=40)
    assert (lp - plp).abs().max() <= tol and (ent - pent).abs().max() <= tol, ((lp - plp).abs().max(), dtype)
    assert lp.abs().sum() > 0 and (plp[torch.cumsum(torch.tensor([0] + LENGTHS[:-1]), 0)] == 0).all()


def test_a_gpu_without_flash_attn_packs_under_flex_attention_and_its_logprobs_are_paddings():
    """On CUDA without flash_attn the packed rows go through flex attention (its block mask skips
    the blocks between rows; SDPA's would be a dense L x L mask). Its forward runs on CPU too, so
    its log-probs are checked here against the padded SDPA path's; its backward runs on a GPU only
    (scripts/gpu_check.py's packed item)."""
    try:
        import flash_attn  # noqa: F401
        want = "flash_attention_2"
    except ImportError:
        want = "flex_attention"
    assert learner.packed_attention("cuda") == want and learner.packed_attention("cpu") is None
    padded, flex = tiny_qwen3(torch.float32), tiny_qwen3(torch.float32, "flex_attention")
    assert flex.config._attn_implementation == "flex_attention"
    flex.load_state_dict(padded.state_dict())
    ids, att = rows_of(300)
    real = att.bool()
    with torch.no_grad():
        lp, ent = learner.model_logprobs(padded, ids, att, None, with_entropy=True, top_k=40)
        plp, pent = learner.model_logprobs(flex, ids, att, LENGTHS, with_entropy=True, top_k=40)
    assert (lp[real] - plp[real]).abs().max() <= 2e-5 and (ent[real] - pent[real]).abs().max() <= 2e-5
    assert lp[real].abs().sum() > 0


def test_a_packed_rl_step_moves_the_weights_as_the_padded_one(tmp_path):
    import algo
    import config
    from test_learner_step import chunked_batch, tiny_model
    tiny_model(tmp_path)
    results = []
    for pack in (False, True):
        cfg = config.load_config(ROOT / "configs" / "tiny.yaml", [
            f"model.path={tmp_path}", "model.build_tiny=false", "algo.baseline=grpo",
            "algo.negative_reward=-1", "train.micro_batch_tokens=70", f"train.pack_rows={str(pack).lower()}",
            "train.head_block_logits=4096"])  # a few positions a head block: blocks cross the packed rows
        acfg = config.algo_cfg(cfg)
        model = learner.load_model(cfg, "cpu")
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        batch = chunked_batch(model.config.vocab_size)
        m = learner.rl_step(model, opt, sched, batch, algo.compute_advantages(batch, acfg), acfg, cfg.train,
                            top_k=40)
        results.append((m, torch.cat([p.detach().flatten() for p in model.parameters()])))
    (m0, w0), (m1, w1) = results
    for k in ("loss", "grad_norm", "entropy", "ratio_mean"):
        assert abs(m0[k] - m1[k]) <= 1e-5 * max(1.0, abs(m0[k])), (k, m0[k], m1[k])
    torch.testing.assert_close(w1, w0, rtol=0, atol=1e-5)


def test_packed_logprobs_equal_the_padded_paths_on_smollm2():
    """fp32: to rounding (the entropy sums p log p over the whole vocabulary: its rounding is larger
    than a log-prob's, up to ~1e-4 at one position on some CPUs; a row that attended to another row's
    tokens would be off by far more). bf16: a 30-layer model's bf16 log-probs sit ~0.08 (mean) from
    fp32's on either path, and the packed path's error is the padded path's (mean within 25%, max
    within 2x)."""
    from transformers import AutoModelForCausalLM
    r = subprocess.run([sys.executable, "scripts/get_smollm2.py"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    path = Path(r.stdout.strip().splitlines()[-1])
    lengths = [96, 17, 64, 40]
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
        assert type(model).__name__ == "LlamaForCausalLM"
        ids, att = rows_of(model.config.vocab_size, lengths, seed=1)
        with torch.no_grad():
            out[dtype] = both_paths(model, ids, att, lengths, top_k=50)
    (lp, ent), (plp, pent) = out[torch.float32]
    assert (lp - plp).abs().max() <= 1e-4 and (ent - pent).abs().max() <= 1e-3, \
        ((lp - plp).abs().max(), (ent - pent).abs().max())
    padded, packed = ((x[0] - lp).abs() for x in out[torch.bfloat16])
    assert packed.mean() <= 1.25 * padded.mean() + 1e-3 and packed.max() <= 2 * padded.max(), \
        (packed.mean(), padded.mean(), packed.max(), padded.max())
