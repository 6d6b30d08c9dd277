"""SFT warm start: NLL on oracle trajectories, rendered exactly as the agent's own turns.

The paper trains SFT -> RL; a policy that never samples a success gives RL no signal. train.py
calls, once, before RL:

    val_tasks = sft.val_tasks(train_tasks, cfg)   # the last train tasks: RL's, never SFT's
    opt = sft.warm_start(cfg, model, tok, env, train_tasks[:cfg.sft.num_tasks], val_tasks, rcfg, log,
                         restore=..., save=...)   # an SFT checkpoint's state, and how to write one

The oracle trajectories are collected in real containers (real tool outputs); each step trains on
sft.batch_size of them through learner.sft_step, the optimizer step RL uses too.
"""
import dataclasses
import random

from tqdm import tqdm

import distributed
import learner
from policy import ScriptedPolicy
import rollout


def val_tasks(train_tasks: list, cfg) -> list:
    """sft.val_tasks train tasks SFT never trains on: the last ones, beyond sft.num_tasks."""
    n, v = cfg.sft.num_tasks, cfg.sft.val_tasks
    val = train_tasks[n:][-v:] if v else []
    if v and not val:
        raise SystemExit(f"sft.val_tasks needs train tasks beyond the sft.num_tasks={n} SFT trains on; "
                         f"there are {len(train_tasks)}: add tasks, lower sft.num_tasks or set "
                         f"sft.val_tasks=0")
    return val


def validation(model, batch, cfg, temperature: float) -> dict:
    """On oracle trajectories SFT never trained on: val_nll = mean NLL per assistant token, and
    val_oracle_prob = mean over trajectories of Π_t π_θ(a_t) = the chance of sampling it exactly."""
    lp = learner.policy_logprobs(model, batch, cfg.train.micro_batch_tokens, temperature)
    m = batch.loss_mask
    per_row = (lp * m).sum(1)
    world = distributed.world_size()  # ranks score shares of the trajectories: weight by tokens, by rows
    nll = distributed.all_mean([(-per_row.sum() / m.sum()).item()], world, weight=float(m.sum()))[0]
    prob = distributed.all_mean([per_row.double().exp().mean().item()], world, weight=float(len(batch)))[0]
    return {"val_nll": nll, "val_oracle_prob": prob}  # (double: fp32 exp underflows early in SFT)


def oracle_demos(cfg, tok, env, tasks, val_tasks, rcfg, rank: int = 0) -> tuple[list, list]:
    """(train demos of all ranks, this rank's validation demos): the oracle's passing trajectories."""
    with ScriptedPolicy(tok, "oracle", template_kwargs=rcfg.chat_template_kwargs,
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
                         f"check the tasks with `python tasktool.py validate`")
    if cfg.sft.val_tasks and min(distributed.gather(len(val), world)) < 1:
        raise SystemExit(f"SFT validation: no oracle trajectory of the {cfg.sft.val_tasks} sft.val_tasks "
                         f"passed its tests on some rank; raise sft.val_tasks or check the tasks with "
                         f"`python tasktool.py validate`")
    return demos, val


def warm_start(cfg, model, tok, env, tasks, val_tasks, rcfg, log, rank: int = 0, restore=None, save=None):
    """sft.steps optimizer steps (fewer once sft.stop_at_val_prob is reached); returns the optimizer,
    whose Adam moments RL may start from (sft.keep_moments).

    Every sft.checkpoint_every steps (but the last) save(step, opt, sched, state) writes an SFT
    checkpoint of `state`: the steps done, the batch draw's RNG state and the oracle demos (all
    ranks' train demos, this rank's validation ones), which a resume takes rather than collecting
    them in containers again. restore(opt, sched), at a resume, loads such a checkpoint's optimizer,
    schedule and RNG states and returns its `state` (with every rank's validation demos): SFT goes
    on as if never stopped, its early stop too, and logs each step once
    (tests/test_train.py::test_sigkill_during_sft_and_resume_continues_the_unbroken_run_bit_for_bit)."""
    if restore is None:
        demos, val = oracle_demos(cfg, tok, env, tasks, val_tasks, rcfg, rank)
    world = distributed.world_size()
    opt, sched = learner.make_optimizer(model, cfg.sft.lr, cfg.train.weight_decay, cfg.train.adam_betas,
                                        cfg.sft.warmup_steps, cfg.sft.steps, "cosine")
    rng, start = random.Random(f"sft-{cfg.seed}"), 0
    if restore is not None:
        st = restore(opt, sched)
        names = {t.name for t in val_tasks}  # this rank's share, as the run that saved it had it
        demos, val, start = st["demos"], [t for t in st["val"] if t.task_name in names], st["step"]
        rng.setstate(st["batch_rng"])
    val_batch = rollout.make_batch(val, tok.pad_token_id) if val else None
    bar = tqdm(range(start, cfg.sft.steps), desc="sft", initial=start, total=cfg.sft.steps, disable=rank != 0)
    for s in bar:
        picked = rng.sample(demos, min(cfg.sft.batch_size, len(demos)))[rank::world]
        m = learner.sft_step(model, opt, sched, rollout.make_batch(picked, tok.pad_token_id), cfg.train)
        if val_batch is not None and ((s + 1) % cfg.sft.val_every == 0 or s + 1 == cfg.sft.steps):
            m.update(validation(model, val_batch, cfg, rcfg.temperature))
        bar.set_postfix(loss=f"{m['loss']:.3f}",
                        **({"val_p": f"{m['val_oracle_prob']:.3f}"} if "val_oracle_prob" in m else {}))
        if rank == 0:
            log.log({"phase": "sft", "step": s, **m})
        # a policy that already samples the oracle this often gives RL signal, and leaves RL room
        if cfg.sft.stop_at_val_prob and m.get("val_oracle_prob", 0.0) >= cfg.sft.stop_at_val_prob:
            if rank == 0:
                tqdm.write(f"sft: stopped after {s + 1} steps, val_oracle_prob {m['val_oracle_prob']:.3f} "
                           f">= sft.stop_at_val_prob {cfg.sft.stop_at_val_prob}")
            break
        # after the step's record: the checkpoint notes the log's size, and a resume cuts it back there
        every = cfg.sft.checkpoint_every
        if save is not None and every and (s + 1) % every == 0 and s + 1 < cfg.sft.steps:
            save(s + 1, opt, sched, {"step": s + 1, "batch_rng": rng.getstate(), "demos": demos, "val": val})
    return opt
