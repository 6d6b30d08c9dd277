"""The learner against a bare transformers step, on a model of a shipped shape built with random
weights on the device (configs/models/<name>/config.json: no download), and a synthetic
multi-turn batch (each row a prompt, then assistant turns, the chunks, between tool outputs).

    python bench/bench_gpu_trainer.py --config configs/qwen3-lora-1gpu.yaml          # LoRA, Qwen3-8B
    python bench/bench_gpu_trainer.py --config configs/qwen3-lora-1gpu.yaml --model Qwen3-4B \\
        --set model.lora=false --set train.micro_batch_tokens=16384 --rows 16384,16384,12000,8000,8000
    python bench/bench_gpu_trainer.py --model tiny --device cpu --rows 96,64,40 --peak-tflops 1  # the suite

For each case it times learner.rl_step (warm-up, then --repeats steps) against the bare step on the
same micro-batches (learner.micro_batches: forward with labels, transformers' own loss, backward,
the same AdamW step), and reports tokens/s, the learner's overhead over bare, MFU with attention
counted (model FLOPs, no recompute: 6N a token for full fine-tuning, 4N + 6N_adapter under LoRA,
and causal attention's 6·q_dim·L² a row and layer, over the device's peak from PEAK_TFLOPS or
--peak-tflops), and on CUDA the peak allocated memory against memory_plan's train phase. The
breakdown reruns rl_step with one change each: no top-k support, no entropy, 2^24-logit head
blocks, rows padded or packed. --json writes every figure.
"""
import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# dense bf16 tensor-core peaks (vendor data sheets, SXM parts), by a word of torch's device name
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 125.0, "B200": 2250.0}
TINY = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "tie_word_embeddings": False,
        "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}


def synthetic_batch(lengths: list[int], vocab: int, turns: int, seed: int = 0):
    """Rows of the given lengths: a tenth prompt, then `turns` assistant turns (sampled, chunks
    0..turns-1) with tool outputs between them; rewards alternate in groups of two."""
    import torch
    import algo
    g = torch.Generator().manual_seed(seed)
    B, T = len(lengths), max(lengths)
    ids = torch.randint(1, vocab, (B, T), generator=g)
    att, loss = torch.zeros(B, T, dtype=torch.long), torch.zeros(B, T)
    chunk = torch.full((B, T), -1)
    for b, n in enumerate(lengths):
        att[b, :n] = 1
        ids[b, n:] = 0
        edges = torch.linspace(max(1, n // 10), n, 2 * turns + 1).long().tolist()
        for k in range(turns):  # turn k: [edges[2k], edges[2k+1]); a tool output after it
            loss[b, edges[2 * k]:edges[2 * k + 1]] = 1
            chunk[b, edges[2 * k]:edges[2 * k + 1]] = k
    return algo.Batch(input_ids=ids, attention_mask=att, loss_mask=loss, imitation_mask=torch.zeros(B, T),
                      chunk_ids=chunk, num_chunks=torch.full((B,), turns),
                      infer_logprobs=-torch.rand(B, T, generator=g) * 2 * loss,
                      reward=torch.tensor([float(b % 2 == 0) for b in range(B)]),
                      valid=torch.ones(B, dtype=torch.bool), group_id=torch.arange(B) // 2,
                      policy_version=torch.zeros(B, dtype=torch.long), finish_reason=["submitted"] * B)


def step_flops(conf: dict, lengths: list[int], lora_params: int, lora: bool) -> float:
    """Model FLOPs of one training step on rows of `lengths` (no recompute counted): the linear
    layers' 6N a token (4N under LoRA, the frozen weights' gradients not taken, + 6N_adapter) and
    causal attention's QKᵀ and PV, 2·2·q_dim·L²/2 a row and layer forward, ×3 with backward."""
    import memory_plan
    s = memory_plan.model_shape(conf)
    linear = memory_plan.param_count(s) - s.vocab * s.hidden * (1 if s.tied else 2) + s.vocab * s.hidden
    tokens = sum(lengths)
    per_token = (4 * linear + 6 * lora_params) if lora else 6 * linear
    attention = 3 * 2 * s.q_dim * s.layers * sum(n * n for n in lengths)
    return per_token * tokens + attention


def bare_step(model, opt, batch, groups, dev):
    """transformers' own forward with labels and backward on each micro-batch, then the optimizer."""
    import learner
    opt.zero_grad(set_to_none=True)
    for g in groups:
        mb = learner.select_rows(batch, g)[0].to(dev)
        labels = mb.input_ids.masked_fill(mb.attention_mask == 0, -100)
        out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, labels=labels, use_cache=False)
        out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def timed(fn, dev, repeats: int) -> float:
    """Mean seconds of fn() over `repeats` calls after one warm-up call."""
    import torch
    fn()
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync()
    return (time.perf_counter() - t0) / repeats


def run_case(cfg, lengths, turns: int, dev, repeats: int, top_k: int, bare: bool) -> dict:
    """One case: rl_step's time and peak memory (and the bare step's on the same micro-batches)."""
    import torch
    import algo
    import config
    import learner
    model = learner.load_model(cfg, dev.type, random_weights=True)
    t = cfg.train
    opt, sched = learner.make_optimizer(model, 1e-6, 0.0, t.adam_betas, 0, 10, "constant")
    batch = synthetic_batch(lengths, model.config.vocab_size, turns)
    acfg = config.algo_cfg(cfg)
    adv = algo.compute_advantages(batch, acfg)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    def rl():
        learner.rl_step(model, opt, sched, batch, adv, acfg, t, top_k=top_k)
    out = {"rl_step_s": timed(rl, dev, repeats)}
    out["peak_gib"] = torch.cuda.max_memory_allocated() / 2 ** 30 if dev.type == "cuda" else None
    groups, _ = learner.micro_batches(model, batch.attention_mask.sum(1).tolist(), range(len(batch)),
                                      t.micro_batch_tokens)
    out["padding_frac"] = learner.padding_fraction(batch.attention_mask.sum(1).tolist(), groups)
    if bare:
        out["bare_s"] = timed(lambda: bare_step(model, opt, batch, groups, dev), dev, repeats)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    out["adapter_params"] = trainable if cfg.model.lora else 0
    return out


def planned_gib(cfg, dev, max_context: int) -> float | None:
    """memory_plan's train phase for this card, one process; None off CUDA."""
    import torch
    import memory_plan
    if dev.type != "cuda":
        return None
    card = torch.cuda.get_device_properties(dev).total_memory
    p = memory_plan.plan(cfg, 1, 1, card, None, max_context, False)
    return sum(b for _, b in next(v for k, v in p.phases.items() if k.startswith("train"))) / memory_plan.GiB


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "qwen3-lora-1gpu.yaml"))
    ap.add_argument("--model", default=None, help="configs/models/<name> or a folder with a config.json "
                    "(default: the config's model), or tiny")
    ap.add_argument("--set", action="append", default=[], help="config overrides, key=value")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--rows", default="32768,24576,16384,12288,8192,6144,4096,4096",
                    help="the rows' token counts, comma-separated")
    ap.add_argument("--turns", type=int, default=8, help="assistant turns (chunks) a row")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--peak-tflops", type=float, default=None, help="the device's peak (default PEAK_TFLOPS)")
    ap.add_argument("--no-breakdown", action="store_true", help="only the config as it is, and bare")
    ap.add_argument("--json", default=None, help="write every figure here")
    a = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import config
    import learner
    dev = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if a.device == "auto" else a.device)
    lengths = [int(x) for x in a.rows.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        if a.model == "tiny":
            model_dir = Path(tmp)
            (model_dir / "config.json").write_text(json.dumps(TINY))
        else:
            name = a.model or Path(config.load_config(a.config).model.path).name
            model_dir = Path(name) if (Path(name) / "config.json").is_file() else \
                ROOT / "configs" / "models" / name
        sets = [f"model.path={model_dir}", f"device={dev.type}", "model.build_tiny=false"] + a.set
        base = config.load_config(a.config, sets)
        conf = json.loads((model_dir / "config.json").read_text())
        top_k = config.rollout_cfg(base).top_k
        cases = [("as configured", [], True)]
        if not a.no_breakdown:
            flip = str(not base.train.pack_rows).lower()
            cases += [("top_k -1 (no support mask)", [], False),
                      ("no entropy", ["train.log_entropy=false"], False),
                      ("head blocks of 2^24 logits", ["train.head_block_logits=16777216"], False),
                      (f"pack_rows {flip}", [f"train.pack_rows={flip}"], False)]
        results = {}
        for name, extra, bare in cases:
            cfg = config.load_config(a.config, sets + extra)
            k = -1 if name.startswith("top_k -1") else top_k
            r = run_case(cfg, lengths, a.turns, dev, a.repeats, k, bare)
            learner.release_cached_memory(dev.type)
            r["plan_gib"] = planned_gib(cfg, dev, max(lengths))
            results[name] = r
    report(results, conf, lengths, base.model.lora, dev, a.peak_tflops)
    if a.json:
        Path(a.json).write_text(json.dumps({"device": str(dev), "rows": lengths, "cases": results,
                                            "torch": torch.__version__}, indent=1))
    return results


def report(results: dict, conf: dict, lengths: list[int], lora: bool, dev, peak_tflops: float | None):
    """One line a case: seconds, tokens/s, overhead over bare, MFU, peak against the plan."""
    import torch
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    peak = peak_tflops or next((v for k, v in PEAK_TFLOPS.items() if k in name), None)
    tokens = sum(lengths)
    first = next(iter(results.values()))
    print(f"{name}: {len(lengths)} rows, {tokens:,} tokens, padding {first['padding_frac']:.1%}, peak "
          f"{peak or '?'} TFLOP/s")
    for case, r in results.items():
        flops = step_flops(conf, lengths, r["adapter_params"], lora)
        mfu = f"MFU {flops / r['rl_step_s'] / (peak * 1e12):.1%}" if peak else "MFU ? (--peak-tflops)"
        r["tokens_per_s"] = tokens / r["rl_step_s"]
        r["mfu"] = flops / r["rl_step_s"] / (peak * 1e12) if peak else None
        line = f"  {case:<30s} rl_step {r['rl_step_s']:8.3f} s  {r['tokens_per_s']:10,.0f} tok/s  {mfu}"
        if "bare_s" in r:
            r["overhead"] = r["rl_step_s"] / r["bare_s"] - 1
            line += f"  bare {r['bare_s']:.3f} s ({r['overhead']:+.1%})"
        if r["peak_gib"] is not None:
            ratio = r["plan_gib"] / r["peak_gib"]
            line += f"  peak {r['peak_gib']:.1f} GiB, plan {r['plan_gib']:.1f} GiB ({ratio:.2f}x)"
        print(line, flush=True)


if __name__ == "__main__":
    main()
