"""Benchmark train.py: where a step's time goes, trainer throughput vs a bare forward+backward, padding.

    python bench/bench_train.py                       # tiny model, CPU, 3 RL steps of configs/tiny.yaml
    python bench/bench_train.py --steps 0 --repeats 2  # only 2.: the trainer figures of docs/results.md
    python bench/bench_train.py --metrics runs/tiny/metrics.jsonl   # only 1., of a finished run
    python bench/bench_train.py --modes sync async --steps 4 --repeats 0   # 3.: async vs sync step time

1. Runs a short real training run (vLLM + Docker) and prints, per RL step, the time split:
   generation, environment, training, weight sync, eval, checkpoint.
2. On one batch of real trajectories (the oracle and a garbage policy on generated tasks, so
   lengths vary), times learner.rl_step (token-budget micro-batches, IPA/GRPO loss, masks, AdamW)
   against a bare transformers forward + cross-entropy backward over the same micro-batches, and
   prints tokens/s of both, the overhead, and the padding fraction next to count-based batching.
3. With --modes sync async: the same RL steps (config, seed, tasks) in each train.mode, and the
   mean wall time per step after the first (time/step), so async's overlap shows as a speed-up.
Targets: overhead <= 10%, padding <= 10%.
"""
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def time_split(cfg, steps: int, metrics: str | None):
    import json
    import train
    if metrics:  # an existing run's metrics.jsonl
        records = [json.loads(line) for line in Path(metrics).read_text().splitlines()]
    else:
        cfg.train.steps, cfg.checkpoint.every, cfg.eval.every, cfg.plot = steps, steps, steps, False
        records = train.run(cfg)["records"]
    keys = ["generation", "env", "train", "sync", "eval", "checkpoint"]
    print(f"\n{'step':>4} " + " ".join(f"{k:>11}" for k in keys) + f" {'total':>8}  (seconds)")
    for r in records:
        if r.get("phase") == "rl":
            vals = [r.get(f"time/{k}", 0.0) for k in keys]
            print(f"{r['step']:>4} " + " ".join(f"{v:>11.2f}" for v in vals) + f" {sum(vals):>8.2f}")
    print("generation = engine busy time during the rollout; env = the rest of the rollout wall time "
          "(container start, commands, grading not hidden behind generation)")
    return records


def scripted_batch(cfg, tok, n_tasks: int = 16, group_size: int = 2):
    """Real trajectories of the oracle and a garbage policy on generated tasks (real containers,
    so lengths vary as in training), as the rows learner.rl_step forwards: (batch, trajectories
    collected). The scripted engines report log-prob 0; the batch gets plausible engine log-probs
    and alternating rewards, so rows train."""
    import torch
    import env as envmod
    from generated_tasks import generate_easy_tasks
    import algo
    import config
    import learner
    import rollout
    from policy import ScriptedPolicy

    tasks = generate_easy_tasks(n_tasks, seed=1)
    rcfg = config.rollout_cfg(cfg)
    trajs = []
    with envmod.Env() as env:
        for mode in ("oracle", "garbage"):
            with ScriptedPolicy(tok, mode, template_kwargs=rcfg.chat_template_kwargs,
                                tools=rcfg.tools) as pol:
                trajs += rollout.collect(tasks, pol, env, rcfg, group_size=group_size, progress=False)
    batch = rollout.make_batch(trajs, tok.pad_token_id)
    batch.infer_logprobs = -0.5 * batch.loss_mask
    batch.reward = torch.where(batch.valid, torch.arange(len(batch)).remainder(2).float(), batch.reward)
    acfg = config.algo_cfg(cfg)
    adv = algo.compute_advantages(batch, acfg)
    rows, _, _ = algo.rows_that_train(batch, adv, algo.keep_rows(batch, adv, acfg)[0], acfg)
    return learner.select_rows(batch, rows)[0], len(trajs)  # the same tokens for both timings


def bare_backward(model, batch, groups):
    """What a hand-written transformers loop does with the same micro-batches: full logits,
    cross-entropy on every next token, loss.backward()."""
    import torch
    import learner
    for rows in groups:
        mb, _ = learner.select_rows(batch, rows)
        logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(),
                                                 mb.input_ids[:, 1:].flatten(), reduction="sum")
        loss.backward()


def throughput(cfg, repeats: int):
    from transformers import AutoTokenizer
    import algo
    import config
    import learner

    if cfg.model.build_tiny:  # a fresh tiny model of the config's size, apart from the run's own
        import tiny
        cfg.model.path = str(tiny.build_tiny_model(ROOT / "out" / "bench-tiny", **cfg.model.tiny))
    tok = AutoTokenizer.from_pretrained(cfg.model.path)
    rcfg, acfg = config.rollout_cfg(cfg), config.algo_cfg(cfg)
    batch, n_trajs = scripted_batch(cfg, tok)
    lengths = batch.attention_mask.sum(1).tolist()
    groups = learner.pack_by_tokens(lengths, cfg.train.micro_batch_tokens)
    per = max(1, len(lengths) * cfg.train.micro_batch_tokens // (max(lengths) * len(lengths)))
    naive = [list(range(i, min(i + per, len(lengths)))) for i in range(0, len(lengths), per)]
    model = learner.load_model(cfg, "cpu")
    opt, sched = learner.make_optimizer(model, 1e-5, 0.0, [0.9, 0.999], 0, 100, "constant")

    def bare():
        bare_backward(model, batch, groups)
        model.zero_grad(set_to_none=True)

    def ours():
        learner.rl_step(model, opt, sched, batch, algo.compute_advantages(batch, acfg), acfg, cfg.train,
                        rcfg.temperature)

    results = {}
    # twice, interleaved: a shared CPU drifts
    for name, fn in (("bare", bare), ("learner.rl_step", ours)) * 2:
        fn()  # warm-up
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn()
        results[name] = min(results.get(name, 1e9), (time.perf_counter() - t0) / repeats)
    tokens = sum(lengths)
    print(f"\nbatch: {len(lengths)} of {n_trajs} trajectories can move the weights and are timed, "
          f"{tokens} real tokens, lengths {min(lengths)}..{max(lengths)}, "
          f"micro_batch_tokens {cfg.train.micro_batch_tokens} -> {len(groups)} micro-batches")
    for name, t in results.items():
        print(f"{name:>13}: {tokens / t:8.0f} tokens/s  ({t:.2f} s per batch)")
    print(f"     overhead: {results['learner.rl_step'] / results['bare'] - 1:+.1%} (target <= 10%)")
    print(f"      padding: {learner.padding_fraction(lengths, groups):.1%} token-budget packing vs "
          f"{learner.padding_fraction(lengths, naive):.1%} count-based batches of {per} (target <= 10%)")


def main():
    import argparse
    import config
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(ROOT / "configs" / "tiny.yaml"))
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--steps", type=int, default=3, help="RL steps for the time split (0 = skip)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--metrics",
                    help="print the time split of this finished run's metrics.jsonl instead of running")
    ap.add_argument("--modes", nargs="+", choices=["sync", "async"], default=["sync"],
                    help="train.mode(s) of the time split; two give the async vs sync step time")
    a = ap.parse_args()
    step_times = {}
    for mode in a.modes:
        out = tempfile.mkdtemp(prefix="bench_train_")
        cfg = config.load_config(a.config, [f"out_dir={out}", f"train.mode={mode}"] + a.set)
        if a.steps or a.metrics:
            print(f"\ntrain.mode {mode}")
            records = time_split(cfg, a.steps, a.metrics)
            steps = [r["time/step"] for r in records if r.get("phase") == "rl" and "time/step" in r][1:]
            step_times[mode] = sum(steps) / max(1, len(steps))
    if len(step_times) == 2:
        print(f"\nmean step wall time after the first: sync {step_times['sync']:.1f} s, async "
              f"{step_times['async']:.1f} s: async speed-up x{step_times['sync'] / step_times['async']:.2f}")
    if not a.metrics and a.repeats:  # a finished run's time split alone: no trajectories to collect, seconds
        throughput(cfg, a.repeats)


if __name__ == "__main__":
    main()
