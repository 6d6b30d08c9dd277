"""Agentic RL in terminal environments: the whole training loop in one file.

    python train.py --config configs/tiny.yaml                      # the CPU demo (builds a tiny model)
    python train.py --config configs/tiny.yaml --set train.steps=4 --set train.lr=3e-4
    python train.py --config configs/tiny.yaml --dry-run            # check config, tasks, model, docker
    python train.py --config configs/tiny.yaml --resume             # continue from <out_dir>/checkpoints/latest
    torchrun --nproc-per-node 8 train.py --config configs/qwen3-full-8gpu.yaml   # one box, many GPUs

One RL step, as in ROLL's agentic pipeline (arXiv 2512.24873, §3):
    rollout (engine awake) -> advantages -> engine sleeps -> update in token-budget micro-batches
    -> sync weights into the engine -> sync check -> eval now and then -> checkpoint -> log
Every config key, with its default, is in config.py; what a run writes (checkpoints, logs) is in rundir.py.
With `train.mode: async`, episodes keep running in a background thread while the trainer steps;
a trajectory started more than `train.max_staleness` policy versions ago is dropped.

Multi-GPU: `torchrun --nproc-per-node N train.py ...` gives every rank its own colocated engine and
1/N of the tasks of each step; gradients are averaged with DDP (`train.parallel: ddp`) or the
parameters sharded with FSDP2 (`train.parallel: fsdp`). Beyond one box use a distributed RL
trainer built for it (alibaba/ROLL, volcengine/verl) -- this file deliberately stops at one node.
"""
import argparse
import contextlib
import dataclasses
import math
import os
import random
import shutil
import threading
import time
from pathlib import Path

import yaml

import distributed
from config import Config, ConfigError, algo_cfg, config_to_dict, load_config, rollout_cfg
from rundir import RunLog, latest_checkpoint, plot_curves, rng_state, save_checkpoint, set_rng_state, summary

# vLLM runs in this process (weights are shared with the trainer through update_weights).
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# -----------------------------------------------------------------------------------------------
# data order: a pure function of (seed, step), so a resumed run sees exactly the tasks an unbroken one would


def step_tasks(tasks: list, step: int, n: int, seed: int) -> list:
    """Tasks for RL step `step`: the next n of a stream of per-epoch seeded permutations of `tasks`."""
    out = []
    for i in range(step * n, (step + 1) * n):
        epoch, j = divmod(i, len(tasks))
        perm = random.Random(f"{seed}-{epoch}").sample(range(len(tasks)), len(tasks))
        out.append(tasks[perm[j]])
    return out


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


def select_rows(batch, rows: list[int], extra: dict | None = None):
    """Sub-batch of `rows`, trimmed to its longest row (right padding); also slices `extra` [B,T] tensors."""
    import torch
    idx = torch.as_tensor(rows, dtype=torch.long)
    T = max(int(batch.attention_mask[idx].sum(1).max()), 1)
    fields = {}
    for f in dataclasses.fields(batch):
        v = getattr(batch, f.name)
        if torch.is_tensor(v):
            v = v[idx.to(v.device)]
            v = v[:, :T] if v.dim() == 2 else v
        elif isinstance(v, list):
            v = [v[i] for i in rows]
        fields[f.name] = v
    sliced = {k: v[idx.to(v.device)][:, :T] for k, v in (extra or {}).items()}
    return dataclasses.replace(batch, **fields), sliced


# -----------------------------------------------------------------------------------------------
# optimizer and schedule


def make_optimizer(model, lr: float, weight_decay: float, betas, warmup: int, total: int, schedule: str):
    """AdamW over trainable params + linear warmup then constant or cosine decay (to 10%)."""
    import torch
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=tuple(betas),
                            fused=False, foreach=True)

    def factor(s):
        if s < warmup:
            return (s + 1) / (warmup + 1)
        if schedule == "cosine":
            frac = min(1.0, (s - warmup) / max(1, total - warmup))
            return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))
        return 1.0
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


# -----------------------------------------------------------------------------------------------
# model


def pick_device(cfg: Config) -> str:
    import torch
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("device: cuda, but torch sees no GPU (torch.cuda.is_available() is False). "
                         "Check nvidia-smi and that torch is a CUDA build, or run with --set device=cpu.")
    if cfg.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return cfg.device


def check_model_path(cfg: Config):
    if cfg.model.build_tiny:
        return
    p = Path(cfg.model.path)
    hub_id = not p.exists() and cfg.model.path.count("/") == 1 and not cfg.model.path.startswith((".", "/"))
    if not hub_id and not (p / "config.json").exists():
        raise SystemExit(f"model.path {cfg.model.path!r} is not a model directory (no config.json). Point "
                         f"model.path at a Hugging Face model directory or a hub id (org/name), or set "
                         f"model.build_tiny: true to build the tiny CPU model there.")


def compute_dtype(cfg: Config, device: str):
    """The dtype the trainer computes in (model.dtype; auto = bf16 on GPU, fp32 on CPU)."""
    import torch
    return {"auto": torch.bfloat16 if device == "cuda" else torch.float32, "float32": torch.float32,
            "bfloat16": torch.bfloat16, "float16": torch.float16}[cfg.model.dtype]


def load_model(cfg: Config, device: str, resume: Path | None = None, frozen: bool = False):
    """AutoModelForCausalLM (+ LoRA via peft); from the checkpoint's model/ when resuming.

    Full fine-tuning keeps fp32 master weights (and so fp32 AdamW state) and computes in
    compute_dtype: a bf16 weight rounds away any update below 2^-8 of itself, which at lr 1e-6 is
    almost every update (test_gpu_path.py::test_bf16_compute_moves_every_weight_at_lr_1e_6). LoRA's
    frozen base stays in compute_dtype, as does a `frozen` model (the KL reference); peft keeps the
    adapter in fp32."""
    import torch
    from transformers import AutoModelForCausalLM
    m = cfg.model
    dtype = compute_dtype(cfg, device)
    base_path = resume / "model" if (resume and not m.lora) else m.path
    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=dtype if m.lora or frozen else torch.float32)
    if m.lora:
        from peft import LoraConfig, PeftModel, get_peft_model
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
    if dtype != torch.float32 and not (distributed.world_size() > 1 and cfg.train.parallel == "fsdp"):
        # FSDP2 casts in its MixedPrecisionPolicy instead (distributed.wrap_parallel)
        model.forward = torch.autocast(device_type=device.split(":")[0], dtype=dtype)(model.forward)
    return model


def save_model(model, tokenizer, out: Path, state_dict: dict | None = None):
    """HF format as is: the full model, or the peft adapter (adapter_config.json + weights)."""
    sd = state_dict if state_dict is not None else distributed.full_state_dict(model)
    distributed.unwrap(model).save_pretrained(out, state_dict=sd, safe_serialization=True)
    tokenizer.save_pretrained(out)


@contextlib.contextmanager
def torch_threads(n: int):
    """CPU thread count for a block run before the vLLM CPU engine starts (it pins threads after)."""
    import torch
    old = torch.get_num_threads()
    if n > 0:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


# -----------------------------------------------------------------------------------------------
# one optimizer step on a batch, in token-budget micro-batches


def micro_batches(model, lengths: list[int], rows, budget: int) -> tuple[list[list[int]], int]:
    """`rows` packed into token-budget micro-batches, then repeats of the first appended so every
    FSDP rank runs as many forwards (one zero-loss forward when no row is left). Returns (groups,
    the number of real ones)."""
    rows = list(rows)
    groups = [[rows[j] for j in g] for g in pack_by_tokens([lengths[r] for r in rows], budget)]
    n_real = len(groups)
    groups = groups or [[0]]
    return groups + [groups[0]] * (distributed.forward_count(model, len(groups), "max") - len(groups)), n_real


def policy_logprobs(model, batch, budget: int, temperature: float = 1.0):
    """log π_θ(token) [B,T] under the current weights, no grad, in token-budget micro-batches."""
    import torch
    import algo
    dev = next(model.parameters()).device
    T = batch.input_ids.shape[1]
    groups, n_real = micro_batches(model, batch.attention_mask.sum(1).tolist(), range(len(batch)), budget)
    out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        for i, rows in enumerate(groups):
            mb = select_rows(batch, rows)[0].to(dev)
            lp, _ = algo.token_logprobs(model(input_ids=mb.input_ids, attention_mask=mb.attention_mask,
                                              use_cache=False).logits, mb.input_ids, temperature=temperature)
            if i < n_real:
                out[rows] = _pad_to(lp.float().cpu(), T)
    if hasattr(model, "reshard"):  # as in check_sync: FSDP2 leaves the root gathered after a forward
        model.reshard()
    model.train()
    return out.to(batch.input_ids.device)


def fill_old_logprobs(model, batch, cfg: Config, temperature: float = 1.0):
    """batch.old_logprobs = log π_θ(token) under the current weights, before the first of several
    updates on the batch (the ratios of the later ones are measured against it)."""
    batch.old_logprobs = policy_logprobs(model, batch, cfg.train.micro_batch_tokens, temperature)


def load_reference(cfg: Config, device: str):
    """The frozen reference policy of algo's KL term (algo.kl_coef) under full fine-tuning:
    model.path's weights, as loaded before any SFT or RL. None under LoRA, where the reference is
    the same model with its adapter disabled (fill_ref_logprobs), at no memory cost."""
    if cfg.model.lora:
        return None
    ref = load_model(dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, gradient_checkpointing=False)),
                     device, frozen=True)
    return ref.eval().requires_grad_(False)


def fill_ref_logprobs(model, ref_model, batch, cfg: Config, temperature: float = 1.0):
    """batch.ref_logprobs = log π_ref(token): from `ref_model` (load_reference), or under LoRA from
    `model` with its adapter disabled."""
    if ref_model is not None:
        batch.ref_logprobs = policy_logprobs(ref_model, batch, cfg.train.micro_batch_tokens, temperature)
        return
    with distributed.unwrap(model).disable_adapter():
        batch.ref_logprobs = policy_logprobs(model, batch, cfg.train.micro_batch_tokens, temperature)


def _pad_to(x, T: int):
    import torch
    return torch.nn.functional.pad(x, (0, T - x.shape[1]))


def rows_that_train(batch, advantages, keep, acfg) -> tuple[list[int], object]:
    """Rows whose loss can move the weights, and the whole batch's trained-token mask when rows are
    left out (the loss denominator counts their tokens all the same), else None.

    Rows not in `keep` have empty masks. Without a KL or entropy term, a row whose trained tokens
    all have advantage 0 (a failed episode under REINFORCE, a zero-variance group under GRPO) has
    zero gradient under every loss in algo.py, so it is not forwarded. Its tokens' mismatch mask
    needs π_old, so such rows are left out only once π_old is known (fill_old_logprobs) or when
    algo.mismatch does not use it."""
    import algo
    rows = [i for i in range(len(batch)) if keep[i]]
    if acfg.kl_coef or acfg.entropy_coef or (batch.old_logprobs is None
                                            and acfg.mismatch in ("token_mask", "chunk_mask")):
        return rows, None
    old = batch.old_logprobs if batch.old_logprobs is not None else batch.infer_logprobs  # unused by the masks then
    rl, il, _, _ = algo.train_masks(batch, advantages, acfg, old, keep)
    moves = algo.rows_with_signal(advantages, rl, il)
    return [i for i in rows if moves[i]], rl + il


def update(model, opt, sched, batch, acfg, cfg: Config, temperature: float = 1.0, sft: bool = False) -> dict:
    """One optimizer step on `batch` (RL: algo.policy_loss; SFT: NLL on loss_mask tokens).

    Micro-batch losses are backpropagated with denominator 1 and the summed gradient divided by
    the full batch's denominator afterwards: the gradient is linear in 1/denominator, so this is
    exactly the full-batch loss without holding every micro-batch's graph. π_old is the current
    weights unless batch.old_logprobs is filled (fill_old_logprobs, when updates_per_step > 1).
    Rows that cannot move the weights are not forwarded (rows_that_train); the per-micro-batch
    metrics (entropy, ratios, clip fractions) then cover the rows that trained.
    """
    import torch
    import torch.distributed as dist
    import algo
    dev = next(model.parameters()).device
    T = batch.input_ids.shape[1]
    lengths = batch.attention_mask.sum(1).tolist()
    adv = keep = known = None
    rows_in = list(range(len(lengths)))
    metrics: dict = {}
    if not sft:
        adv = algo.compute_advantages(batch, acfg)
        keep, metrics = algo.keep_rows(batch, adv, acfg)
        rows_in, known = rows_that_train(batch, adv, keep, acfg)
    groups, n_real = micro_batches(model, lengths, rows_in, cfg.train.micro_batch_tokens)
    world = distributed.world_size()
    masks, mb_metrics, loss_sum = [], [], 0.0
    opt.zero_grad(set_to_none=True)
    model.train()
    for i, rows in enumerate(groups):
        mb, ex = select_rows(batch, rows, {"adv": adv} if adv is not None else {})
        mb = mb.to(dev)
        pad = i >= n_real  # one of those extra micro-batches: it keeps the collectives in step, adds nothing
        last = i == len(groups) - 1
        sync_ctx = model.no_sync() if hasattr(model, "no_sync") and not last else contextlib.nullcontext()
        with sync_ctx:
            logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False).logits
            lp, ent = algo.token_logprobs(logits, mb.input_ids, temperature=temperature,
                                          with_entropy=not sft and cfg.train.log_entropy,
                                          entropy_grad=bool(acfg and acfg.entropy_coef))
            del logits
            if sft:
                m = mb.loss_mask.float() * mb.valid[:, None]
                loss = -(lp * m).sum()
            else:
                kmb, amb = keep[rows].to(dev), ex["adv"].to(dev)
                old = mb.old_logprobs if mb.old_logprobs is not None else lp.detach()
                rl, il, _, _ = algo.train_masks(mb, amb, acfg, old, kmb)
                m = rl + il
                loss, mm = algo.policy_loss(lp, mb, amb, acfg, ent, keep=kmb, denominator=1.0)
                if not pad:
                    mb_metrics.append((len(rows), mm))
            (loss * 0 if pad else loss).backward()
        if pad:
            continue
        loss_sum += float(loss.detach())
        masks.append(_pad_to(m.detach().cpu(), T))
    if known is not None:  # rows were skipped: the masks and denominator of the whole batch
        full_mask = known
        metrics_full = algo.advantage_stats(adv, known * (batch.loss_mask > 0))
    else:
        full_mask, metrics_full = (torch.cat(masks) if masks else torch.zeros(1, T)), {}
    if sft:
        den = max(float(full_mask.sum()), 1.0)
    else:
        den = algo.aggregation_denominator(full_mask, acfg.agg, acfg.norm_length)
    if world > 1:  # DDP averaged the gradients over ranks; the loss is a global sum / global denominator
        t = torch.tensor([den, loss_sum], device=dev)
        dist.all_reduce(t)
        den, loss_sum = float(t[0]), float(t[1])
    scale = world / den
    params = [p for p in model.parameters() if p.grad is not None]
    for p in params:
        p.grad.mul_(scale)
    grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.train.grad_clip if cfg.train.grad_clip > 0 else float("inf"))
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    n = sum(r for r, _ in mb_metrics) or 1
    for k in (mb_metrics[0][1] if mb_metrics else {}):
        if k not in ("loss", "pg_loss", "imitation_loss", "kl_loss", "entropy_loss", "tokens_trained"):
            metrics[k] = sum(r * m.get(k, 0.0) for r, m in mb_metrics) / n
    metrics.update(metrics_full)
    metrics.update(loss=loss_sum / den, grad_norm=float(grad_norm), lr=sched.get_last_lr()[0],
                   tokens=int(sum(lengths)), trained_tokens=int(full_mask.sum()),
                   padding_frac=padding_fraction(lengths, groups[:n_real]), micro_batches=n_real,
                   rows_trained=len(rows_in))
    return metrics


# -----------------------------------------------------------------------------------------------
# engine, weight sync, eval


def make_engine(cfg: Config, model_path, device: str):
    import rollout
    if cfg.engine.kind == "hf":
        return rollout.HFEngine(model_path, dtype=compute_dtype(cfg, device), device=device)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cfg.engine.cpu_kvcache_gb))
    dtype = str(compute_dtype(cfg, device)).removeprefix("torch.")  # the trainer's, so the sync gap means something
    return rollout.VLLMEngine(model_path, dtype=dtype, max_model_len=cfg.engine.max_model_len,
                              enable_lora=cfg.model.lora, max_lora_rank=cfg.model.lora_rank,
                              gpu_memory_utilization=cfg.engine.gpu_memory_utilization, seed=cfg.seed,
                              enforce_eager=cfg.engine.enforce_eager,
                              **distributed.engine_launch_kwargs(), **cfg.engine.extra)


def sync_weights(model, policy, cfg: Config, out_dir: Path, version: int):
    """Full: copy every parameter into the engine in place. LoRA: save the adapter, hot-swap it."""
    if cfg.model.lora:
        import torch.distributed as dist
        rank = dist.get_rank() if dist.is_initialized() else 0
        adir = out_dir / "adapters" / f"rank{rank}-v{version:06d}"
        distributed.unwrap(model).save_pretrained(adir)
        policy.load_lora(adir, version)
        for old in sorted((out_dir / "adapters").glob(f"rank{rank}-v*"))[:-2]:  # the engine holds the newest
            shutil.rmtree(old, ignore_errors=True)
    else:
        dtype = policy.engine.dtype  # cast one tensor at a time: the fp32 master weights stay as they are
        params = ((n, (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().to(dtype))
                  for n, p in distributed.unwrap(model).named_parameters())
        policy.update_weights(params, version)


def check_sync(model, policy, batch, n: int = 2) -> dict:
    """Engine vs trainer log-probs on a few sampled sequences after a sync (a silent no-op sync shows here)."""
    import torch
    import algo
    import rollout
    rows = [i for i in range(len(batch)) if batch.valid[i] and batch.loss_mask[i].sum() > 0][:n]
    rows = rows[:distributed.forward_count(model, len(rows), "min")]
    dev = next(model.parameters()).device
    if not rows:
        return {}
    seqs, lps, masks = [], [], []
    model.eval()
    with torch.no_grad():
        for i in rows:
            L = int(batch.attention_mask[i].sum())
            ids = batch.input_ids[i:i + 1, :L].to(dev)
            lp, _ = algo.token_logprobs(distributed.unwrap(model)(input_ids=ids, use_cache=False).logits, ids)
            seqs.append(ids[0].tolist())
            lps.append(lp[0].cpu())
            masks.append(batch.loss_mask[i, :L])
    if hasattr(model, "reshard"):  # FSDP2 leaves the root's parameters gathered after a forward without
        model.reshard()            # backward; the optimizer and the state-dict APIs expect the shards
    model.train()
    return rollout.sync_check(policy, seqs, lps, masks)


def evaluate_success(policy, env, tasks, rcfg, cfg: Config) -> tuple[float, list]:
    """Held-out success: eval.samples episodes per task at eval.temperature; invalid ones do not count."""
    import rollout
    ecfg = dataclasses.replace(rcfg, temperature=cfg.eval.temperature, prefill_prob=0.0,
                               group_redundancy=0, max_staleness=None)
    trajs = rollout.collect(tasks, policy, env, ecfg, group_size=cfg.eval.samples, group_id_start=10 ** 6,
                            progress=False)
    valid = [t for t in trajs if t.valid]
    return sum(t.reward > 0 for t in valid) / max(1, len(valid)), trajs


# -----------------------------------------------------------------------------------------------
# setup helpers: tasks, docker, distributed


def load_task_sets(cfg: Config):
    from tasks import generate_easy_tasks, load_tasks
    d = cfg.data
    kinds = d.generated_kinds or None
    if d.train_tasks == "generated":
        train = generate_easy_tasks(d.num_generated_train, seed=d.generated_seed, split="train", kinds=kinds)
    else:
        train = load_tasks(d.train_tasks)
    if d.eval_tasks == "generated":
        held = generate_easy_tasks(d.num_generated_eval, seed=d.eval_seed, split=d.eval_split, kinds=kinds)
        seen = {t.instruction for t in train}
        held = [t for t in held if t.instruction not in seen]  # never evaluate on a task trained on
    elif d.eval_tasks:
        held = load_tasks(d.eval_tasks)
    else:
        held = []
    if not train:
        raise SystemExit(f"data.train_tasks {d.train_tasks!r} gave no tasks")
    return train, held[: cfg.eval.num_tasks]


def make_env():
    import env
    try:
        return env.Env()
    except Exception as e:  # docker SDK errors differ by cause; the fix is the same
        raise SystemExit(f"Docker is not reachable ({type(e).__name__}: {e}). Start the daemon (dockerd or "
                         f"`systemctl start docker`) and make sure this user may use /var/run/docker.sock.")


def oracle_corpus(tasks, system_prompt: str, tools, n: int = 256) -> list[str]:
    """Rendered oracle conversations of the train tasks (with `tools` in the system turn, as the
    rollout renders them): the tiny tokenizer learns merges for them."""
    import rollout
    import tiny
    from tasks import oracle_commands
    tok = tiny.train_tokenizer(tiny.default_corpus(), 512)  # only for the chat template
    out = []
    for t in tasks[:n]:
        msgs = [{"role": "system", "content": system_prompt}, {"role": "user", "content": t.instruction}]
        for c in oracle_commands(t):
            msgs.append({"role": "assistant", "content": rollout.tool_call_text("bash", {"command": c})})
            msgs.append({"role": "tool", "content": "[exit code: 0]"})
        msgs.append({"role": "assistant", "content": rollout.tool_call_text("submit", {})})
        out.append(tok.apply_chat_template(msgs, tools=tools, tokenize=False))
    return out


# -----------------------------------------------------------------------------------------------
# the run


def sft_validation(model, batch, cfg: Config, temperature: float) -> dict:
    """On oracle trajectories SFT never trained on: val_nll = mean NLL per assistant token, and
    val_oracle_prob = mean over trajectories of Π_t π_θ(a_t) = the chance of sampling it exactly."""
    lp = policy_logprobs(model, batch, cfg.train.micro_batch_tokens, temperature)
    m = batch.loss_mask
    per_row = (lp * m).sum(1)
    world = distributed.world_size()  # ranks score shares of the trajectories: weight by tokens, by rows
    nll = distributed.all_mean([(-per_row.sum() / m.sum()).item()], world, weight=float(m.sum()))[0]
    prob = distributed.all_mean([per_row.double().exp().mean().item()], world, weight=float(len(batch)))[0]
    return {"val_nll": nll, "val_oracle_prob": prob}  # (double: fp32 exp underflows early in SFT)


def sft_warm_start(cfg: Config, model, tok, env, tasks, val_tasks, rcfg, log, rank: int = 0):
    """NLL on the assistant tokens of oracle trajectories, rendered exactly as the agent's own turns."""
    import rollout
    from tqdm import tqdm
    with rollout.ScriptedPolicy(tok, "oracle", template_kwargs=rcfg.chat_template_kwargs,
                                tools=rcfg.tools) as oracle:  # real containers: real tool outputs
        demos = rollout.collect(tasks + val_tasks, oracle, env,
                                dataclasses.replace(rcfg, prefill_prob=0.0, group_redundancy=0),
                                group_size=1, progress=rank == 0)
    demos = [t for t in demos if t.valid and t.reward > 0]
    val_names = {t.name for t in val_tasks}
    val = [t for t in demos if t.task_name in val_names]
    demos = [t for t in demos if t.task_name not in val_names]
    world = distributed.world_size()
    # every rank draws the same batches from all ranks' demos and trains on its share of each,
    # so a step's batch is sft.batch_size trajectories whatever the number of ranks
    demos = [t for part in distributed.gather(demos, world) for t in part]
    if len(demos) < world:  # world >= 1: no demo at all is an error too
        raise SystemExit(f"SFT: {len(demos)} oracle trajectories passed their tests (ranks: {world}); "
                         f"check the tasks with `python env.py validate`")
    if cfg.sft.val_tasks and min(distributed.gather(len(val), world)) < 1:
        raise SystemExit(f"SFT validation: no oracle trajectory of the {cfg.sft.val_tasks} sft.val_tasks passed its tests "
                         f"on some rank; raise sft.val_tasks or check the tasks with `python env.py validate`")
    val_batch = rollout.make_batch(val, tok.pad_token_id) if val else None
    for attempt in range(cfg.sft.restarts + 1):
        if attempt:
            fresh_weights(model, cfg, cfg.seed + 1000 * attempt)
        opt, sched = make_optimizer(model, cfg.sft.lr, cfg.train.weight_decay, cfg.train.adam_betas,
                                    cfg.sft.warmup_steps, cfg.sft.steps, "cosine")
        rng = random.Random(f"sft-{cfg.seed}" + (f"-{attempt}" if attempt else ""))
        bar = tqdm(range(cfg.sft.steps), desc=f"sft (restart {attempt})" if attempt else "sft", disable=rank != 0)
        for s in bar:
            picked = rng.sample(demos, min(cfg.sft.batch_size, len(demos)))[rank::world]
            with torch_threads(cfg.threads):
                m = update(model, opt, sched, rollout.make_batch(picked, tok.pad_token_id), None, cfg, sft=True)
                if val_batch is not None and ((s + 1) % cfg.sft.val_every == 0 or s + 1 == cfg.sft.steps):
                    m.update(sft_validation(model, val_batch, cfg, rcfg.temperature))
            bar.set_postfix(loss=f"{m['loss']:.3f}", **({"val_p": f"{m['val_oracle_prob']:.3f}"} if "val_oracle_prob" in m else {}))
            if rank == 0:
                log.log({"phase": "sft", "step": s, **m, **({"restart": attempt} if attempt else {})})
            # a policy that already samples the oracle this often gives RL signal, and leaves RL room
            if cfg.sft.stop_at_val_prob and m.get("val_oracle_prob", 0.0) >= cfg.sft.stop_at_val_prob:
                if rank == 0:
                    tqdm.write(f"sft: stopped after {s + 1} steps, val_oracle_prob {m['val_oracle_prob']:.3f} "
                               f">= sft.stop_at_val_prob {cfg.sft.stop_at_val_prob}")
                break
        # when a small model starts to copy from its prompt is a draw on its init and data order (README)
        if attempt == cfg.sft.restarts or m["val_oracle_prob"] >= cfg.sft.restart_below:
            break
        tqdm.write(f"sft: val_oracle_prob {m['val_oracle_prob']:.3f} < sft.restart_below {cfg.sft.restart_below} "
                   f"after {s + 1} steps: restart {attempt + 1} of {cfg.sft.restarts} from fresh weights")
    return opt


def fresh_weights(model, cfg: Config, seed: int):
    """An SFT restart's start: a new random init for a model built from scratch, else the pretrained weights again."""
    import torch
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    if cfg.model.build_tiny:
        src = AutoModelForCausalLM.from_config(model.config)
    else:
        src = AutoModelForCausalLM.from_pretrained(cfg.model.path, dtype=model.dtype)
    model.load_state_dict(src.state_dict())


def run(cfg: Config, resume: bool = False) -> dict:
    import numpy as np
    import torch
    from tqdm import tqdm
    from transformers import AutoTokenizer
    import rollout

    t_start = time.time()
    device = pick_device(cfg)
    rank, world = distributed.init_distributed(device)
    if world > 1 and (cfg.train.tasks_per_step < world or (cfg.sft.steps and cfg.sft.batch_size < world)):
        raise SystemExit(f"{world} ranks each train on a share of every batch: train.tasks_per_step "
                         f"({cfg.train.tasks_per_step}) and sft.batch_size ({cfg.sft.batch_size}) must be >= {world}")
    if world > 1 and cfg.sft.steps and cfg.sft.restarts:
        raise SystemExit("sft.restarts runs on one process; set sft.restarts=0 under torchrun")
    out = Path(cfg.out_dir)
    ckpt_root = out / "checkpoints"
    out.mkdir(parents=True, exist_ok=True)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)  # checkpoints carry numpy's state too: a function of the seed, like the others
    torch.manual_seed(cfg.seed)
    rcfg, acfg = rollout_cfg(cfg), algo_cfg(cfg)
    rcfg.seed = cfg.seed
    rcfg.max_staleness = cfg.train.max_staleness if cfg.train.mode == "async" else None
    train_tasks, eval_tasks = load_task_sets(cfg)
    if cfg.model.build_tiny and rank == 0:
        import tiny
        corpus_tasks = train_tasks
        if cfg.data.train_tasks == "generated":
            # the whole family, both splits: every word is then one token wherever it appears (" w",
            # "/w"), as in a real tokenizer; from the train tasks alone " pencil" was " pe n c i l"
            from tasks import generate_easy_tasks
            corpus_tasks = [t for split in ("train", "heldout")
                            for t in generate_easy_tasks(512, seed=cfg.data.generated_seed, split=split)]
        tiny.build_tiny_model(cfg.model.path, corpus=oracle_corpus(corpus_tasks, rcfg.system_prompt, n=len(corpus_tasks), tools=rcfg.tools),
                              **{"seed": cfg.seed, **cfg.model.tiny})
    if world > 1:
        torch.distributed.barrier()
    check_model_path(cfg)
    ckpt = latest_checkpoint(ckpt_root) if resume else None
    state = torch.load(ckpt / "trainer.pt", weights_only=False) if ckpt else {}
    experts = state.get("experts", {})  # task name -> expert commands, refreshed by rollout.collect (refresh_expert)
    if rank == 0:
        (out / "config.yaml").write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
    log = RunLog(out, state.get("step", 0) if ckpt else None, cfg.tensorboard and rank == 0, write=rank == 0)
    tok = AutoTokenizer.from_pretrained(cfg.model.path)
    model = load_model(cfg, device, ckpt)
    ref_model = load_reference(cfg, device) if acfg.kl_coef else None  # a full copy per process (not sharded)
    env = make_env()

    if world > 1:
        model = distributed.wrap_parallel(model, cfg, device, compute_dtype(cfg, device))
    opt = sched = sft_opt = None

    def save(step):
        st = {"step": step, "data_pos": step * cfg.train.tasks_per_step, "sft_done": True, "rng": rng_state(),
              "experts": experts}
        if opt is not None:
            st.update(optimizer=distributed.optimizer_state(model, opt), scheduler=sched.state_dict())
        elif sft_opt is not None and cfg.sft.keep_moments:  # a resume from the SFT-only start carries them too
            st["sft_optimizer"] = distributed.optimizer_state(model, sft_opt)
        if world > 1:
            st["rank_fingerprints"] = distributed.check_in_step(model, world, step)
        full = distributed.full_state_dict(model)  # collective under FSDP: every rank takes part
        if rank == 0:
            save_checkpoint(ckpt_root, step, lambda d: save_model(model, tok, d, full), st, cfg.checkpoint.keep_last)
        if world > 1:
            torch.distributed.barrier()
        return ckpt_root / f"step_{step:06d}"

    # --- optional SFT warm start on oracle trajectories (the paper trains SFT -> RL) -------------
    if cfg.sft.steps and not state.get("sft_done"):
        n, v = cfg.sft.num_tasks, cfg.sft.val_tasks
        val_tasks = train_tasks[n:][-v:] if v else []  # the last train tasks: RL's, never SFT's
        if v and not val_tasks:
            raise SystemExit(f"sft.val_tasks needs train tasks beyond the sft.num_tasks={n} SFT trains on; "
                             f"there are {len(train_tasks)}: add tasks, lower sft.num_tasks or set sft.val_tasks=0")
        sft_opt = sft_warm_start(cfg, model, tok, env, train_tasks[:n][rank::world], val_tasks[rank::world],
                                 rcfg, log, rank)
        ckpt = save(0)  # the SFT-only start: RL's step 0, and the engine's first weights

    # --- RL: optimizer, engine, policy ---------------------------------------------------------
    start = state.get("step", 0)
    opt, sched = make_optimizer(model, cfg.train.lr, cfg.train.weight_decay, cfg.train.adam_betas,
                                cfg.train.warmup_steps, cfg.train.steps, cfg.train.lr_schedule)
    if "optimizer" in state:
        distributed.load_optimizer_state(model, opt, state["optimizer"])
        sched.load_state_dict(state["scheduler"])
    elif cfg.sft.keep_moments and (sft_opt is not None or "sft_optimizer" in state):
        # Adam's bias-corrected first step is lr * sign(g) on every weight, however small or noisy g
        # is: at an lr that moves the tiny policy at all, that collapsed it in one step. SFT's second
        # moments scale RL's first steps by what that weight's gradients have looked like instead.
        if sft_opt is not None:  # same parameter objects (FSDP shards too): hand the state over as is
            opt.state.update(sft_opt.state)
            sft_opt = None
        else:  # resuming at the SFT-only start: the saved state, but RL's own lr
            lrs = [(g["lr"], g["initial_lr"]) for g in opt.param_groups]
            distributed.load_optimizer_state(model, opt, state["sft_optimizer"])
            for g, (lr, initial) in zip(opt.param_groups, lrs):
                g["lr"], g["initial_lr"] = lr, initial
    full_ckpt = ckpt is not None and not cfg.model.lora
    engine = make_engine(cfg, ckpt / "model" if full_ckpt else cfg.model.path, device)
    if "rng" in state:  # after the engine: vLLM seeds python/numpy/torch when it starts, which would
        # overwrite the checkpoint's states (tests/test_train.py::test_sigkill_and_resume_continues_the_unbroken_run_bit_for_bit)
        set_rng_state(state["rng"])
    if cfg.engine.kind == "vllm":
        distributed.check_engine_placement(*engine.placement(), device)
    policy = rollout.Policy(engine, tok, version=start, template_kwargs=rcfg.chat_template_kwargs,
                            tools=rcfg.tools)
    if ckpt is not None and cfg.model.lora:
        policy.load_lora(ckpt / "model", start)

    def evaluate_now(step):
        t0 = time.time()
        succ, trajs = evaluate_success(policy, env, eval_tasks[rank::world], rcfg, cfg)
        succ = distributed.all_mean([succ], world, sum(t.valid for t in trajs))[0]
        rollout.write_jsonl(trajs, out / (f"eval_trajectories.rank{rank}.jsonl" if world > 1 else "eval_trajectories.jsonl"))
        if rank == 0:
            log.log({"phase": "eval", "step": step, "success": succ, "time/eval": time.time() - t0})
        return succ, time.time() - t0

    eval_succ = None
    if eval_tasks and cfg.eval.at_start and not distributed.from_rank0(
            any(r.get("phase") == "eval" and r["step"] == start for r in log.records), world):
        eval_succ, _ = evaluate_now(start)

    # async: a producer thread rolls out step s+1.. while the trainer updates on step s
    produced: "queue.Queue" = None
    stop = threading.Event()

    def rollout_step(s):
        tasks = step_tasks(train_tasks, s, cfg.train.tasks_per_step, cfg.seed)  # logged whole; this rank's share:
        g0, t0 = policy.gen_busy_s, time.time()
        trajs = rollout.collect(tasks[rank::world], policy, env, rcfg, group_size=cfg.train.group_size,
                                group_id_start=s * cfg.train.tasks_per_step, progress=False, experts=experts)
        return s, tasks, trajs, time.time() - t0, policy.gen_busy_s - g0

    if cfg.train.mode == "async":
        import queue
        produced = queue.Queue(maxsize=max(1, cfg.train.max_staleness))

        def producer():
            for s in range(start, cfg.train.steps):
                if stop.is_set():
                    return
                item = rollout_step(s)
                while not stop.is_set():
                    try:
                        produced.put(item, timeout=0.5)
                        break
                    except queue.Full:
                        pass
        threading.Thread(target=producer, name="rollout-producer", daemon=True).start()

    bar = tqdm(range(start, cfg.train.steps), desc="rl", initial=start, total=cfg.train.steps, disable=rank != 0)
    for step in bar:
        # 1. rollout (engine awake)
        if produced is not None:
            s, tasks, trajs, t_roll, t_gen = produced.get()
            assert s == step, f"async producer is at step {s}, trainer at {step}"
            trajs, n_stale = rollout.drop_stale(trajs, policy.version, cfg.train.max_staleness)
        else:
            policy.wake()
            s, tasks, trajs, t_roll, t_gen = rollout_step(step)
            n_stale = 0
        rollout.write_jsonl(trajs, out / (f"trajectories.rank{rank}.jsonl" if world > 1 else "trajectories.jsonl"))
        valid = [t for t in trajs if t.valid]
        reward = sum(t.reward for t in valid) / max(1, len(valid))
        success = sum(t.reward > 0 for t in valid) / max(1, len(valid))
        reward, success = distributed.all_mean([reward, success], world, len(valid))
        # every rank updates or none does (collectives); a rank with no valid trajectory has no batch
        train_now = distributed.all_mean([float(bool(valid))], world)[0] == 1.0
        # 2. advantages + 3. engine sleeps + 4. update in micro-batches
        t0 = time.time()
        if cfg.train.mode == "sync":
            policy.sleep()
        m = {}
        if train_now:
            batch = rollout.make_batch(trajs, tok.pad_token_id)
            if cfg.train.updates_per_step > 1:
                fill_old_logprobs(model, batch, cfg, rcfg.temperature)
            if acfg.kl_coef:
                fill_ref_logprobs(model, ref_model, batch, cfg, rcfg.temperature)
            for _ in range(cfg.train.updates_per_step):
                m = update(model, opt, sched, batch, acfg, cfg, temperature=rcfg.temperature)
        t_train = time.time() - t0
        # 5. sync weights into the engine, 6. check the engine now computes what the trainer does
        t0 = time.time()
        sync_weights(model, policy, cfg, out, step + 1)
        t_sync = time.time() - t0
        # vLLM's CPU LoRA kernels fail on prompt log-probs (punica_cpu einsum), so no score-based check there
        can_check = train_now and not (cfg.model.lora and cfg.engine.kind == "vllm" and device == "cpu")
        gap = check_sync(model, policy, batch) if cfg.train.sync_check and can_check else {}
        # 7. eval now and then, 8. checkpoint, 9. log
        t_eval = 0.0
        done = step + 1
        if eval_tasks and ((cfg.eval.every and done % cfg.eval.every == 0) or done == cfg.train.steps):
            eval_succ, t_eval = evaluate_now(done)
        t0 = time.time()
        if done % cfg.checkpoint.every == 0 or done == cfg.train.steps:
            save(done)
        t_ckpt = time.time() - t0
        ranks = {}
        if world > 1:  # a straggler rank sets everyone's pace
            per = distributed.gather([len(trajs), t_roll, t_train], world)
            ranks = {"episodes": sum(p[0] for p in per), "time/rollout_ranks": [p[1] for p in per],
                     "time/train_ranks": [p[2] for p in per]}
        rec = {"phase": "rl", "step": done, "reward": reward, "success": success, "tasks": [t.name for t in tasks],
               "episodes": len(trajs), "dropped_stale": n_stale, "policy_version": policy.version, **m,
               "sync_gap": gap.get("sync/mean_abs_logprob_gap"), "sync_gap_max": gap.get("sync/max_abs_logprob_gap"),
               "time/rollout": t_roll, "time/generation": t_gen, "time/env": max(0.0, t_roll - t_gen),
               "time/train": t_train, "time/sync": t_sync, "time/eval": t_eval, "time/checkpoint": t_ckpt,
               **{k.replace("rollout/", "rollout_"): v for k, v in rollout.rollout_metrics(trajs).items()}, **ranks}
        if rank == 0:
            log.log(rec)
        bar.set_postfix(reward=f"{reward:.2f}", success=f"{success:.0%}",
                        eval="-" if eval_succ is None else f"{eval_succ:.0%}")
    stop.set()
    policy.close()
    env.close()
    result = {"records": log.records, "wall_s": time.time() - t_start}
    if rank == 0:
        line = plot_curves(log.records, out / "curves.png") if cfg.plot else ""
        text = summary(log.records, result["wall_s"], out) + ("\n" + line if line else "")
        (out / "summary.txt").write_text(text + "\n")
        print(text)
    log.close()
    return result


def dry_run(cfg: Config) -> int:
    """Check config, tasks, model path, GPU and Docker without training; print what would run."""
    import torch
    problems = []
    device = "cuda" if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()) else "cpu"
    if cfg.device == "cuda" and not torch.cuda.is_available():
        problems.append("device: cuda but torch sees no GPU")
    try:
        train, held = load_task_sets(cfg)
        print(f"tasks: {len(train)} train, {len(held)} eval")
    except Exception as e:
        problems.append(f"tasks: {e}")
        train = []
    if cfg.model.build_tiny:
        print(f"model: tiny model will be built at {cfg.model.path}")
    else:
        try:
            check_model_path(cfg)
            print(f"model: {cfg.model.path}")
        except SystemExit as e:
            problems.append(str(e))
    try:
        import docker
        client = docker.from_env()
        client.ping()
        images = {t.image for t in train if t.image}
        for img in images:
            try:
                client.images.get(img)
            except docker.errors.ImageNotFound:
                problems.append(f"docker image {img} missing (build it: docker build -t {img} tasks/base)")
        print(f"docker: reachable, {len(images)} base image(s) checked")
    except Exception as e:
        problems.append(f"docker: not reachable ({type(e).__name__}: {e}); start dockerd")
    print(f"device: {device}; engine: {cfg.engine.kind}; {'LoRA' if cfg.model.lora else 'full'} fine-tuning; "
          f"algo: {algo_cfg(cfg).loss}; mode: {cfg.train.mode}; steps: sft {cfg.sft.steps}, rl {cfg.train.steps} "
          f"x {cfg.train.tasks_per_step} tasks x {cfg.train.group_size}; out: {cfg.out_dir}")
    for p in problems:
        print(f"PROBLEM: {p}")
    print("dry run: OK" if not problems else f"dry run: {len(problems)} problem(s)")
    return 1 if problems else 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="YAML file (see configs/)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config key, e.g. --set train.lr=1e-5 (repeatable)")
    ap.add_argument("--dry-run", action="store_true", help="check config, tasks, model path, docker; do not train")
    ap.add_argument("--resume", action="store_true", help="continue from <out_dir>/checkpoints/latest")
    a = ap.parse_args(argv)
    try:
        cfg = load_config(a.config, a.set)
    except ConfigError as e:
        raise SystemExit(f"config error: {e}")
    if a.dry_run:
        raise SystemExit(dry_run(cfg))
    run(cfg, resume=a.resume)


if __name__ == "__main__":
    main()
