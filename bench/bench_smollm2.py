"""Benchmark SmolLM2-135M-Instruct (configs/smollm2-cpu.yaml) on this machine: generation, the
trainer, and where a training step's time goes.

    python scripts/get_smollm2.py                      # the model, once (README "A real model on CPU")
    python bench/bench_smollm2.py --no-warmup          # 1. and 2. (the figures of docs/results.md)
    python bench/bench_smollm2.py --metrics runs/smollm2-cpu/metrics.jsonl   # 3. of a finished run
    python bench/bench_smollm2.py --only generation --concurrency 1 16 64 --engines full lora

1. Generation: the project's own engine (train.make_engine: vLLM CPU, as training starts it)
   generating at 1, 16 and 64 concurrent sequences from real first prompts (system prompt, tools
   block, a generated task), seeded, at the config's temperature and max_tokens_per_turn. Prints
   prompt and generated token counts, generated tokens/s, and the time to prefill those prompts
   (max_tokens 1) with and without the ~300-token tools block. With --engines lora the same on
   an engine with LoRA enabled and an adapter loaded (how a LoRA run generates).
2. Trainer: on real trajectories (oracle and garbage episodes in real containers, as in
   bench/bench_train.py), tokens/s of learner.rl_step (token-budget micro-batches, the IPA loss,
   AdamW) against a bare transformers step on the same micro-batches (logits, cross-entropy,
   loss.backward(), AdamW step), for full fine-tuning and LoRA, with the peak resident memory of
   each phase. With --tools both, learner.rl_step again on the same episodes rendered without
   the tools block (rollout.tools_in_prompt false): seconds per step before/after.
3. With --metrics: the share of each RL step's wall time in rollout (generation, environment),
   train, sync, eval and checkpoint, from a train.py run's metrics.jsonl.
Figures are wall-clock on a possibly shared machine: the load average is printed beside them.
"""
import argparse
import copy
import gc
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

import algo  # noqa: E402
import config  # noqa: E402
import learner  # noqa: E402
from chat import ChatFormat, TOOLS  # noqa: E402
from engines import Sampling  # noqa: E402
from bench_train import bare_backward, scripted_batch  # noqa: E402  (bench/ is this script's directory)


def load() -> str:
    return "load average " + ", ".join(f"{x:.1f}" for x in os.getloadavg())


def say(msg: str):
    print(f"# {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


class PeakRSS:
    """Peak resident memory of this process while the block runs (sampled every 50 ms): the
    lifetime peak that getrusage gives would hide a lighter phase after a heavier one."""

    def __enter__(self):
        self.start = self.peak = self._rss()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._watch, daemon=True)
        self._t.start()
        return self

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _watch(self):
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, self._rss())

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self._rss())

    def __str__(self):
        return f"peak RSS {self.peak / 2**30:.2f} GiB ({self.start / 2**30:.2f} GiB before)"


# -----------------------------------------------------------------------------------------------
# 1. generation


def first_prompts(cfg, tok, n: int, tools: bool) -> list[list[int]]:
    """The token ids an episode's first turn is generated from, for n generated tasks."""
    from generated_tasks import generate_easy_tasks
    rcfg = config.rollout_cfg(cfg)
    chat = ChatFormat(tok, tools=TOOLS if tools else None, template_kwargs=rcfg.chat_template_kwargs)
    return [chat.prompt_ids([{"role": "system", "content": rcfg.system_prompt},
                             {"role": "user", "content": t.instruction}])
            for t in generate_easy_tasks(n, seed=1)]


def fresh_adapter(cfg, out: Path) -> Path:
    """A LoRA adapter of the config's shape as peft initialises it (what a LoRA run's first sync loads)."""
    from peft import LoraConfig, get_peft_model  # optional: only --engines lora needs it
    from transformers import AutoModelForCausalLM
    m = cfg.model
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(m.path), LoraConfig(
        r=m.lora_rank, lora_alpha=m.lora_alpha, target_modules=m.lora_target_modules, task_type="CAUSAL_LM"))
    model.save_pretrained(out)
    return out


def generation(cfg, tok, concurrency: list[int], max_tokens: int, lora: bool):
    import train
    cfg = copy.deepcopy(cfg)
    cfg.model.lora = lora
    prompts = {tools: first_prompts(cfg, tok, max(concurrency), tools) for tools in (True, False)}
    say(f"starting the vLLM engine ({'LoRA' if lora else 'full'})")
    with PeakRSS() as mem:  # the engine's weights and KV space (engine.cpu_kvcache_gb), and its generating
        engine = train.make_engine(cfg, cfg.model.path, "cpu")
        if lora:
            engine.load_lora(fresh_adapter(cfg, Path(tempfile.mkdtemp(prefix="bench_smollm2_lora_"))), 1)
        temp = config.rollout_cfg(cfg).temperature
        engine.generate(prompts[True][:1], Sampling(temperature=temp, max_tokens=4, seed=0))  # warm-up
        name = "vLLM CPU, LoRA adapter loaded" if lora else "vLLM CPU, full weights"
        print(f"\n1. generation ({name}; torch threads {torch.get_num_threads()})")
        for n in concurrency:
            # a weight sync resets the prefix cache before every rollout: each measurement starts from empty
            row = []
            for tools in (True, False):
                engine.reset_prefix_cache()
                t0 = time.perf_counter()
                engine.generate(prompts[tools][:n], Sampling(temperature=temp, max_tokens=1, seed=0))
                row.append((sum(map(len, prompts[tools][:n])) // n, time.perf_counter() - t0))
            engine.reset_prefix_cache()
            say(f"generating {n} x up to {max_tokens} tokens")
            t0, c0 = time.perf_counter(), time.process_time()
            outs = engine.generate(prompts[True][:n],
                                   Sampling(temperature=temp, max_tokens=max_tokens, seed=0))
            dt, cpu = time.perf_counter() - t0, time.process_time() - c0
            gen = sum(len(c.token_ids) for c in outs)
            print(f"{n:>3} sequences: {gen:>5} tokens generated ({gen / n:.0f} a sequence) in {dt:6.1f} s: "
                  f"{gen / dt:6.1f} tokens/s ({gen / cpu:6.1f} a CPU s) | prefill of {n} first prompts: "
                  f"{row[0][1]:5.2f} s at {row[0][0]} tokens (tools block), "
                  f"{row[1][1]:5.2f} s at {row[1][0]} (none) | {load()}", flush=True)
    print(f"engine: {mem}, KV space {os.environ.get('VLLM_CPU_KVCACHE_SPACE') or cfg.engine.cpu_kvcache_gb} "
          "GiB (engine.cpu_kvcache_gb)", flush=True)
    del engine
    gc.collect()


# -----------------------------------------------------------------------------------------------
# 2. the trainer


def time_fns(fns: dict, repeats: int, warmup: bool) -> dict:
    """{name: (min wall s, min CPU s of this process)} per call of each fn, interleaved so a
    drifting load hits all alike; after one untimed call of each with `warmup` (the first AdamW
    step allocates its state). CPU seconds move far less than wall seconds with the load of a
    shared machine, so comparisons between fns read better in them."""
    for name, fn in fns.items() if warmup else ():
        say(f"warm-up: {name}")
        fn()
    best = {}
    for i in range(repeats):
        for name, fn in fns.items():
            say(f"timing {name} ({i + 1}/{repeats})")
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            old = best.get(name, (float("inf"), float("inf")))
            best[name] = (min(old[0], wall), min(old[1], cpu))
    return best


def trainer(cfg, batch, batch_no_tools, repeats: int, warmup: bool, lora: bool):
    cfg = copy.deepcopy(cfg)
    cfg.model.lora = lora
    acfg, temp = config.algo_cfg(cfg), config.rollout_cfg(cfg).temperature
    kind = f"LoRA r={cfg.model.lora_rank}" if lora else "full fine-tuning"
    with PeakRSS() as mem:
        model = learner.load_model(cfg, "cpu")
        params = [p for p in model.parameters() if p.requires_grad]
        opt, sched = learner.make_optimizer(model, cfg.train.lr, 0.0, [0.9, 0.999], 0, 100, "constant")
        bare_opt = torch.optim.AdamW(params, lr=cfg.train.lr, foreach=True)
        lengths = batch.attention_mask.sum(1).tolist()
        groups = learner.pack_by_tokens(lengths, cfg.train.micro_batch_tokens)

        def bare():
            bare_opt.zero_grad(set_to_none=True)
            bare_backward(model, batch, groups)
            bare_opt.step()

        def ours(b=batch):
            learner.rl_step(model, opt, sched, b, algo.compute_advantages(b, acfg), acfg, cfg.train, temp)

        fns = {f"bare transformers ({kind})": bare, f"learner.rl_step ({kind})": ours}
        if batch_no_tools is not None:
            fns[f"learner.rl_step ({kind}), no tools block"] = lambda: ours(batch_no_tools)
        best = time_fns(fns, repeats, warmup)
    tokens = sum(lengths)
    trainable = sum(p.numel() for p in params)
    print(f"\n2. trainer, {kind}: {trainable:,} trainable parameters, {len(lengths)} trajectories, "
          f"{tokens} tokens (lengths {min(lengths)}..{max(lengths)}), "
          f"micro_batch_tokens {cfg.train.micro_batch_tokens} -> "
          f"{len(groups)} micro-batches, padding {learner.padding_fraction(lengths, groups):.1%}, "
          f"torch threads {torch.get_num_threads()}")
    names = list(best)
    for name in names[:2]:
        (wall, cpu) = best[name]
        print(f"{name:>50}: {tokens / wall:6.1f} tokens/s ({wall:6.1f} s a step; {cpu:6.1f} CPU s, "
              f"{tokens / cpu:6.1f} tokens a CPU s)")
    (w0, c0), (w1, c1) = best[names[0]], best[names[1]]
    print(f"{'learner overhead':>50}: {w1 / w0 - 1:+.1%} wall, {c1 / c0 - 1:+.1%} CPU   {mem} | {load()}")
    if batch_no_tools is not None:
        t2 = sum(batch_no_tools.attention_mask.sum(1).tolist())
        (w2, c2) = best[names[2]]
        print(f"{names[2]:>50}: {t2 / w2:6.1f} tokens/s ({w2:6.1f} s a step; {c2:6.1f} CPU s) "
              f"on {t2} tokens: step {w2 / w1 - 1:+.1%} wall, {c2 / c1 - 1:+.1%} CPU", flush=True)


# -----------------------------------------------------------------------------------------------
# 3. where a step's time goes


def step_split(metrics: Path):
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    steps = [r for r in records if r.get("phase") == "rl"]
    if not steps:
        raise SystemExit(f"{metrics}: no RL step records (phase 'rl'); "
                         "is it a train.py run's metrics.jsonl?")
    parts = ["generation", "env", "train", "sync", "eval", "checkpoint"]
    print(f"\n3. where each RL step's wall time went ({metrics}; rollout = generation + env)")
    print(f"{'step':>4} {'step s':>7} " + " ".join(f"{p:>10}" for p in parts) + f" {'other':>7}")
    totals = dict.fromkeys(parts + ["step"], 0.0)
    for r in steps:
        step = r["time/step"]
        vals = [r.get(f"time/{p}", 0.0) for p in parts]
        for p, v in zip(parts, vals):
            totals[p] += v
        totals["step"] += step
        print(f"{r['step']:>4} {step:>7.1f} " + " ".join(f"{v / step:>10.0%}" for v in vals)
              + f" {1 - sum(vals) / step:>7.0%}")
    print(f" all {totals['step']:>7.1f} " + " ".join(f"{totals[p] / totals['step']:>10.0%}" for p in parts)
          + f" {1 - sum(totals[p] for p in parts) / totals['step']:>7.0%}")
    print("held-out eval records (those at a step's end are inside that step's time): "
          + ", ".join(f"step {r['step']} {r['time/eval']:.0f} s"
                      for r in records if r.get("phase") == "eval"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(ROOT / "configs" / "smollm2-cpu.yaml"))
    ap.add_argument("--set", action="append", default=[], help="config override, as train.py's --set")
    ap.add_argument("--only", nargs="+", choices=["generation", "trainer"], default=["generation", "trainer"])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--max-tokens", type=int, default=None, help="default: rollout.max_tokens_per_turn")
    ap.add_argument("--engines", nargs="+", choices=["full", "lora"], default=["full", "lora"])
    ap.add_argument("--tasks", type=int, default=1,
                    help="generated tasks of the trainer's batch (x2 policies x group)")
    ap.add_argument("--group", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=1,
                    help="timed trainer steps of each kind (the min is printed)")
    ap.add_argument("--no-warmup", action="store_true",
                    help="time the first trainer steps too (a loaded machine)")
    ap.add_argument("--modes", nargs="+", choices=["full", "lora"], default=["full", "lora"],
                    help="what the trainer trains")
    ap.add_argument("--tools", choices=["on", "both"], default="both",
                    help="both: also time learner.rl_step on the episodes without the tools block")
    ap.add_argument("--metrics", type=Path,
                    help="only 3.: the step-time split of this train.py run's metrics.jsonl")
    a = ap.parse_args(argv)
    if a.metrics:
        if not a.metrics.is_file():
            raise SystemExit(f"--metrics {a.metrics}: no such file "
                             "(a train.py run writes runs/<run_name>/metrics.jsonl)")
        step_split(a.metrics)
        return
    cfg = config.load_config(a.config, a.set)
    if not Path(cfg.model.path, "config.json").exists():
        raise SystemExit(f"model.path {cfg.model.path}: no model there; "
                         "run `python scripts/get_smollm2.py` first")
    tok = AutoTokenizer.from_pretrained(cfg.model.path)
    print(f"SmolLM2 bench, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{os.cpu_count()} CPUs, {load()}")
    if "trainer" in a.only:
        say(f"collecting {a.tasks} tasks x 2 policies x {a.group} scripted episodes in containers")
        # with the block whatever the config says (smollm2-cpu.yaml drops it after SFT): --tools names it
        with_block = config.load_config(a.config, a.set + ["rollout.tools_in_prompt=true"])
        batch, n = scripted_batch(with_block, tok, a.tasks, a.group)
        no_tools = None
        if a.tools == "both":
            cfg_nt = config.load_config(a.config, a.set + ["rollout.tools_in_prompt=false"])
            no_tools, _ = scripted_batch(cfg_nt, tok, a.tasks, a.group)
        for mode in a.modes:
            trainer(cfg, batch, no_tools, a.repeats, not a.no_warmup, lora=mode == "lora")
            gc.collect()  # the model and optimizer of this mode, before the next loads
    if "generation" in a.only:
        for kind in a.engines:
            generation(cfg, tok, a.concurrency, a.max_tokens or config.rollout_cfg(cfg).max_tokens_per_turn,
                       lora=kind == "lora")


if __name__ == "__main__":
    main()
