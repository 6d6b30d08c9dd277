"""Agentic RL in terminal environments: the training loop, top to bottom.

    python train.py --config configs/tiny.yaml                      # the CPU demo (builds a tiny model)
    python train.py --config configs/tiny.yaml --set train.steps=4 --set train.lr=3e-4
    python train.py --config configs/tiny.yaml --dry-run            # check config, tasks, model, docker
    python train.py --config configs/tiny.yaml --resume             # continue from its newest checkpoint
    torchrun --nproc-per-node 8 train.py --config configs/qwen3-full-8gpu.yaml   # one box, many GPUs
    torchrun --nnodes 2 --node-rank K --nproc-per-node 8 --master-addr NODE0 --master-port 29500 train.py ...

One RL step, as in ROLL's agentic pipeline (arXiv 2512.24873, §3), is `run`'s loop: rollout (engine
awake) -> advantages -> engine sleeps -> update in token-budget micro-batches -> sync weights into
the engine -> sync check -> eval now and then -> log -> checkpoint. The optimizer step is
learner.py's, SFT sft.py's, the math algo.py's, episodes rollout.py's, config keys config.py's,
the run directory rundir.py's. `train.mode: async` rolls out in a background thread while the
trainer steps: step s's rollouts start once the weights are at most `train.max_staleness` versions
behind s, and a weight update restarts the turns in flight, so each turn has one version.

`torchrun --nproc-per-node N train.py ...` gives every rank its own colocated engine and 1/N of
each step's tasks, with DDP (`train.parallel: ddp`) or FSDP2 (`fsdp`); on several nodes
(`--nnodes`) the same, with out_dir on a filesystem every node shares (distributed.check_shared_dirs).
Where that stops scaling, and what to move to, is in the README ("Training on several nodes").
"""
import argparse
import dataclasses
import errno
import functools
import os
import queue
import random
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml
from tqdm import tqdm
from transformers import AutoTokenizer

import algo
import logprobs
import difficulty
from difficulty import step_tasks  # the data order (tests call it as train.step_tasks)
import distributed
from engines import engine_topk_rule, make_engine
import env
from env import make_env
import hosts
import learner
import memory_plan
from policy import Policy, sync_check
import rollout
import sft
import tiny
from config import Config, ConfigError, algo_cfg, config_to_dict, load_config, rollout_cfg
import rundir
from rundir import RunLog, plot_curves, rng_state, save_checkpoint, set_rng_state, summary
from generated_tasks import load_task_sets, split_tasks
from task_folders import TaskError
from evaluate import task_mean_ci

# episode threads share the tokenizer; its pool would warn at every fork
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# -----------------------------------------------------------------------------------------------
# a step's tasks: difficulty.py's draw, so a resumed run sees exactly the tasks an unbroken one would


def rank_share(items: list, rank: int, world: int) -> tuple[list, int]:
    """(this rank's share of `items`: every world-th from `rank`, how many the lower ranks hold). Its
    group ids start at that count, so no two ranks' groups share an id, nor the sampling seeds that
    rollout.collect draws from a stream keyed by it
    (tests/test_train.py::test_torchrun_two_ranks_move_in_step_and_resume_exactly)."""
    return items[rank::world], sum(len(items[q::world]) for q in range(rank))


# -----------------------------------------------------------------------------------------------
# engine, weight sync, sync check, Docker


def check_topk_rule(cfg: Config, rcfg, device: str):
    """Stop unless the trainer's π_θ has the support the engine samples μ from: with top-k under
    bf16, where tied logits are common, another rule would bias every π/μ at the edge."""
    if rcfg.top_k <= 0 and rcfg.top_p >= 1.0:
        return
    engine, trainer = engine_topk_rule(cfg.engine.kind), logprobs.topk_rule(device)
    if engine != trainer:
        raise SystemExit(f"the engine ({cfg.engine.kind} on {device}) keeps its top-k/top-p support by the "
                         f"{engine!r} rule and the trainer by {trainer!r} (logprobs.topk_rule): their "
                         f"log-probs would differ at every tie. Use engine.kind vllm on the trainer's "
                         f"device, or rollout.top_k: -1 and rollout.top_p: 1.0")


def sync_weights(model, policy, cfg: Config, out_dir: Path, version: int):
    """Full: copy every parameter into the engine in place. LoRA: save the adapter, hot-swap it."""
    if cfg.model.lora:
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
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


def sync_gap(model, policy, batch, cfg: Config, n: int = 2) -> dict:
    """Engine vs trainer log-probs on a few sampled sequences after a sync (a silent no-op sync
    shows here); {} when train.sync_check is off or no sequence has sampled tokens."""
    if not cfg.train.sync_check:
        return {}
    seqs, lps, masks = learner.sequence_logprobs(model, batch, n)
    return sync_check(policy, seqs, lps, masks) if seqs else {}


# -----------------------------------------------------------------------------------------------
# set-up, in the order that keeps a run's random streams (and so its results) reproducible


@dataclass
class Run:
    """What the loop works with, built once by `setup`."""
    cfg: Config
    device: str
    rank: int
    world: int
    out: Path
    rcfg: rollout.RolloutConfig
    acfg: algo.AlgoConfig
    sft_tasks: list        # SFT's oracle trajectories come from these (sft.generated_split) ...
    rl_tasks: list         # ... and RL's steps draw these (train.generated_split, train.generated_kinds)
    eval_tasks: list
    ckpt: Path | None      # the checkpoint the engine starts from: a resume's, or the SFT-only start
    state: dict            # a resume's trainer.pt ({} for a fresh run)
    experts: dict          # task name -> expert commands, refreshed by rollout.collect (refresh_expert)
    log: RunLog
    tok: object
    model: object
    ref_model: object      # π_ref of algo's KL term under full fine-tuning (learner.load_reference)
    env: env.Env
    lock: rundir.RunLock | None  # rank 0's: no second process writes the run directory
    # which tasks sit out (train.filter_window); its state is in every checkpoint
    filter: difficulty.DifficultyFilter


def setup(cfg: Config, resume: bool, restart: bool) -> Run:
    """Device and ranks, seeds, tasks, the tiny model when asked, the checkpoint to resume, the log,
    tokenizer, model and Docker."""
    device = learner.pick_device(cfg)
    rank, world = distributed.init_distributed(device, cfg.train.collective_timeout_min)
    if world > 1 and (cfg.train.tasks_per_step < world or (cfg.sft.steps and cfg.sft.batch_size < world)):
        raise SystemExit(f"{world} ranks each train on a share of every batch: train.tasks_per_step "
                         f"({cfg.train.tasks_per_step}) and sft.batch_size ({cfg.sft.batch_size}) must be "
                         f">= {world}")
    out = Path(cfg.out_dir)
    # rank 0 alone looks and moves an old run aside, once for every node; another rank looking
    # meanwhile could see the directory vanish under it. Every rank then says rank 0's refusal.
    refusal = lock = None
    if rank == 0:
        try:
            lock = rundir.claim_run_dir(out, resume, restart)  # held until the process ends
        except SystemExit as e:
            refusal = e.code
    refusal = distributed.from_rank0(refusal, world)  # after it, no one writes before the claim
    if refusal is not None:
        raise SystemExit(refusal)
    out.mkdir(parents=True, exist_ok=True)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)  # checkpoints carry numpy's state too: a function of the seed, like the others
    torch.manual_seed(cfg.seed)
    rcfg, acfg = rollout_cfg(cfg), algo_cfg(cfg)
    train_tasks, eval_tasks = load_task_sets(cfg)
    # a config that cannot fit stops here, with the key to change, not in an OOM an hour in
    if device == "cuda":
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        try:
            problems = memory_plan.gpu_memory_plan(cfg, world, per_node, None, None, rcfg.max_context,
                                                   bool(acfg.kl_coef)).problems
        except SystemExit as e:  # no config.json to plan from: the run goes on unplanned, and says so
            print(e, file=sys.stderr)
            problems = []
        if problems:
            raise SystemExit("memory plan: " + "; ".join(problems)
                             + " (python train.py --dry-run prints the plan)")
    if cfg.model.build_tiny and rank == 0:
        generated = cfg.data.generated_seed if cfg.data.train_tasks == "generated" else None
        tiny.build_for_tasks(cfg.model.path, train_tasks, rcfg.system_prompt, rcfg.tools, generated,
                             cfg.data.generated_family, **{"seed": cfg.seed, **cfg.model.tiny})
    if world > 1:
        torch.distributed.barrier()
    distributed.check_shared_dirs([out] + ([Path(cfg.model.path)] if cfg.model.build_tiny else []), world)
    learner.check_model_path(cfg)
    ckpt, state = resume_point(out, resume, rank, world)
    if rank == 0:
        (out / "config.yaml").write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
    log = RunLog(out, ckpt is not None, cfg.tensorboard and rank == 0, write=rank == 0)
    tok = AutoTokenizer.from_pretrained(cfg.model.path)
    shards = ckpt / distributed.SHARDS if "sharded" in state else None  # a torchrun checkpoint's weights
    if rank == 0 and (note := learner.cpu_bf16_note(cfg, device)):
        print(note, file=sys.stderr)
    model = learner.load_model(cfg, device, None if shards else ckpt)
    # a full copy per process (not sharded)
    ref_model = learner.load_reference(cfg, device) if acfg.kl_coef else None
    terminals = make_env(cfg)
    if world > 1:
        model = distributed.wrap_parallel(model, cfg, device, learner.compute_dtype(cfg, device))
    if shards:  # each rank reads its own part of the weights (the optimizer's: rl_optimizer)
        distributed.load_shards(shards, model, {})
    lag = cfg.train.max_staleness if cfg.train.mode == "async" else 0  # the producer draws that far ahead
    filt = difficulty.DifficultyFilter(cfg.train.filter_window, cfg.train.filter_sit_out, lag,
                                      cfg.train.draw_by_kind)
    filt.load(state.get("difficulty", {}))
    splits = {s: split_tasks(cfg, s, train_tasks)  # each split drawn once, when SFT and RL share it
              for s in {cfg.sft.generated_split, cfg.train.generated_split}}
    rl_tasks = [t for t in splits[cfg.train.generated_split]  # RL's alone: SFT and held-out keep them all
                if not cfg.train.generated_kinds or t.metadata["kind"] in cfg.train.generated_kinds]
    return Run(cfg, device, rank, world, out, rcfg, acfg, splits[cfg.sft.generated_split],
               rl_tasks, eval_tasks, ckpt, state,
               state.get("experts", {}), log, tok, model, ref_model, terminals, lock, filt)


def resume_point(out: Path, resume: bool, rank: int, world: int) -> tuple[Path | None, dict]:
    """(the checkpoint to resume, its trainer.pt) from rundir.resume_checkpoint, which checks every
    file and cuts the logs: rank 0 alone does it and every rank takes its answer (its refusal too),
    so no rank but rank 0 reads the others' shards."""
    if not resume:
        return None, {}
    found = refusal = None
    if rank == 0:
        try:
            found = rundir.resume_checkpoint(out / "checkpoints")
        except SystemExit as e:
            refusal = e.code
    found, refusal = distributed.from_rank0((found, refusal), world)
    if refusal is not None:
        raise SystemExit(refusal)
    return found


def checkpoint(r: Run, step: int, opt=None, sched=None, sft_opt=None) -> Path:
    """checkpoints/step_<step>: the model and the trainer's state; every rank takes part. One
    process writes model/ (HF format) and trainer.pt whole, as a resume and the engine read them;
    under torchrun each rank writes its own shard (sharded_checkpoint)."""
    cfg = r.cfg
    st = {"step": step, "data_pos": step * cfg.train.tasks_per_step, "sft_done": True, "rng": rng_state(),
          "experts": r.experts, "difficulty": r.filter.state()}
    # a resume from the SFT-only start carries them too
    keep_sft = sft_opt is not None and cfg.sft.keep_moments
    opt = None if step == cfg.train.steps and not cfg.checkpoint.final_optimizer else opt
    if r.world > 1:
        return sharded_checkpoint(r, step, st, {"optimizer": opt} if opt is not None else
                                  {"sft_optimizer": sft_opt} if keep_sft else {}, sched)
    if opt is not None:
        st.update(optimizer=opt.state_dict(), scheduler=sched.state_dict())
    elif keep_sft:
        st["sft_optimizer"] = sft_opt.state_dict()
    return whole_checkpoint(r, step, st)


def whole_checkpoint(r: Run, step: int, st: dict, kind: str = "step") -> Path:
    """One process's checkpoint: the weights (checked finite) as model/ in HF format and `st` as
    trainer.pt, written atomically (save_checkpoint)."""
    full = distributed.unwrap(r.model).state_dict()
    rundir.stop_if_non_finite(step, weights=full)
    return save_checkpoint(r.out / "checkpoints", step, lambda d: learner.save_model(r.model, r.tok, d, full),
                           st, r.cfg.checkpoint.keep_last, kind=kind)


def sharded_checkpoint(r: Run, step: int, st: dict, opts: dict, sched, kind: str = "step") -> Path:
    """A torchrun checkpoint: every rank writes its shard of the weights and of `opts`' optimizer
    states into dcp/ at once (distributed.save_shards), inside rank 0's atomic step directory; rank
    0 adds trainer.pt (`st`: steps, RNG, experts, schedule) and meta.json. Nothing is gathered, and
    no rank waits for rank 0's part. The Hugging Face model/ for inference is the run's last step's
    alone (gathered to rank 0 once a run); a resume and the engine read the shards' weights."""
    cfg, root = r.cfg, r.out / "checkpoints"
    st["sharded"] = sorted(opts)
    if sched is not None:
        st["scheduler"] = sched.state_dict()
    st["rank_fingerprints"] = distributed.check_in_step(r.model, r.world, step)
    try:  # each rank its own shard; every rank stops alike, naming the first rank's finding
        rundir.stop_if_non_finite(step, weights=distributed.local_weights(r.model))
        bad = None
    except SystemExit as e:
        bad = e.code
    bad = next((b for b in distributed.gather(bad, r.world) if b is not None), None)
    if bad is not None:
        raise SystemExit(bad)
    tmp = distributed.from_rank0(rundir.checkpoint_tmp(root, step, kind) if r.rank == 0 else None, r.world)
    final = root / f"{kind}_{step:06d}"
    try:
        hashed = distributed.save_shards(tmp / distributed.SHARDS, r.model, opts)
    except Exception as e:  # a rank's write failed: DCP raises it on every rank
        if r.rank == 0:
            rundir.checkpoint_failed(root, tmp, final, e)
        raise SystemExit(f"checkpoint {final.name} not saved (rank {r.rank}: {type(e).__name__}); "
                         f"rank 0 says why")
    hashed = {k: v for d in distributed.gather(hashed, r.world) for k, v in d.items()}
    last = kind == "step" and step == cfg.train.steps
    full = distributed.full_state_dict(r.model) if last else None  # collective under FSDP
    if r.rank == 0:
        write = None if full is None else lambda d: learner.save_model(r.model, r.tok, d, full)
        save_checkpoint(root, step, write, st, cfg.checkpoint.keep_last, tmp=tmp, hashed=hashed, kind=kind)
    return final


def warm_start(r: Run):
    """The optional SFT warm start on oracle trajectories (the paper trains SFT -> RL), from the SFT
    checkpoint a resume found (sft_checkpoint) or from the start; returns its optimizer (None when
    skipped) and saves step 0, the SFT-only start and the engine's first weights."""
    cfg = r.cfg
    if not cfg.sft.steps or r.state.get("sft_done"):
        return None
    val_tasks = sft.val_tasks(r.sft_tasks, cfg)
    restore = functools.partial(sft_restore, r) if "sft" in r.state else None
    sft_opt = sft.warm_start(cfg, r.model, r.tok, r.env, r.sft_tasks[:cfg.sft.num_tasks][r.rank::r.world],
                             val_tasks[r.rank::r.world], r.rcfg, r.log, r.rank, restore,
                             functools.partial(sft_checkpoint, r))
    r.state = {}  # RL starts from the SFT-only start as a run never stopped does
    r.ckpt = checkpoint(r, 0, sft_opt=sft_opt)
    return sft_opt


def sft_checkpoint(r: Run, step: int, opt, sched, st: dict) -> Path:
    """checkpoints/sft_<step> (sft.warm_start's `save`, every sft.checkpoint_every SFT steps), from
    which a resume continues SFT bit for bit: the weights, SFT's AdamW and schedule, the RNG states
    and `st` (steps done, the batch draw's RNG state, the oracle demos, every rank's validation
    ones), written as RL's are: one process's model/ and trainer.pt, or each rank's shards. Under
    "sft" in trainer.pt: RL's keys would make a resume skip SFT. Every rank takes part."""
    val = [t for part in distributed.gather(st["val"], r.world) for t in part]
    state = {"sft": {**st, "val": val, "rng": rng_state(), "scheduler": sched.state_dict()}}
    if r.world > 1:
        return sharded_checkpoint(r, step, state, {"sft_optimizer": opt}, None, kind="sft")
    state["sft"]["optimizer"] = opt.state_dict()
    return whole_checkpoint(r, step, state, kind="sft")


def sft_restore(r: Run, opt, sched) -> dict:
    """sft.warm_start's `restore`: the SFT checkpoint's AdamW (each rank its shard under torchrun),
    schedule and RNG states (setup's seeding replaced, as nothing has drawn since) into this
    process; returns its "sft" state."""
    st = r.state["sft"]
    if "sft_optimizer" in r.state.get("sharded", ()):
        distributed.load_shards(r.ckpt / distributed.SHARDS, r.model, {"sft_optimizer": opt}, weights=False)
    else:
        distributed.load_optimizer_state(r.model, opt, st["optimizer"])
    sched.load_state_dict(st["scheduler"])
    set_rng_state(st["rng"])
    return st


def rl_optimizer(r: Run, sft_opt):
    """RL's AdamW and schedule: a resume's state, else SFT's moments (sft.keep_moments), else fresh."""
    cfg, state = r.cfg, r.state
    opt, sched = learner.make_optimizer(r.model, cfg.train.lr, cfg.train.weight_decay, cfg.train.adam_betas,
                                        cfg.train.warmup_steps, cfg.train.steps, cfg.train.lr_schedule)
    sharded = state.get("sharded", ())  # a torchrun checkpoint's optimizers, in its dcp/ shards
    if "optimizer" in sharded:  # each rank reads its own shard
        distributed.load_shards(r.ckpt / distributed.SHARDS, r.model, {"optimizer": opt}, weights=False)
        sched.load_state_dict(state["scheduler"])
    elif "optimizer" in state:
        distributed.load_optimizer_state(r.model, opt, state["optimizer"])
        sched.load_state_dict(state["scheduler"])
    elif state.get("step") and r.rank == 0:  # a finished run's last checkpoint, saved without them
        print(f"continuing from step {state['step']}, whose checkpoint has no AdamW moments "
              "(checkpoint.final_optimizer: false): AdamW and its schedule start afresh", file=sys.stderr)
    elif cfg.sft.keep_moments and (sft_opt is not None or "sft_optimizer" in state
                                   or "sft_optimizer" in sharded):
        # Adam's bias-corrected first step is lr * sign(g) on every weight, however small or noisy g
        # is; SFT's second moments scale RL's first steps by what that weight's gradients have
        # looked like instead.
        if sft_opt is not None:  # same parameter objects (FSDP shards too): hand the state over as is
            opt.state.update(sft_opt.state)
        else:  # resuming at the SFT-only start: the saved state, but RL's own lr
            lrs = [(g["lr"], g["initial_lr"]) for g in opt.param_groups]
            if "sft_optimizer" in sharded:
                distributed.load_shards(r.ckpt / distributed.SHARDS, r.model, {"sft_optimizer": opt},
                                        weights=False)
            else:
                distributed.load_optimizer_state(r.model, opt, state["sft_optimizer"])
            for g, (lr, initial) in zip(opt.param_groups, lrs):
                g["lr"], g["initial_lr"] = lr, initial
    return opt, sched


def start_policy(r: Run, version: int) -> Policy:
    """The inference engine on the latest weights (the checkpoint's, else model.path's)."""
    # under torchrun a checkpoint has no model/ (but at the run's last step), and rank 0 may still
    # be writing it: the engine starts on model.path and takes the trainer's weights
    from_trainer = r.ckpt is not None and (r.world > 1 or "sharded" in r.state)
    full_ckpt = r.ckpt is not None and not r.cfg.model.lora and not from_trainer
    engine = make_engine(r.cfg, r.ckpt / "model" if full_ckpt else r.cfg.model.path, r.device)
    if r.cfg.engine.kind == "vllm":
        distributed.check_engine_placement(*engine.placement(), r.device)
    check_topk_rule(r.cfg, r.rcfg, r.device)
    policy = Policy(engine, r.tok, version=version, template_kwargs=r.rcfg.chat_template_kwargs,
                            tools=r.rcfg.tools)
    if from_trainer:
        sync_weights(r.model, policy, r.cfg, r.out, version)
    elif r.ckpt is not None and r.cfg.model.lora:
        policy.load_lora(r.ckpt / "model", version)
    return policy


# -----------------------------------------------------------------------------------------------
# the pieces of one step


@dataclass
class StepRollout:
    """One step's episodes on this rank, as the loop trains on and logs them."""
    step: int
    tasks: list          # all ranks' tasks of the step
    drawn: dict          # the draw's metrics (difficulty.DifficultyFilter.draw)
    trajs: list          # this rank's trajectories
    t_roll: float        # seconds the rollout took
    t_gen: float         # of which the engine generated
    n_stale: int = 0     # trajectories dropped as too stale to train on (train.mode async)


def rollout_step(r: Run, policy, step: int) -> StepRollout:
    """Step `step`'s episodes on this rank."""
    tasks, sat_out, fell_back = r.filter.draw(r.rl_tasks, step, r.cfg.train.tasks_per_step, r.cfg.seed)
    drawn = {"tasks_sitting_out": sat_out, "filter_fell_back": fell_back}
    mine, before = rank_share(tasks, r.rank, r.world)  # all ranks' tasks; this one's
    g0, t0 = policy.gen_busy_s, time.time()
    trajs = rollout.collect(mine, policy, r.env, r.rcfg, group_size=r.cfg.train.group_size,
                            group_id_start=step * r.cfg.train.tasks_per_step + before, progress=False,
                            experts=r.experts)
    return StepRollout(step=step, tasks=tasks, drawn=drawn, trajs=trajs, t_roll=time.time() - t0,
                       t_gen=policy.gen_busy_s - g0)


def start_producer(r: Run, policy, start: int, stop: threading.Event) -> queue.Queue:
    """train.mode async: a thread rolls out step s+1.. while the trainer updates on step s. Step s
    trains on version s, so its rollouts start once the weights are at least s - max_staleness;
    later turns are newer still (tests/test_gpu_path.py::test_async_steps_respect_the_staleness_bound)."""
    produced = queue.Queue()

    def producer():
        for s in range(start, r.cfg.train.steps):
            if not policy.wait_for_version(s - r.cfg.train.max_staleness, stop):
                return
            try:
                item = rollout_step(r, policy, s)
            except BaseException as e:  # noqa: BLE001 -- e.g. the engine failed: next_rollout raises it
                item = e
            produced.put(item)
            if isinstance(item, BaseException):
                return
    threading.Thread(target=producer, name="rollout-producer", daemon=True).start()
    return produced


def next_rollout(r: Run, policy, step: int, produced: queue.Queue | None) -> StepRollout:
    """Step `step`'s episodes: from the async producer (those too stale dropped), else rolled out now
    with the engine awake."""
    if produced is not None:
        item = produced.get()
        if isinstance(item, BaseException):  # the producer's rollout failed: the run ends with its error
            raise item
        assert item.step == step, f"async producer is at step {item.step}, trainer at {step}"
        item.trajs, item.n_stale = rollout.drop_stale(item.trajs, policy.version, r.cfg.train.max_staleness)
        return item
    policy.wake()
    return rollout_step(r, policy, step)


def share_experts(r: Run, trajs):
    """Refresh every rank's experts from every rank's successes (rollout.refresh_expert): each rank
    rolled out only its share of the tasks, and the checkpoint keeps rank 0's dict, so a resume
    would otherwise lose what the other ranks learnt (tests/test_train.py::
    test_torchrun_two_ranks_move_in_step_and_resume_exactly). Equally short successes: the lower
    rank's wins, on every rank alike. Collective: the loop calls it, not the async producer, whose
    collectives would interleave with the trainer's."""
    if r.world > 1 and r.rcfg.refresh_expert:
        pairs = [p for part in distributed.gather(rollout.successes(trajs), r.world) for p in part]
        r.experts.update(rollout.shortest_per_task(pairs))


def filter_step(r: Run, step: int, trajs) -> dict:
    """Every rank's valid episodes of step `step` into the difficulty filter (collective, as
    share_experts), and zero_adv_frac (difficulty.zero_adv_frac: the share of groups without signal)."""
    mine = [(t.task_name, t.group_id, t.reward) for t in trajs if t.valid]
    outcomes = [o for part in distributed.gather(mine, r.world) for o in part]
    r.filter.record(step, [(name, reward > 0) for name, _, reward in outcomes])
    return {"zero_adv_frac": difficulty.zero_adv_frac([(g, x) for _, g, x in outcomes], r.acfg.baseline)}


def episode_stats(trajs, world: int) -> tuple[float, float, bool]:
    """(mean reward, success rate, whether to update) over every rank's valid episodes. Every rank
    updates or none does (collectives); a rank with no valid trajectory has no batch."""
    valid = [t for t in trajs if t.valid]
    reward = sum(t.reward for t in valid) / max(1, len(valid))
    success = sum(t.reward > 0 for t in valid) / max(1, len(valid))
    reward, success = distributed.all_mean([reward, success], world, len(valid))
    return reward, success, distributed.all_mean([float(bool(valid))], world)[0] == 1.0


def eval_samples(cfg: Config, step: int) -> int:
    """Episodes per held-out task at the eval after `step` RL steps: eval.samples at the run's first
    and last (the gain is measured between them), eval.samples_mid (when set) between them."""
    full = step == 0 or step == cfg.train.steps
    return cfg.eval.samples if full or not cfg.eval.samples_mid else cfg.eval.samples_mid


def heldout_eval(r: Run, policy, step: int) -> tuple[float, float]:
    """Held-out success: eval_samples episodes per task at eval.temperature, invalid ones not
    counted; logged as phase "eval" with its 95% interval (evaluate.task_mean_ci: the samples
    cluster by task). Returns (success, seconds)."""
    t0, cfg = time.time(), r.cfg
    ecfg = dataclasses.replace(r.rcfg, temperature=cfg.eval.temperature, prefill_prob=0.0,
                               group_redundancy=0, max_staleness=None)
    mine, before = rank_share(r.eval_tasks, r.rank, r.world)
    samples = eval_samples(cfg, step)
    trajs = rollout.collect(mine, policy, r.env, ecfg, group_size=samples, group_id_start=10 ** 6 + before,
                            progress=False)
    valid = [t for t in trajs if t.valid]
    succ = distributed.all_mean([sum(t.reward > 0 for t in valid) / max(1, len(valid))], r.world,
                                len(valid))[0]
    outcomes = [(t.task_name, t.reward > 0) for t in valid]
    counts = difficulty.pass_counts(o for part in distributed.gather(outcomes, r.world) for o in part)
    low, high = task_mean_ci(list(counts.values()))
    rollout.write_jsonl(trajs, r.out / (f"eval_trajectories.rank{r.rank}.jsonl" if r.world > 1
                                        else "eval_trajectories.jsonl"))
    if r.rank == 0:
        r.log.log({"phase": "eval", "step": step, "success": succ, "success_ci": [low, high],
                   "samples": samples, "episodes": sum(n for _, n in counts.values()),
                   "time/eval": time.time() - t0})
    return succ, time.time() - t0


def curate(r: Run, policy):
    """train.curate_k: the start policy plays curate_k episodes of each of RL's first curate_tasks draws
    (no prefilled starts); RL then draws only those it both solved and failed (difficulty.moderate).
    The choice is a metrics record (phase "curate"): a resume after it reads it back, one that cut it
    away plays them again, as the baseline eval (tests/test_difficulty.py::test_a_curated_run_*)."""
    k = r.cfg.train.curate_k
    done = [x["kept"] for x in r.log.records if x.get("phase") == "curate"]
    kept = distributed.from_rank0(done[-1] if done else None, r.world)
    if kept is None:
        t0 = time.time()
        n = min(r.cfg.train.curate_tasks or len(r.rl_tasks), len(r.rl_tasks))  # RL's first draws, each once
        pool = step_tasks(r.rl_tasks, 0, n, r.cfg.seed)
        mine, before = rank_share(pool, r.rank, r.world)
        policy.wake()
        ccfg = dataclasses.replace(r.rcfg, prefill_prob=0.0, group_redundancy=0)
        trajs = rollout.collect(mine, policy, r.env, ccfg, group_size=k, group_id_start=2 * 10 ** 6 + before,
                                progress=r.rank == 0)  # minutes before RL's own bar starts
        rollout.write_jsonl(trajs, r.out / f"curate_trajectories{f'.rank{r.rank}' * (r.world > 1)}.jsonl")
        outcomes = [(t.task_name, t.reward > 0) for t in trajs if t.valid]
        kept, counts = difficulty.moderate(o for part in distributed.gather(outcomes, r.world) for o in part)
        if r.rank == 0:
            r.log.log({"phase": "curate", "step": 0, "k": k, "tried": len(pool), "kept": kept,
                       "counts": counts, "time/curate": time.time() - t0})
    if not kept:
        raise SystemExit(f"{r.out}: no task to draw; the start policy passed each it tried in all {k} tries "
                         f"or none: raise train.curate_k or train.curate_tasks, or set train.curate_k=0")
    r.rl_tasks = [t for t in r.rl_tasks if t.name in kept]


def rank_times(world: int, trajs, t_roll: float, t_train: float) -> dict:
    """Episodes and per-rank rollout/train seconds: a straggler rank sets everyone's pace."""
    if world == 1:
        return {}
    per = distributed.gather([len(trajs), t_roll, t_train], world)
    return {"episodes": sum(p[0] for p in per), "time/rollout_ranks": [p[1] for p in per],
            "time/train_ranks": [p[2] for p in per]}


def finish(r: Run, t_start: float) -> dict:
    """summary.txt (printed) and curves.png from the run's records."""
    result = {"records": r.log.records, "wall_s": time.time() - t_start}
    if r.rank == 0:
        line = plot_curves(r.log.records, r.out / "curves.png") if r.cfg.plot else ""
        text = (summary(r.log.records, result["wall_s"], r.out, rundir.peak_rss_gib())
                + ("\n" + line if line else ""))
        (r.out / "summary.txt").write_text(text + "\n")
        print(text)
    r.log.close()
    if r.lock:
        r.lock.close()
    return result


# -----------------------------------------------------------------------------------------------
# the run


def run(cfg: Config, resume: bool = False, restart: bool = False) -> dict:
    t_start = time.time()
    r = setup(cfg, resume, restart)
    sft_opt = warm_start(r)
    start = r.state.get("step", 0)
    opt, sched = rl_optimizer(r, sft_opt)
    policy = start_policy(r, start)
    if "rng" in r.state:  # after the engine: vLLM seeds python/numpy/torch when it starts, which would
        # overwrite the checkpoint's states
        # (tests/test_train.py::test_sigkill_and_resume_continues_the_unbroken_run_bit_for_bit)
        set_rng_state(r.state["rng"])
    model, log, world, rank = r.model, r.log, r.world, r.rank
    traj_file = r.out / (f"trajectories.rank{rank}.jsonl" if world > 1 else "trajectories.jsonl")

    eval_succ, t_ckpt = None, 0.0
    # the baseline eval, before RL step 1, as an unbroken run has it: a resume from a later step
    # already holds it, and one from step 0 had its record cut with the logs
    # (tests/test_train.py::test_sigkill_and_resume_continues_the_unbroken_run_bit_for_bit)
    if r.eval_tasks and cfg.eval.at_start and start == 0:
        eval_succ, _ = heldout_eval(r, policy, start)
    if cfg.train.curate_k and cfg.train.steps:
        curate(r, policy)
    stop = threading.Event()
    produced = start_producer(r, policy, start, stop) if cfg.train.mode == "async" else None

    bar = tqdm(range(start, cfg.train.steps), desc="rl", initial=start, total=cfg.train.steps,
               disable=rank != 0)
    for step in bar:
        t_step = time.time()
        # 1. rollout (engine awake)
        ro = next_rollout(r, policy, step, produced)
        trajs = ro.trajs
        rollout.write_jsonl(trajs, traj_file)
        share_experts(r, trajs)
        filtered = filter_step(r, step, trajs)
        reward, success, train_now = episode_stats(trajs, world)

        # 2. advantages, 3. engine sleeps, 4. update in token-budget micro-batches
        t0 = time.time()
        if cfg.train.mode == "sync" and cfg.engine.sleep:
            policy.sleep()
        m = {}
        if train_now:
            batch = algo.at_level(rollout.make_batch(trajs, r.tok.pad_token_id), r.acfg.level)
            adv = algo.compute_advantages(batch, r.acfg)
            # a batch no loss term can learn from (every episode failed under a successes-only loss)
            # is not trained on, and the lr schedule does not advance: AdamW's momentum would still
            # move every weight (tests/test_train.py::test_a_batch_without_signal_leaves_the_weights_alone)
            train_now = distributed.all_mean([float(algo.can_move(batch, adv, r.acfg))], world)[0] > 0
        if train_now:
            for _ in range(cfg.train.updates_per_step):  # PPO epochs: the first one's forwards are π_old
                m = learner.rl_step(model, opt, sched, batch, adv, r.acfg, cfg.train, r.rcfg.temperature,
                                    r.rcfg.top_k, r.rcfg.top_p, ref_model=r.ref_model,
                                    keep_old=cfg.train.updates_per_step > 1)
                rundir.stop_if_non_finite(step + 1, m)
        t_train = time.time() - t0

        # 5. sync weights into the engine, 6. check the engine now computes what the trainer does
        t0 = time.time()
        learner.release_cached_memory(r.device)
        sync_weights(model, policy, cfg, r.out, step + 1)
        t_sync = time.time() - t0
        gap = sync_gap(model, policy, batch, cfg) if train_now else {}

        # 7. eval now and then
        t_eval, done = 0.0, step + 1
        if r.eval_tasks and ((cfg.eval.every and done % cfg.eval.every == 0) or done == cfg.train.steps):
            eval_succ, t_eval = heldout_eval(r, policy, done)

        # 8. log: one line per step
        rec = {"phase": "rl", "step": done, "reward": reward, "success": success,
               "tasks": [t.name for t in ro.tasks], "episodes": len(trajs), "dropped_stale": ro.n_stale,
               "policy_version": policy.version, **ro.drawn, **filtered, **m,
               "sync_gap": gap.get("sync/mean_abs_logprob_gap"),
               "sync_gap_max": gap.get("sync/max_abs_logprob_gap"),
               "time/rollout": ro.t_roll, "time/generation": ro.t_gen,
               "time/env": max(0.0, ro.t_roll - ro.t_gen),
               "time/train": t_train, "time/sync": t_sync, "time/eval": t_eval, "time/checkpoint": t_ckpt,
               "time/step": time.time() - t_step,  # wall clock; async mode hides rollout time behind training
               **{k.replace("rollout/", "rollout_"): v for k, v in rollout.rollout_metrics(trajs).items()},
               **rank_times(world, trajs, ro.t_roll, t_train), **r.env.host_stats()}
        if rank == 0:
            log.log(rec)

        # 9. checkpoint, after the step's records: it notes the logs' sizes and a resume cuts them
        # back to those, so a kill between the two neither loses the record nor repeats it
        t0 = time.time()
        if done % cfg.checkpoint.every == 0 or done == cfg.train.steps:
            checkpoint(r, done, opt, sched)
        t_ckpt = time.time() - t0  # logged with the next step
        bar.set_postfix(reward=f"{reward:.2f}", success=f"{success:.0%}",
                        eval="-" if eval_succ is None else f"{eval_succ:.0%}",
                        **({"hosts": hp} if (hp := r.env.hosts_postfix()) else {}))
    stop.set()
    policy.close()
    r.env.close()
    return finish(r, t_start)


def dry_run(cfg: Config, nproc: int = 1, nnodes: int = 1, gpu_gb: float | None = None,
            host_gb: float | None = None) -> int:
    """Check config, tasks, model path, GPU and Docker without training; print what would run and,
    for a GPU run on `nnodes` x `nproc` ranks, its memory plan (memory_plan.py)."""
    problems = []
    device = "cuda" if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()) else "cpu"
    if cfg.device == "cuda" and not torch.cuda.is_available():
        problems.append("device: cuda but torch sees no GPU")
    mtext = ""
    if device == "cuda":
        try:
            mplan = memory_plan.gpu_memory_plan(cfg, nproc * nnodes, nproc, gpu_gb, host_gb,
                                                rollout_cfg(cfg).max_context, bool(algo_cfg(cfg).kl_coef))
            mtext = mplan.text()
            problems += [f"memory: {p}" for p in mplan.problems]
        except SystemExit as e:
            problems.append(str(e))
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
            learner.check_model_path(cfg)
            print(f"model: {cfg.model.path}")
        except SystemExit as e:
            problems.append(str(e))
    try:
        import docker  # optional: the Docker SDK; a missing one is a problem reported here
        client = docker.from_env()
        client.ping()
        images = {t.image for t in train if t.image}
        for img in images:
            try:
                client.images.get(img)
            except docker.errors.ImageNotFound:
                problems.append(f"docker image {img} missing (build it: docker build -t {img} tasks/base)")
        print(f"docker: reachable, {len(images)} base image(s) checked")
        for spec in cfg.env.hosts:  # each sandbox host: an authenticated transport, answering
            try:
                h = hosts.parse_host(spec)
                hosts.connect(docker, h, hosts.PROBE_TIMEOUT_S).ping()
                print(f"docker host {h.name}: reachable")
            except Exception as e:
                problems.append(str(e) if isinstance(e, ValueError)
                                else f"docker host {spec}: not reachable ({e})")
    except Exception as e:
        problems.append(f"docker: not reachable ({type(e).__name__}: {e}); start dockerd")
    print(f"device: {device}; engine: {cfg.engine.kind}; {'LoRA' if cfg.model.lora else 'full'} fine-tuning; "
          f"algo: {algo_cfg(cfg).loss}; mode: {cfg.train.mode}; steps: sft {cfg.sft.steps}, "
          f"rl {cfg.train.steps} x {cfg.train.tasks_per_step} tasks x {cfg.train.group_size}; "
          f"out: {cfg.out_dir}")
    print(mtext or "memory plan: a CPU run, not planned")
    for p in problems:
        print(f"PROBLEM: {p}")
    print("dry run: OK" if not problems else f"dry run: {len(problems)} problem(s)")
    return 1 if problems else 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="YAML file (see configs/)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config key, e.g. --set train.lr=1e-5 (repeatable)")
    ap.add_argument("--dry-run", action="store_true", help="check config, tasks, model path, docker and the "
                    "memory plan of a GPU run; do not train")
    ap.add_argument("--nproc-per-node", type=int, default=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
                    help="--dry-run: ranks a node the run will have under torchrun (its own flag)")
    ap.add_argument("--nnodes", type=int, help="--dry-run: nodes the run will have under torchrun",
                    default=int(os.environ.get("WORLD_SIZE", "1"))
                    // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    ap.add_argument("--gpu-gb", type=float,
                    help="--dry-run: each GPU's memory in GiB (default: the visible GPU's, else 80)")
    ap.add_argument("--host-gb", type=float,
                    help="--dry-run: each host's RAM in GiB (default: this machine's when it has a GPU)")
    ap.add_argument("--resume", action="store_true",
                    help="continue from the newest intact checkpoint in <out_dir>/checkpoints")
    ap.add_argument("--restart", action="store_true", help="start over in an out_dir that holds a run: the "
                    "old one is moved to <out_dir>.<date-time>")
    a = ap.parse_args(argv)
    with distributed.error_said_once():
        try:
            cfg = load_config(a.config, a.set)
        except ConfigError as e:
            raise SystemExit(f"config error: {e}")
        if a.dry_run:
            raise SystemExit(dry_run(cfg, a.nproc_per_node, a.nnodes, a.gpu_gb, a.host_gb))
        try:
            run(cfg, resume=a.resume, restart=a.restart)
        except TaskError as e:  # nothing loadable: one line, as --dry-run (tests/test_task_folders.py)
            raise SystemExit(f"tasks: {e}") from None
        except hosts.HostsDown as e:  # every sandbox host silent: --resume starts at the last checkpoint
            raise SystemExit(f"stopped: {e}; then resume with --resume")
        except OSError as e:  # a log or adapter write; a checkpoint's says so itself (rundir.save_checkpoint)
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise SystemExit(f"stopped: the disk is full ({e.filename or cfg.out_dir}: {e.strerror}); the "
                             f"last checkpoint is intact: free space, then continue with --resume") from None


if __name__ == "__main__":
    main()
