"""What a run's GPUs and hosts must hold, worked out before launch from its config and the model's
config.json alone (no weights, no GPU): the arithmetic `train.py --dry-run` prints, and the
refusal, naming the key to change, of a run that cannot fit.

    python train.py --config configs/qwen3-full-8gpu.yaml --dry-run --nproc-per-node 8

A colocated run passes through three phases on every GPU, and each must fit the card:
  rollout   the engine awake (its gpu_memory_utilization share of the card) beside the trainer's
            resident state (weights and optimizer)
  train     the trainer's peak (+ gradients, gathered compute copies, activations at the token
            budget) beside the engine: awake in async mode or without engine.sleep, else asleep
  sync      (full fine-tuning) the engine's weights woken, one parameter at a time gathered,
            cast and streamed into them, beside the trainer's resident state
Bytes are counted per tensor from the shapes; activations are an estimate (activation_bytes).
"""
import json
from dataclasses import dataclass
from pathlib import Path

GiB = 2 ** 30
ROOT = Path(__file__).resolve().parent
# the CUDA context, NCCL's buffers and the allocator's fragmentation: not in any tensor count
ALLOWANCE = 3 * GiB
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# the output head's blocks (learner.model_logprobs through logprobs.linear_token_logprobs)
CPU_BLOCK_LOGITS = 2 ** 26       # a laptop's block: 256 MiB of fp32 logits
MAX_BLOCK_LOGITS = 2 ** 27       # ~900 positions of a 152k vocabulary: long kernels; more only costs memory
MIN_BLOCK_LOGITS = 2 ** 16
HEAD_BYTES_PER_LOGIT = 24        # a block alive at once (logprobs._HeadLogprobs): its bf16 logits,
#                                  their fp32 copy, turned in place into the gradient, the support's
#                                  bool mask and top-p's sort, exp(z − lse) and the masked copy the
#                                  entropy's gradient takes, the bf16 gradient (activation_items)
FREE_SHARE = 16                  # a block takes at most 1/16 of the memory free at the step's start


def head_block_logits(setting: int, device_type: str, free_bytes: int | None = None) -> int:
    """Logits per output-head block (train.head_block_logits): `setting` when > 0; else on a GPU the
    largest power of two whose block (HEAD_BYTES_PER_LOGIT bytes a logit) fits 1/FREE_SHARE of
    `free_bytes`, within [MIN_BLOCK_LOGITS, MAX_BLOCK_LOGITS] (few, long kernels: each block's head
    matmul is redone in backward); CPU_BLOCK_LOGITS elsewhere (tests/test_logprobs.py::
    test_head_blocks_are_sized_from_the_device_and_change_no_logprob)."""
    if setting > 0:
        return setting
    if device_type != "cuda" or free_bytes is None:
        return CPU_BLOCK_LOGITS
    fit = free_bytes // (FREE_SHARE * HEAD_BYTES_PER_LOGIT)
    return max(MIN_BLOCK_LOGITS, min(MAX_BLOCK_LOGITS, 1 << (max(fit, 1).bit_length() - 1)))


@dataclass
class Shape:
    """The sizes of a decoder-only transformer (Llama / Qwen3 layout) that memory depends on."""
    vocab: int
    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool
    qk_norm: bool        # Qwen3: an RMSNorm over each head's queries and keys
    attention_bias: bool

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim


def model_shape(c: dict) -> Shape:
    """Shape of a Hugging Face config.json (its dict)."""
    try:
        heads = c["num_attention_heads"]
        return Shape(vocab=c["vocab_size"], hidden=c["hidden_size"], layers=c["num_hidden_layers"],
                     intermediate=c["intermediate_size"], heads=heads,
                     kv_heads=c.get("num_key_value_heads", heads),
                     head_dim=c.get("head_dim") or c["hidden_size"] // heads,
                     tied=bool(c.get("tie_word_embeddings", False)), qk_norm=c.get("model_type") == "qwen3",
                     attention_bias=bool(c.get("attention_bias", False)))
    except KeyError as e:
        raise SystemExit(f"the model's config.json has no {e.args[0]}: the memory plan needs a decoder-only "
                         f"(Llama / Qwen3 layout) config") from None


def load_shape(model_path: str) -> tuple[Shape, Path]:
    """The Shape of model.path, from its config.json, else from the copy shipped in
    configs/models/<name>/ for a hub id (so the plan needs no download)."""
    places = [Path(model_path).expanduser() / "config.json",
              ROOT / "configs" / "models" / Path(model_path).name / "config.json"]
    if model_path.count("/") == 1:  # a hub id already in the Hugging Face cache
        from huggingface_hub import try_to_load_from_cache
        cached = try_to_load_from_cache(model_path, "config.json")
        places += [Path(cached)] if isinstance(cached, str) else []
    for p in places:
        if p.is_file():
            return model_shape(json.loads(p.read_text())), p
    raise SystemExit(f"memory plan: no config.json for model.path {model_path!r} (looked in {model_path} and "
                     f"configs/models/{Path(model_path).name}/); put the model's config.json in one of them")


def layer_params(s: Shape) -> int:
    attn = s.hidden * (s.q_dim + 2 * s.kv_dim) + s.q_dim * s.hidden
    attn += (s.q_dim + 2 * s.kv_dim) if s.attention_bias else 0
    attn += 2 * s.head_dim if s.qk_norm else 0
    return attn + 3 * s.hidden * s.intermediate + 2 * s.hidden  # SwiGLU's gate, up, down; two RMSNorms


def param_count(s: Shape) -> int:
    """Every weight of the model: embeddings, the layers, the final norm, the head unless tied
    (tests/test_memory_plan.py checks it against transformers' own model for the shipped configs)."""
    return s.vocab * s.hidden * (1 if s.tied else 2) + s.layers * layer_params(s) + s.hidden


def lora_params(s: Shape, rank: int, targets: list[str]) -> int:
    """Adapter weights: rank x (in + out) for every targeted linear layer of every block."""
    dims = {"q_proj": (s.hidden, s.q_dim), "k_proj": (s.hidden, s.kv_dim), "v_proj": (s.hidden, s.kv_dim),
            "o_proj": (s.q_dim, s.hidden), "gate_proj": (s.hidden, s.intermediate),
            "up_proj": (s.hidden, s.intermediate), "down_proj": (s.intermediate, s.hidden)}
    return s.layers * sum(rank * sum(dims[t]) for t in targets if t in dims)


def activation_items(s: Shape, tokens: int, c: int, checkpointing: bool, residual: int | None = None,
                     lora_targets: list[str] | None = None, head_logits: int = CPU_BLOCK_LOGITS,
                     mask_bytes: int = 0) -> list[tuple[str, int]]:
    """What one forward and backward of `tokens` tokens holds beyond the weights, compute dtype of
    `c` bytes, as (what, bytes); an upper bound, each term at its peak.

    A decoder layer keeps, per token, c x (6H + 4I + 2 q_dim + 2 kv_dim): both norms' inputs and
    their fp32 copies (4H), the attention's input (H), q, k, v and its output (2 q_dim + 2 kv_dim,
    flash attention: no T x T scores), the MLP's input (H), gate, up and their product (4I)
    (counted as Korthikanti et al. 2022, arXiv 2205.05198 §4.1, for a SwiGLU, grouped-query
    layer). The residual stream is `residual` bytes a value: fp32 under full fine-tuning with fp32
    master weights (the embedding's output is fp32 and autocast adds bf16 outputs into it), so
    the norms' inputs and checkpointing's saved layer inputs are fp32 there. Gradient
    checkpointing keeps each layer's input (H) and recomputes one layer at a time. The layer in
    backward also holds its MLP's gradients (3I: gate, up and their product). LoRA (peft) casts
    each targeted linear's input to the adapter's fp32 and autocast casts it back for the matmul:
    a compute-dtype copy of every targeted input is kept for backward (Σ in_dim), and the fp32
    copy of the widest lives while its linear runs. The output head runs in blocks of head_logits
    logits (head_block_logits), HEAD_BYTES_PER_LOGIT bytes each at once, and, when it trains (not
    LoRA), its weight's gradient summed over the blocks in the weight's dtype (`residual` bytes:
    fp32 master weights, or FSDP2's compute copy) until autograd adds it to the weight's;
    `mask_bytes` is the attention mask's (padded rows: attention_mask_bytes)."""
    r = c if residual is None else residual
    per_layer = c * (2 * s.hidden + 4 * s.intermediate + 2 * s.q_dim + 2 * s.kv_dim) + r * 4 * s.hidden
    ins = {"q_proj": s.hidden, "k_proj": s.hidden, "v_proj": s.hidden, "o_proj": s.q_dim,
           "gate_proj": s.hidden, "up_proj": s.hidden, "down_proj": s.intermediate}
    lora = [ins[t] for t in (lora_targets or []) if t in ins]
    items = [("layers' saved inputs (checkpointed)" if checkpointing else "every layer's activations",
              (s.layers * r * s.hidden if checkpointing else s.layers * per_layer) * tokens)]
    if checkpointing:
        items.append(("the layer recomputed for its backward", per_layer * tokens))
    items.append(("its MLP's gradients in backward", 3 * c * s.intermediate * tokens))
    if lora:
        layers = 1 if checkpointing else s.layers
        items.append(("LoRA's compute-dtype copies of its inputs, + the widest in fp32",
                      (layers * c * sum(lora) + 4 * max(lora)) * tokens))
    items.append(("the final hidden states and their gradient", tokens * s.hidden * (c + 4)))
    items.append((f"the output head's block of {head_logits:,} logits", head_logits * HEAD_BYTES_PER_LOGIT))
    if lora_targets is None:
        items.append(("the output head's weight gradient, summed over its blocks", s.vocab * s.hidden * r))
    if mask_bytes:
        items.append(("the attention mask", mask_bytes))
    return items


def activation_bytes(s: Shape, tokens: int, c: int, checkpointing: bool, **kw) -> int:
    """The sum of activation_items."""
    return sum(b for _, b in activation_items(s, tokens, c, checkpointing, **kw))


def attention_mask_bytes(budget: int, packed: bool) -> int:
    """The attention mask SDPA gets for a GPU micro-batch of `budget` tokens (a bool [B,1,T,T] from
    transformers and SDPA's own additive copy in the compute dtype): none for a row alone; at most
    two rows of half the budget when padded (B·T² with B·T ≤ budget); none worth counting when
    packed, which on a GPU runs flash-attention's varlen kernel (no mask) or flex attention, whose
    block mask holds a few ints per 128 x 128 block (learner.packed_attention)."""
    return 0 if packed else 3 * budget ** 2 // 2


def engine_bytes(s: Shape, card: int, utilisation: float, c: int, max_model_len: int) -> dict:
    """vLLM's share of the card (gpu_memory_utilization x the card's memory): its weights, the
    profiled forward at its default batch (16384 tokens and 1024 sequences on a card of 70 GiB or
    more, else 8192 and 256: vllm/engine/arg_utils.py, LLM class), and the KV cache in what is left."""
    total = int(utilisation * card)
    weights = param_count(s) * c
    batch_tokens, seqs = (16384, 1024) if card >= 70 * GiB else (8192, 256)
    # the MLP's peak; fp32 logits and probs
    act = batch_tokens * (s.hidden + 3 * s.intermediate) * c + seqs * s.vocab * 4 * 2
    kv = total - weights - act
    per_token = 2 * s.layers * s.kv_dim * c  # K and V of every layer
    return {"total": total, "weights": weights, "activations": act, "kv": kv,
            "kv_tokens": max(0, kv) // per_token, "sequences": max(0, kv) / per_token / max_model_len}


@dataclass
class Plan:
    phases: dict          # phase name -> [(what, bytes)] per GPU
    host: list            # [(what, bytes)] per host
    card: int
    host_ram: int | None
    problems: list[str]
    head: str

    def text(self) -> str:
        lines = [self.head]
        for name, items in self.phases.items():
            total = sum(b for _, b in items)
            lines.append(f"  per GPU, {name}: {total / GiB:.1f} GiB of {self.card / GiB:.0f}")
            lines += [f"    {what:<72s} {b / GiB:7.1f}" for what, b in items]
        peak = max(self.host, key=lambda x: x[1]) if self.host else ("nothing", 0)
        lines.append(f"  per host, at most: {peak[1] / GiB:.1f} GiB"
                     + (f" of {self.host_ram / GiB:.0f}" if self.host_ram
                        else " (the host's RAM is not checked: --host-gb)"))
        lines += [f"    {what:<72s} {b / GiB:7.1f}" for what, b in self.host]
        return "\n".join(lines)


def trainer_items(shape: Shape, m, c: int, world: int, fsdp: bool, kl: bool) -> tuple[list, list, list]:
    """The trainer's tensors on each GPU, [(what, bytes)] each: resident (weights, AdamW moments, the
    KL reference), gradients, and the compute copies of the weights the forward holds (FSDP2's
    gathered layers, autocast's casts). m: cfg.model; c: the compute dtype's bytes; fsdp: the
    weights are sharded over the `world` ranks."""
    N = param_count(shape)
    share = world if fsdp else 1
    tag = f"1/{world}" if fsdp else "whole"
    if m.lora:
        A = lora_params(shape, m.lora_rank, m.lora_target_modules)
        resident = [(f"base weights ({c}-byte compute dtype, frozen)", N * c),
                    (f"LoRA adapter, fp32 ({A / 1e6:.0f} M weights)", 4 * A),
                    ("AdamW moments of the adapter", 8 * A)]
        grads, copies = [("adapter gradients, fp32", 4 * A)], []
    else:
        resident = [(f"trainer weights, fp32 master ({tag})", 4 * N // share),
                    (f"AdamW moments, 2 x fp32 ({tag})", 8 * N // share)]
        grads = [(f"gradients, fp32 ({tag})", 4 * N // share)]
        if fsdp:  # FSDP2 gathers a layer (and prefetches the next), and the root's embeddings and head
            root = shape.vocab * shape.hidden * (1 if shape.tied else 2)
            copies = [("gathered compute copies: 2 layers + embeddings and head",
                       (2 * layer_params(shape) + root) * c)]
        elif c != 4:  # autocast keeps its casts of every weight for backward
            copies = [("autocast's compute-dtype copy of the weights", N * c)]
        else:
            copies = []
    if kl:
        resident.append(("KL reference model (compute dtype, not sharded)", N * c))
    return resident, grads, copies


def plan(cfg, world: int, per_node: int, card: int, host_ram: int | None, max_context: int, kl: bool) -> Plan:
    """The per-GPU phases and the per-host peaks of `cfg` (config.Config) on `world` ranks,
    `per_node` a host, cards of `card` bytes; `problems` says what does not fit and which key to
    change. max_context: rollout.max_context; kl: algo.kl_coef is set (a frozen reference copy)."""
    m, t, e = cfg.model, cfg.train, cfg.engine
    shape, source = load_shape(m.path)
    c = DTYPE_BYTES["bfloat16" if m.dtype == "auto" else m.dtype]
    N = param_count(shape)
    fsdp = world > 1 and t.parallel == "fsdp" and not m.lora
    # a row longer than the token budget gets a micro-batch of its own (learner.pack_by_tokens)
    tokens = max(t.micro_batch_tokens, max_context)
    eng = engine_bytes(shape, card, e.gpu_memory_utilization, c, e.max_model_len)
    engine_item = (f"engine, {e.gpu_memory_utilization} of the card: KV {eng['kv_tokens']:,} tokens "
                   f"({eng['sequences']:.1f} x max_model_len)", eng["total"])
    resident, grads, copies = trainer_items(shape, m, c, world, fsdp, kl)
    allowance = [("CUDA context, NCCL buffers, fragmentation (allowance)", ALLOWANCE)]
    engine_awake_in_train = t.mode == "async" or not e.sleep
    before = resident + grads + copies + allowance + ([engine_item] if engine_awake_in_train else [])
    head = head_block_logits(t.head_block_logits, "cuda", max(0, card - sum(b for _, b in before)))
    # autocast over fp32 master weights keeps the residual stream in fp32; FSDP2 and LoRA compute in c
    residual = 4 if not (m.lora or fsdp) else c
    acts = [(f"activations at {tokens:,} tokens a forward: {what}", b) for what, b in activation_items(
        shape, tokens, c, m.gradient_checkpointing, residual, m.lora_target_modules if m.lora else None, head,
        attention_mask_bytes(t.micro_batch_tokens, t.pack_rows))]
    phases = {
        "rollout (engine awake)": resident + [engine_item] + allowance,
        "train" + (" (engine awake: " + ("train.mode async)" if t.mode == "async" else "engine.sleep false)")
                   if engine_awake_in_train else " (engine asleep)"):
            resident + grads + copies + acts + ([engine_item] if engine_awake_in_train else []) + allowance,
    }
    if not m.lora:
        biggest = max(shape.vocab * shape.hidden, shape.hidden * shape.intermediate)
        woken = [engine_item] if engine_awake_in_train else [("engine weights, woken", eng["weights"])]
        phases["sync (weights streamed one tensor at a time)"] = resident + woken + [
            ("the largest parameter gathered in fp32 and cast", biggest * (4 + c))] + allowance

    # per host: what the processes of one node hold in host memory at their peaks
    if m.lora or world == 1:
        host = [(f"model load: {'the compute dtype' if m.lora else 'fp32'} on the CPU, "
                 f"once per rank ({per_node} a host)", per_node * (c if m.lora else 4) * N)]
    else:  # learner.load_model: rank 0 reads, the other ranks take its weights
        host = [("model load: fp32 on the CPU of rank 0 alone", 4 * N)]
    if not m.lora:
        host.append(("checkpoint: weights and AdamW state gathered on rank 0", 12 * N))
        host.append((f"resume: the gathered AdamW state, loaded by each rank ({per_node}), "
                     f"+ the model on rank 0", per_node * 8 * N + 4 * N))
    if m.lora and e.sleep:
        host.append((f"engine weights offloaded while asleep (level 1), {per_node} engines",
                     per_node * N * c))

    problems = {}  # one line per cause, at the first phase it stops
    for phase, items in phases.items():
        total = sum(b for _, b in items)
        if total <= card:
            continue
        need = f"{phase} needs {total / GiB:.1f} GiB a GPU, more than the card's {card / GiB:.0f}"
        state = sum(b for what, b in resident + grads if "AdamW" in what or "fp32" in what)
        act_b = sum(b for _, b in acts)
        if not m.lora and not fsdp and state > card / 2:
            problems.setdefault(
                "state", f"{need}: train.parallel: {t.parallel if world > 1 else '(one process)'} keeps the "
                f"whole fp32 weights, gradients and AdamW state ({state / GiB:.0f} GiB) on every GPU. Set "
                f"train.parallel: fsdp under torchrun (it shards them over the ranks: "
                f"{state / world / GiB:.0f} GiB a GPU at {world}), use more GPUs, or model.lora: true")
        elif act_b > card / 3:
            problems.setdefault(
                "activations", f"{need}: activations at {tokens:,} tokens take {act_b / GiB:.0f} GiB. "
                + ("Lower train.micro_batch_tokens and rollout.max_context" if m.gradient_checkpointing
                   else "Set model.gradient_checkpointing: true or lower train.micro_batch_tokens"))
        elif engine_awake_in_train and phase.startswith("train"):
            problems.setdefault(
                "beside", f"{need}, with the engine awake beside the trainer. Lower "
                f"engine.gpu_memory_utilization (now {e.gpu_memory_utilization}), or set train.mode: sync "
                f"with engine.sleep: true")
        else:
            problems.setdefault("other", f"{need}. Lower engine.gpu_memory_utilization "
                                         f"(now {e.gpu_memory_utilization}) or train.micro_batch_tokens")
    if eng["kv_tokens"] < e.max_model_len:
        problems.setdefault(
            "kv", f"the engine's KV cache holds {eng['kv_tokens']:,} tokens, fewer than engine.max_model_len "
            f"({e.max_model_len:,}): vLLM would refuse to start. Raise engine.gpu_memory_utilization "
            f"(now {e.gpu_memory_utilization}) or lower engine.max_model_len")
    peak = max(b for _, b in host)
    if host_ram is not None and peak > host_ram:
        what = max(host, key=lambda x: x[1])[0]
        problems.setdefault("host", f"per host, {what} needs {peak / GiB:.0f} GiB, "
                                    f"more than the host's {host_ram / GiB:.0f}")
    where = source.relative_to(ROOT) if source.is_relative_to(ROOT) else source
    head = (f"memory plan: {m.path} ({where}): {N / 1e9:.2f} B weights; {world} rank(s), {per_node} a host; "
            f"{'LoRA' if m.lora else 'full fine-tuning'}" + (f", {t.parallel}" if world > 1 else "")
            + f"; compute dtype {c} bytes; cards of {card / GiB:.0f} GiB")
    return Plan(phases, host, card, host_ram, list(problems.values()), head)


def gpu_memory_plan(cfg, world: int, per_node: int, gpu_gb: float | None, host_gb: float | None,
                    max_context: int, kl: bool) -> Plan:
    """plan() for this machine: cards of `gpu_gb` GiB, else the visible GPU's, else 80; hosts of
    `host_gb` GiB, else this machine's RAM when it has a GPU (it is then the run's host), else
    unchecked."""
    import os
    import torch
    gpu = torch.cuda.is_available()
    card = gpu_gb * GiB if gpu_gb else (torch.cuda.get_device_properties(0).total_memory if gpu else 80 * GiB)
    host = host_gb * GiB if host_gb else (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
                                          if gpu else None)
    return plan(cfg, world, per_node, int(card), host and int(host), max_context, kl)
