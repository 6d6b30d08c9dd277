"""The trainer's side: its model (device, load, save) and one optimizer step on a Batch, in
token-budget micro-batches.

SFT and RL share it; they differ only in the loss of a micro-batch and in which rows train:

    opt, sched = make_optimizer(model, lr, weight_decay, betas, warmup, total, "cosine")
    metrics = rl_step(model, opt, sched, batch, adv, acfg, cfg.train)   # algo.policy_loss
    metrics = sft_step(model, opt, sched, batch, cfg.train)        # NLL on loss_mask tokens

Every micro-batch's loss is backpropagated with denominator 1, and the summed gradient is divided
by the whole batch's denominator afterwards (algo.py's module docstring derives why that is the
full-batch loss). Rows are packed by padded token count, not by row count, so one long episode
does not blow the memory of a forward and short ones do not waste it on padding.
"""
import contextlib
import ctypes
import dataclasses
import math
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

import algo
import logprobs
import memory_plan
import distributed


# -----------------------------------------------------------------------------------------------
# the model: device, load, save


def pick_device(cfg) -> str:
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("device: cuda, but torch sees no GPU (torch.cuda.is_available() is False). "
                         "Check nvidia-smi and that torch is a CUDA build, or run with --set device=cpu.")
    if cfg.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return cfg.device


def check_model_path(cfg):
    """A local model directory, or a hub id (org/name) that is cached or reachable: said at once,
    with what to do, instead of transformers' OSError after its retries (test_rundir.py)."""
    if cfg.model.build_tiny:
        return
    path = cfg.model.path
    p = Path(path).expanduser()
    if (p / "config.json").exists():
        return
    if cfg.model.fetch:  # a folder a script makes: that script, not a hub download, is what to run
        state = (f"{p} is not a model directory (no config.json)" if p.exists()
                 else f"{p.resolve()} does not exist")
        raise SystemExit(f"model.path {path!r}: {state}. This config's model is made by `{cfg.model.fetch}` "
                         f"(model.fetch): run that, then this command again.")
    hint = ("Point model.path at a local Hugging Face model directory, or a hub id (org/name), or set "
            "model.build_tiny: true to build the tiny CPU model there.")
    if p.exists() or path.count("/") != 1 or path.startswith((".", "/", "~")):
        raise SystemExit(f"model.path {path!r}: "
                         + (f"{p} is not a model directory (no config.json). " if p.exists()
                            else f"{p.resolve()} does not exist. ") + hint)
    problem = _hub_model_problem(path)
    if problem:
        raise SystemExit(f"model.path {path!r} is not a local directory ({p.resolve()} does not exist), "
                         f"and as a Hugging Face hub id: {problem}. Point model.path at a local model "
                         f"directory; or, on a machine with network, `huggingface-cli download {path}` and "
                         f"copy its cache here, then set HF_HUB_OFFLINE=1 so nothing is looked up online.")


def _hub_model_problem(repo_id: str) -> str | None:
    """Why `repo_id` cannot be loaded from the Hugging Face cache or the hub, or None."""
    from huggingface_hub import HfApi, constants, try_to_load_from_cache  # only a hub id needs it
    if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        return None
    if constants.HF_HUB_OFFLINE:
        return f"HF_HUB_OFFLINE is set and it is not in the cache ({constants.HF_HUB_CACHE})"
    try:
        HfApi().model_info(repo_id, timeout=10)  # one short try: no network means seconds, not a minute
    except Exception as e:  # noqa: BLE001 -- connection, DNS, 401/404: all mean "cannot get it"
        return (f"not in the cache ({constants.HF_HUB_CACHE}) and the hub did not answer for it "
                f"({type(e).__name__}: {e})")
    return None


def cpu_has_bf16_units(flags: set) -> bool:
    """Whether a CPU with these /proc/cpuinfo flags computes bf16 in hardware (AVX512-BF16, AMX):
    elsewhere torch emulates bf16 and a SmolLM2 step is many times slower than in fp32."""
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def _cpu_flags() -> set:
    try:
        return set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return set()


def compute_dtype(cfg, device: str):
    """The dtype the trainer computes in (model.dtype): auto = bf16 on GPU, fp32 on CPU; fast = bf16
    on GPU and on a CPU with bf16 units, fp32 on other CPUs (a laptop's AVX2 emulates bf16)."""
    if cfg.model.dtype == "fast":
        return torch.bfloat16 if device == "cuda" or cpu_has_bf16_units(_cpu_flags()) else torch.float32
    return {"auto": torch.bfloat16 if device == "cuda" else torch.float32, "float32": torch.float32,
            "bfloat16": torch.bfloat16, "float16": torch.float16}[cfg.model.dtype]


def cpu_bf16_note(cfg, device: str) -> str | None:
    """What to say when a CPU run computes in bf16 on a CPU without bf16 units (only model.dtype
    bfloat16 does: fast picks fp32 there)."""
    flags = _cpu_flags()  # none readable (not Linux): nothing known to say
    if (device != "cpu" or compute_dtype(cfg, device) != torch.bfloat16 or not flags
            or cpu_has_bf16_units(flags)):
        return None
    return ("note: model.dtype is bfloat16 but this CPU has no AVX512-BF16 or AMX: bf16 is emulated here, "
            "many times slower than fp32; use --set model.dtype=fast (bf16 only where the CPU has the units)")


def load_model(cfg, device: str, resume: Path | None = None, frozen: bool = False,
               random_weights: bool = False):
    """AutoModelForCausalLM (+ LoRA via peft); from the checkpoint's model/ when resuming; with
    `random_weights`, built on the device from model.path's config.json alone (a benchmark's model
    of a shipped shape: configs/models/, no download).

    Full fine-tuning keeps fp32 master weights (and so fp32 AdamW state) and computes in
    compute_dtype: a bf16 weight rounds away any update below 2^-8 of itself, which at lr 1e-6 is
    almost every update (test_gpu_path.py::test_bf16_compute_moves_every_weight_at_lr_1e_6). LoRA's
    frozen base stays in compute_dtype, as does a `frozen` model (the KL reference); peft keeps the
    adapter in fp32."""
    m = cfg.model
    dtype = compute_dtype(cfg, device)
    base_path = resume / "model" if (resume and not m.lora) else m.path
    # under torchrun rank 0 alone reads the fp32 weights into host memory, once a run (not once a rank:
    # 8 x 32.8 GB for Qwen3-8B); the others build the model where it will live and take rank 0's
    # (tests/test_gpu_path.py::test_rank_0_alone_reads_the_weights)
    from_rank0 = distributed.world_size() > 1 and not (m.lora or frozen)
    packed = packed_attention(device) if cfg.train.pack_rows else None
    attn = {"attn_implementation": packed} if packed else {}
    if random_weights:
        from transformers import AutoConfig
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(base_path), **attn,
                                                     dtype=dtype if m.lora or frozen else torch.float32)
    elif from_rank0 and dist.get_rank() != 0:
        from transformers import AutoConfig
        # its random init is overwritten: no draw counts
        with torch.random.fork_rng(devices=[]), torch.device(device):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(base_path),
                                                     dtype=torch.float32, **attn)
    else:
        model = AutoModelForCausalLM.from_pretrained(
            base_path, dtype=dtype if m.lora or frozen else torch.float32, **attn)
    if m.lora:
        from peft import LoraConfig, PeftModel, get_peft_model  # optional: LoRA runs only
        if resume:
            model = PeftModel.from_pretrained(model, resume / "model", is_trainable=True)
        else:
            model = get_peft_model(model, LoraConfig(
                r=m.lora_rank, lora_alpha=m.lora_alpha, lora_dropout=m.lora_dropout,
                target_modules=m.lora_target_modules, task_type="CAUSAL_LM"))
    if m.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if m.lora:
            model.enable_input_require_grads()  # else checkpointed blocks see no input needing grad
    model.config.use_cache = False
    model = model.to(device)
    if from_rank0:
        distributed.broadcast_from_rank0(model)
    if dtype != torch.float32 and not (distributed.world_size() > 1 and cfg.train.parallel == "fsdp"):
        # FSDP2 casts in its MixedPrecisionPolicy instead (distributed.wrap_parallel)
        model.forward = torch.autocast(device_type=device.split(":")[0], dtype=dtype)(model.forward)
    return model


def release_cached_memory(device: str):
    """Hand the GPU blocks torch's caching allocator holds but no tensor uses (a step's
    activations) back to the driver before the engine wakes: vLLM allocates its weights and KV
    cache through its own pool (CuMemAllocator), which cannot use them. On CPU glibc keeps the
    freed activations in its heaps for reuse: malloc_trim hands them back, so the engine's KV pages
    and the episodes' buffers do not land on top of them (docs/results.md "Where SmolLM2's memory goes")."""
    if device == "cuda":
        torch.cuda.empty_cache()
    elif device == "cpu":
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # not glibc
            pass


def save_model(model, tokenizer, out: Path, state_dict: dict | None = None):
    """HF format as is: the full model, or the peft adapter (adapter_config.json + weights)."""
    sd = state_dict if state_dict is not None else distributed.full_state_dict(model)
    distributed.unwrap(model).save_pretrained(out, state_dict=sd, safe_serialization=True)
    tokenizer.save_pretrained(out)


# -----------------------------------------------------------------------------------------------
# micro-batches by token budget


def pack_by_tokens(lengths: list[int], budget: int) -> list[list[int]]:
    """Group row indices so each group's padded size (rows x longest) fits `budget`; longest first.

    Sorting by length before cutting keeps rows of similar length together, which is what keeps
    padding low; a row longer than the budget gets a micro-batch of its own.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups, cur = [], []
    for i in order:
        if cur and (len(cur) + 1) * lengths[cur[0]] > budget:
            groups.append(cur)
            cur = []
        cur.append(i)
    if cur:
        groups.append(cur)
    return groups


def padding_fraction(lengths: list[int], groups: list[list[int]]) -> float:
    """Share of the tokens fed to the model that are padding (rows in no group are not fed)."""
    padded = sum(len(g) * max(lengths[i] for i in g) for g in groups)
    return 1.0 - sum(lengths[i] for g in groups for i in g) / padded if padded else 0.0


def _take(v, rows, T: int):
    """One field of a Batch (or an extra tensor): its rows `rows` (an index tensor or a slice), cut
    to the first T positions where it has a time axis; anything else as it is."""
    if isinstance(v, list):
        return [v[i] for i in rows.tolist()] if torch.is_tensor(rows) else v[rows]
    if not torch.is_tensor(v):
        return v
    v = v[rows.to(v.device) if torch.is_tensor(rows) else rows]
    return v[:, :T] if v.dim() == 2 else v


def select_rows(batch, rows: list[int], extra: dict | None = None):
    """Sub-batch of `rows`, trimmed to its longest row (right padding); also slices `extra` [B,T] tensors."""
    idx = torch.as_tensor(rows, dtype=torch.long)
    T = max(int(batch.attention_mask[idx].sum(1).max()), 1)
    fields = {f.name: _take(getattr(batch, f.name), idx, T) for f in dataclasses.fields(batch)}
    return dataclasses.replace(batch, **fields), {k: _take(v, idx, T) for k, v in (extra or {}).items()}


def device_micro_batches(batch, groups: list[list[int]], lengths: list[int], dev, extra: dict | None = None):
    """(sub-batch, extra) of each group on `dev`, as select_rows gives them: every group's rows go to
    the device in one copy, in group order, and each micro-batch is a slice of it, cut to its
    longest row by the host's `lengths`; so the loop over them never waits for the device (a copy
    from pageable host memory waits for the stream)."""
    whole, ex = select_rows(batch, [r for g in groups for r in g], extra)
    whole, ex = whole.to(dev), {k: v.to(dev) for k, v in ex.items()}
    start = 0
    for g in groups:
        part, T = slice(start, start + len(g)), max(max(lengths[r] for r in g), 1)
        start += len(g)
        fields = {f.name: _take(getattr(whole, f.name), part, T) for f in dataclasses.fields(whole)}
        yield dataclasses.replace(whole, **fields), {k: _take(v, part, T) for k, v in ex.items()}


def head_block(dev, setting: int) -> int:
    """Logits per output-head block on `dev` (memory_plan.head_block_logits; train.head_block_logits),
    from the memory free now on a GPU: read once a step, before its micro-batches."""
    free = torch.cuda.mem_get_info(dev)[0] if dev.type == "cuda" else None
    return memory_plan.head_block_logits(setting, dev.type, free)


def micro_batches(model, lengths: list[int], rows, budget: int) -> tuple[list[list[int]], int]:
    """`rows` packed into token-budget micro-batches, then repeats of the first appended so every
    FSDP rank runs as many forwards (one zero-loss forward when no row is left). Returns (groups,
    the number of real ones)."""
    rows = list(rows)
    groups = [[rows[j] for j in g] for g in pack_by_tokens([lengths[r] for r in rows], budget)]
    n_real = len(groups)
    groups = groups or [[0]]
    return groups + [groups[0]] * (distributed.forward_count(model, len(groups), "max") - len(groups)), n_real


def _pad_to(x, T: int):
    return torch.nn.functional.pad(x, (0, T - x.shape[1]))


# -----------------------------------------------------------------------------------------------
# optimizer and schedule


def make_optimizer(model, lr: float, weight_decay: float, betas, warmup: int, total: int, schedule: str):
    """AdamW over trainable params + linear warmup then constant or cosine decay (to 10%). On CUDA,
    with every trainable weight an fp32 tensor of its own (not an FSDP2 shard), the fused kernel:
    the same update in one launch, its step count kept on the device (torch/optim/adam.py,
    _fused_adamw_); elsewhere the foreach implementation, as before."""
    params = [p for p in model.parameters() if p.requires_grad]
    fused = bool(params) and all(p.device.type == "cuda" and p.dtype == torch.float32
                                 and not hasattr(p, "placements") for p in params)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=tuple(betas),
                            fused=fused, foreach=not fused)

    def factor(s):
        if s < warmup:
            return (s + 1) / (warmup + 1)
        if schedule == "cosine":
            frac = min(1.0, (s - warmup) / max(1, total - warmup))
            return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))
        return 1.0
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


# -----------------------------------------------------------------------------------------------
# log-probs


def model_logprobs(model, input_ids, attention_mask=None, lengths=None, forward_kw=None, positions=None,
                   **kw):
    """(lp, entropy) [B,T] of input_ids under `model`: the last hidden states go through the output
    head in blocks (logprobs.linear_token_logprobs, kw = its temperature/top_k/top_p/entropy/
    block arguments; blocks sized for the device, head_block, when kw has none), so the [B,T,V]
    logits are never held; only at `positions` (bool [B,T]) when given (0 at the others). The head
    is swapped for the duration of the call, inside the model's forward, so DDP, FSDP2 and
    autocast see an ordinary forward. With the rows' `lengths` (host ints) the rows are packed
    into one sequence (packed_logprobs)."""
    if lengths is not None:
        return packed_logprobs(model, input_ids, lengths, positions=positions, **kw)
    kw.setdefault("block_logits", head_block(input_ids.device, 0))
    head = distributed.unwrap(model).get_output_embeddings()
    out = {}
    fwd = dict(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **(forward_kw or {}))
    if type(head) is not torch.nn.Linear or head.bias is not None:  # e.g. a LoRA-wrapped head: its own logits
        lp, ent = logprobs.token_logprobs(model(**fwd).logits, input_ids, **kw)
        if positions is None:
            return lp, ent
        return lp.where(positions, 0.0), (None if ent is None else ent.where(positions, 0.0))

    def forward(hidden):
        lp, out["entropy"] = logprobs.linear_token_logprobs(hidden, head.weight, input_ids,
                                                            positions=positions, **kw)
        return lp
    head.forward = forward
    try:
        lp = model(**fwd).logits
    finally:
        del head.forward  # the class's own forward again
    return lp, out["entropy"]


def trained_positions(batch):
    """bool [B,T]: the tokens a loss reads, the policy's sampled ones and the expert-prefilled ones
    (algo.Batch's loss_mask and imitation_mask); the log-probs of the others are never computed."""
    return (batch.loss_mask > 0) | (batch.imitation_mask > 0)


def packed_attention(device: str) -> str | None:
    """The attention a packed forward asks transformers for. On CUDA: flash-attention's varlen kernel
    where flash_attn is installed, else torch's flex attention, whose block mask (transformers builds
    it from the rows it finds in the position ids: masking_utils.find_packed_sequence_indices) skips
    the blocks between rows; SDPA would attend the whole packed sequence under a dense L x L mask. On
    CPU: None, the model's default (SDPA under that mask): flex attention has no backward on CPU, and
    a CPU micro-batch is short (tests/test_packing.py checks each path's log-probs against padding;
    scripts/gpu_check.py's packed item the GPU's gradients)."""
    if not device.startswith("cuda"):
        return None
    try:
        import flash_attn  # noqa: F401 -- only whether it is there
    except ImportError:
        return "flex_attention"
    return "flash_attention_2"


def packed_logprobs(model, input_ids, lengths: list[int], positions=None, **kw):
    """model_logprobs of the rows of input_ids [B,T] (right-padded; row b's tokens are its first
    lengths[b]) forwarded as one sequence of sum(lengths) tokens, its position ids restarting at
    each row, so attention runs over no padding: under flash-attention with the rows' cumulative
    lengths made on the device from host ints (no look at the ids), else under a block-diagonal
    mask. Position t's logits are row b's own for t > 0; the packed sequence's first token of each
    row would read the previous row's last logits, and lp there is 0 by definition, as unpacked
    (tests/test_packing.py checks it against the padded path)."""
    dev, (B, T) = input_ids.device, input_ids.shape
    flat = torch.cat([input_ids[b, :n] for b, n in enumerate(lengths)])[None]
    pos = torch.cat([torch.arange(n, device=dev) for n in lengths])[None]
    fkw = {"position_ids": pos}
    if getattr(distributed.unwrap(model).config, "_attn_implementation", None) == "flash_attention_2":
        sizes = torch.cat([torch.full((1,), n, dtype=torch.int32, device=dev) for n in [0] + list(lengths)])
        cu = sizes.cumsum(0, dtype=torch.int32)
        fkw.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(lengths), max_length_k=max(lengths))
    at = None if positions is None else torch.cat([positions[b, :n] for b, n in enumerate(lengths)])[None]
    lp, ent = model_logprobs(model, flat, None, forward_kw=fkw, positions=at, **kw)

    def unpack(x):
        rows = torch.nn.utils.rnn.pad_sequence(list(x[0].split(list(lengths))), batch_first=True)
        rows = torch.nn.functional.pad(rows, (0, T - rows.shape[1]))
        return torch.cat([rows.new_zeros(B, 1), rows[:, 1:]], dim=1)
    return unpack(lp), (unpack(ent) if ent is not None else None)


def policy_logprobs(model, batch, budget: int, temperature: float = 1.0, top_k: int = -1, top_p: float = 1.0,
                    rows=None, block_logits: int = 0, pack: bool = False):
    """log π_θ(token) [B,T] under the current weights, no grad, in token-budget micro-batches, of
    `rows` (default all; the others are 0) at their trained positions (0 elsewhere); read back
    once, after the last micro-batch. `pack`: each micro-batch's rows as one sequence
    (packed_logprobs)."""
    dev = next(model.parameters()).device
    T = batch.input_ids.shape[1]
    rows = range(len(batch)) if rows is None else rows
    lengths = batch.attention_mask.sum(1).tolist()
    groups, n_real = micro_batches(model, lengths, rows, budget)
    out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
    block, lps = head_block(dev, block_logits), []
    model.eval()
    with torch.no_grad():
        for i, (mb, _) in enumerate(device_micro_batches(batch, groups, lengths, dev)):
            rows_len = [lengths[r] for r in groups[i]] if pack else None
            lp, _ = model_logprobs(model, mb.input_ids, mb.attention_mask, rows_len, temperature=temperature,
                                   top_k=top_k, top_p=top_p, block_logits=block,
                                   positions=trained_positions(mb))
            lps += [lp.float()] if i < n_real else []
        for g, lp in zip(groups, lps):
            out[g] = _pad_to(lp.cpu(), T)
    if hasattr(model, "reshard"):  # FSDP2 leaves the root's parameters gathered after a forward without
        model.reshard()            # backward; the optimizer and the state-dict APIs expect the shards
    model.train()
    return out.to(batch.input_ids.device)


def sequence_logprobs(model, batch, n: int) -> tuple[list, list, list]:
    """(token ids, log π_θ [L], loss_mask [L]) of the first n valid rows with sampled tokens, each
    forwarded alone and unpadded, as an engine scores a prompt (train.sync_gap compares the two)."""
    rows = [i for i in range(len(batch)) if batch.valid[i] and batch.loss_mask[i].sum() > 0][:n]
    rows = rows[:distributed.forward_count(model, len(rows), "min")]
    dev = next(model.parameters()).device
    seqs, lps, masks = [], [], []
    if not rows:
        return seqs, lps, masks
    model.eval()
    with torch.no_grad():
        for i in rows:
            L = int(batch.attention_mask[i].sum())
            ids = batch.input_ids[i:i + 1, :L].to(dev)
            lp, _ = model_logprobs(distributed.unwrap(model), ids)
            seqs.append(ids[0].tolist())
            lps.append(lp[0].cpu())
            masks.append(batch.loss_mask[i, :L])
    if hasattr(model, "reshard"):  # as in policy_logprobs
        model.reshard()
    model.train()
    return seqs, lps, masks


def load_reference(cfg, device: str):
    """The frozen reference policy of algo's KL term (algo.kl_coef) under full fine-tuning:
    model.path's weights, as loaded before any SFT or RL. None under LoRA, where the reference is
    the same model with its adapter disabled (fill_ref_logprobs), at no memory cost."""
    if cfg.model.lora:
        return None
    ref = load_model(dataclasses.replace(
        cfg, model=dataclasses.replace(cfg.model, gradient_checkpointing=False)), device, frozen=True)
    return ref.eval().requires_grad_(False)


def fill_ref_logprobs(model, ref_model, batch, budget: int, temperature: float = 1.0, top_k: int = -1,
                      top_p: float = 1.0, rows=None, block_logits: int = 0, pack: bool = False):
    """batch.ref_logprobs = log π_ref(token) of `rows` (default all; the others are 0): from
    `ref_model` (load_reference), or under LoRA from `model` with its adapter disabled. π_ref is
    the reference weights' distribution over the sampler's support, as π_θ is (temperature, top_k,
    top_p), so the KL of a policy that has not moved is 0 (tests/test_train.py::
    test_pi_old_from_the_first_update_equals_a_separate_pass_bit_for_bit)."""
    if ref_model is not None:
        batch.ref_logprobs = policy_logprobs(ref_model, batch, budget, temperature, top_k, top_p, rows,
                                             block_logits, pack)
        return
    with distributed.unwrap(model).disable_adapter():
        batch.ref_logprobs = policy_logprobs(model, batch, budget, temperature, top_k, top_p, rows,
                                             block_logits, pack)


def dropout_active(model) -> bool:
    """Whether a training-mode forward of `model` differs from an eval-mode one: a dropout module
    (LoRA's lora_dropout among them) or a dropout rate in the model's config above 0. Without one,
    the first update's own forward is π_old bit for bit (rl_step)."""
    m = distributed.unwrap(model)
    dropouts = (torch.nn.Dropout, torch.nn.Dropout1d, torch.nn.Dropout2d, torch.nn.Dropout3d,
                torch.nn.AlphaDropout, torch.nn.FeatureAlphaDropout)
    if any(isinstance(x, dropouts) and x.p > 0 for x in m.modules()):
        return True
    conf = getattr(m, "config", None)
    return any(("dropout" in k or "pdrop" in k) and isinstance(v, float) and v > 0
               for k, v in (conf.to_dict() if conf is not None else {}).items())


# -----------------------------------------------------------------------------------------------
# one optimizer step


def optimizer_step(model, opt, sched, batch, rows, micro_loss, denominator, budget: int, grad_clip: float,
                   extra: dict | None = None, full_mask=None, temperature: float = 1.0, top_k: int = -1,
                   top_p: float = 1.0, with_entropy: bool = False, entropy_grad: bool = False,
                   logprobs_out=None, block_logits: int = 0,
                   pack: bool = False) -> tuple[dict, dict, torch.Tensor]:
    """One AdamW step on `rows` of `batch`: forward/backward each micro-batch, rescale, clip, step.

    micro_loss(lp, ent, mb, ex, rows) -> (summed loss, trained-token mask [b,t], metrics | None) for a
    micro-batch `mb` of global `rows`, its lp and ent computed at trained_positions(mb) alone (0 at
    the others), with `extra` [B,T] or [B] tensors sliced to it in `ex`.
    denominator(mask [B,T]) -> float: the whole batch's. Its mask is `full_mask` (the trained-token
    mask of rows that count without being forwarded; zeros when None) with each forwarded
    micro-batch's mask written into its rows. `logprobs_out` [B,T], when given, receives each
    forwarded row's log π_θ, taken before the step. `pack`: each micro-batch's rows forwarded as one
    sequence (packed_logprobs), no padding. Losses, masks and metrics stay on the device
    until the last micro-batch has run (tests/test_learner_step.py pins the numbers). Returns
    (row-weighted means of the micro-batch metrics, this step's loss / grad_norm / lr / token
    counts, the whole batch's trained-token mask)."""
    dev = next(model.parameters()).device
    T = batch.input_ids.shape[1]
    lengths = batch.attention_mask.sum(1).tolist()
    groups, n_real = micro_batches(model, lengths, rows, budget)
    block = head_block(dev, block_logits)
    sums, n_rows, loss_sum, kept = {}, 0, torch.zeros((), dtype=torch.float64, device=dev), []
    opt.zero_grad(set_to_none=True)
    model.train()
    for i, (mb, ex) in enumerate(device_micro_batches(batch, groups, lengths, dev, extra)):
        g = groups[i]
        pad = i >= n_real  # one of those extra micro-batches: it keeps the collectives in step, adds nothing
        last = i == len(groups) - 1
        sync_ctx = model.no_sync() if hasattr(model, "no_sync") and not last else contextlib.nullcontext()
        with sync_ctx:
            rows_len = [lengths[r] for r in g] if pack else None
            lp, ent = model_logprobs(model, mb.input_ids, mb.attention_mask, rows_len,
                                     temperature=temperature, top_k=top_k, top_p=top_p,
                                     with_entropy=with_entropy, entropy_grad=entropy_grad, block_logits=block,
                                     positions=trained_positions(mb))
            loss, m, mm = micro_loss(lp, ent, mb, ex, g)
            (loss * 0 if pad else loss).backward()
        if pad:
            continue
        for k, v in (mm or {}).items():
            if k not in ("loss", "pg_loss", "imitation_loss", "kl_loss", "entropy_loss", "tokens_trained"):
                sums[k] = sums.get(k, 0.0) + len(g) * v.double()
        n_rows += len(g) if mm is not None else 0
        loss_sum = loss_sum + loss.detach().double()
        kept.append((g, m.detach(), lp.detach() if logprobs_out is not None else None))
    # the step's one read of the device: masks, log-probs and metrics after every micro-batch ran
    full_mask = torch.zeros(batch.input_ids.shape) if full_mask is None else full_mask.clone()
    for g, m, lp in kept:
        full_mask[g] = _pad_to(m.cpu().to(full_mask.dtype), T)
        if lp is not None:
            logprobs_out[g] = _pad_to(lp.float().cpu(), T).to(logprobs_out.device)
    means = algo.as_floats({k: v / max(n_rows, 1) for k, v in sums.items()})
    den, loss_sum = denominator(full_mask), float(loss_sum)
    world = distributed.world_size()
    if world > 1:  # DDP averaged the gradients over ranks; the loss is a global sum / global denominator
        t = torch.tensor([den, loss_sum], device=dev)
        dist.all_reduce(t)
        den, loss_sum = float(t[0]), float(t[1])
    scale = world / den
    params = [p for p in model.parameters() if p.grad is not None]
    for p in params:
        p.grad.mul_(scale)
    grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else float("inf"))
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    return means, dict(loss=loss_sum / den, grad_norm=float(grad_norm), lr=sched.get_last_lr()[0],
                       tokens=int(sum(lengths)), trained_tokens=int(full_mask.sum()),
                       padding_frac=padding_fraction(lengths, groups[:n_real]), micro_batches=n_real,
                       rows_trained=len(list(rows))), full_mask


def rl_step(model, opt, sched, batch, adv, acfg, tcfg, temperature: float = 1.0, top_k: int = -1,
            top_p: float = 1.0, ref_model=None, keep_old: bool = False) -> dict:
    """One RL optimizer step on `batch` with advantages `adv` (algo.compute_advantages); the rows
    that train, the loss and its denominator come from algo.py. π_θ is the distribution the engine
    samples from: temperature, top_k, top_p (logprobs.token_logprobs). `tcfg` is config.TrainConfig
    (micro_batch_tokens, grad_clip, log_entropy).

    π_old is the current weights unless batch.old_logprobs is filled. With `keep_old`, the first
    update on a batch fills it for the ones after it (PPO epochs) from its own forwards: they run
    before its optimizer step, so they are π_old bit for bit, unless dropout makes a training forward
    differ from π_θ (then a no-grad pass measures it first). Rows that cannot move the weights are
    never forwarded (algo.rows_that_train), rows whose mask alone needs π_old once without grad; the
    per-micro-batch metrics (entropy, ratios, clip fractions) cover the rows that trained. Under
    algo.kl_coef, batch.ref_logprobs is filled for the rows that train (fill_ref_logprobs, with
    `ref_model`) unless it is already."""
    budget = tcfg.micro_batch_tokens
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, block_logits=tcfg.head_block_logits,
                    pack=tcfg.pack_rows)
    keep, metrics = algo.keep_rows(batch, adv, acfg)
    rows, probe, known = algo.rows_that_train(batch, adv, keep, acfg)
    if batch.old_logprobs is None and keep_old and dropout_active(model):
        # a training forward with dropout is not π_θ: π_old by a no-grad pass of the kept rows first
        batch.old_logprobs = _logprobs_of(model, batch, budget, sorted(rows + probe), sampling)
        rows, probe, known = algo.rows_that_train(batch, adv, keep, acfg)
    old = None  # π_old as this update's forwards measure it, for the updates after it
    if batch.old_logprobs is None:
        old = _logprobs_of(model, batch, budget, probe, sampling)
        if probe:  # rows that count in the denominator but cannot train: their masks, from their π_old
            rl, il, _, _ = algo.train_masks(batch, adv, acfg, old, keep)
            known = torch.zeros_like(rl)
            known[probe] = (rl + il)[probe]
    if acfg.kl_coef and batch.ref_logprobs is None:
        fill_ref_logprobs(model, ref_model, batch, budget, rows=rows, **sampling)

    batch.validate()  # once: the micro-batches' policy_loss runs on the device, unchecked

    def micro_loss(lp, ent, mb, ex, mb_rows):
        imitation = ex["imitation"] if bool(batch.imitation_mask[mb_rows].any()) else False  # host tensors
        loss, mm, mask = algo.policy_loss(lp, mb, ex["adv"], acfg, ent, keep=ex["keep"], denominator=1.0,
                                          on_device=True, imitation=imitation)
        return loss, mask, mm

    means, step, trained = optimizer_step(
        model, opt, sched, batch, rows, micro_loss,
        lambda mask: algo.aggregation_denominator(mask, acfg.agg, acfg.norm_length), budget, tcfg.grad_clip,
        extra={"adv": adv, "keep": keep, "imitation": algo.imitation_weights(batch, adv, acfg, adv.dtype)},
        full_mask=known, with_entropy=tcfg.log_entropy,
        entropy_grad=bool(acfg.entropy_coef), logprobs_out=old if keep_old else None, **sampling)
    if keep_old and old is not None:
        batch.old_logprobs = old
    metrics.update(means)
    if known is not None:  # rows were not forwarded with grad: the masks of the whole batch
        metrics.update(algo.advantage_stats(adv, trained * (batch.loss_mask > 0)))
    metrics.update(step)
    return metrics


def _logprobs_of(model, batch, budget: int, rows: list, sampling: dict):
    """policy_logprobs of `rows`; μ (batch.infer_logprobs) stands in on the others, which are not
    forwarded here. No forward at all when no rank has a row (FSDP2: every rank decides alike)."""
    out = batch.infer_logprobs.float().clone()
    if distributed.forward_count(model, len(rows), "max"):
        out[rows] = policy_logprobs(model, batch, budget, rows=rows, **sampling)[rows]
    return out


def sft_step(model, opt, sched, batch, tcfg) -> dict:
    """One SFT optimizer step: mean NLL over the sampled (loss_mask) tokens of valid rows."""
    def micro_loss(lp, ent, mb, ex, mb_rows):
        m = mb.loss_mask.float() * mb.valid[:, None]
        return -(lp * m).sum(), m, None

    means, step, _ = optimizer_step(model, opt, sched, batch, range(len(batch)), micro_loss,
                                    lambda mask: max(float(mask.sum()), 1.0), tcfg.micro_batch_tokens,
                                    tcfg.grad_clip, block_logits=tcfg.head_block_logits, pack=tcfg.pack_rows)
    return {**means, **step}
