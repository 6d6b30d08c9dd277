"""Can the RL update raise success on a FIXED set of tasks? The first check of any RL setup.

Repeats collect -> update -> sync on the same tasks with train.py's own `update` and
`sync_weights`, and prints success per iteration next to how the update moved the log-probability
of the positive- and negative-advantage trajectories it trained on (mean, and how many). If
success does not climb here, it will not climb on held-out tasks either. `--sgd` swaps AdamW for plain SGD
(same lr key), which separates "wrong direction" from "Adam's sign-like first steps".

    python bench/bench_learning.py --model runs/tiny/checkpoints/step_000000/model --iters 6 \
        --set train.lr=1e-4 --set algo.negative_reward=0
"""
import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def row_logprob(model, batch):
    import torch
    import logprobs
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        lp, _ = logprobs.token_logprobs(logits, batch.input_ids)
    return (lp * batch.loss_mask).sum(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/tiny.yaml")
    ap.add_argument("--model", required=True, help="a full-weights checkpoint dir (e.g. the SFT-only step 0)")
    ap.add_argument("--tasks", type=int, default=10, help="how many of the config's train tasks to reuse")
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--iters", type=int, default=6)
    ap.add_argument("--sgd", action="store_true")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    a = ap.parse_args()
    if not Path(a.model).exists():  # before transformers reads it as a hub id and fails on the form
        raise SystemExit(f"--model {a.model}: no such directory. Give a full-weights model directory, e.g. "
                         f"runs/tiny/checkpoints/step_000000/model (the SFT-only start of "
                         f"python train.py --config configs/tiny.yaml)")
    if not (Path(a.model) / "config.json").exists():
        raise SystemExit(f"--model {a.model}: not a model directory (no config.json); a train.py "
                         f"checkpoint's model is in its model/ subdirectory")

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    import algo
    import config
    import learner
    import rollout
    from policy import Policy
    import train

    cfg = config.load_config(a.config, ["engine.kind=vllm", *a.set])
    if cfg.model.lora:
        raise SystemExit("bench_learning.py updates full weights; "
                         "set model.lora=false (--set model.lora=false)")
    rcfg, acfg = config.rollout_cfg(cfg), config.algo_cfg(cfg)
    tasks = train.load_task_sets(cfg)[0][: a.tasks]
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    policy = Policy(train.make_engine(cfg, a.model, "cpu"), tok,
                            template_kwargs=rcfg.chat_template_kwargs, tools=rcfg.tools)
    env = train.make_env(cfg)
    if a.sgd:
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=cfg.train.lr)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    else:
        opt, sched = learner.make_optimizer(model, cfg.train.lr, cfg.train.weight_decay, cfg.train.adam_betas,
                                            cfg.train.warmup_steps, a.iters, "constant")
    print(f"{len(tasks)} tasks x {a.group}, lr {cfg.train.lr} ({'SGD' if a.sgd else 'AdamW'}), "
          f"loss {acfg.loss}, baseline {acfg.baseline}, negative_reward {acfg.negative_reward}")
    try:
        for it in range(a.iters + 1):
            trajs = rollout.collect(tasks, policy, env, rcfg, group_size=a.group, progress=False)
            valid = [t for t in trajs if t.valid]
            success = sum(t.reward > 0 for t in valid) / max(1, len(valid))
            if it == a.iters:
                print(f"after {a.iters} updates: success {success:.3f}")
                break
            batch = algo.at_level(rollout.make_batch(trajs, tok.pad_token_id), acfg.level)  # as train.py
            adv = algo.compute_advantages(batch, acfg)
            sign = algo.trajectory_sign(adv)
            before = row_logprob(model, batch)
            m = learner.rl_step(model, opt, sched, batch, adv, acfg, cfg.train, rcfg.temperature)
            moved = row_logprob(model, batch) - before
            # "-" where no trajectory has that sign (no negatives under negative_reward 0, baseline none)
            mean = lambda x: f"{float(x.mean()):+.3f} ({x.numel()})" if x.numel() else "- (0)"  # noqa: E731
            print(f"iter {it}: success {success:.3f}  grad_norm {m['grad_norm']:.3f}  "
                  f"Δlogp(traj) positive {mean(moved[sign > 0])} negative {mean(moved[sign < 0])}",
                  flush=True)
            train.sync_weights(model, policy, cfg, Path("/tmp/termrl-bench-learning"), it + 1)
    finally:
        env.close()
        policy.close()


if __name__ == "__main__":
    main()
