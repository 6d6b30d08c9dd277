"""How well episode threads hide container time behind generation (and vice versa).

A scripted policy with a fixed generation latency per engine step (an ideally batched decoder:
every pending request is answered after `--latency` seconds) plays generated easy tasks in real
containers: each episode runs `--commands` bash calls of `--cmd`, then submits, then is graded.

Printed per thread count:
  episodes/min
  gen_s      time the engine was busy (one serial resource)
  env_s      container time (start + commands + grading + removal) summed over episodes / threads
  overlap    max(gen_s, env_s) / wall: 1.0 = the slower side fully hides the other one.
             (This is the issue's "wall / max(total gen, total env)" turned so that higher is
             better; with one thread gen and env alternate, so it is about max/(gen+env).)

    python bench/bench_rollout.py [--threads 1 4 8] [--episodes-per-thread 2]
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import env as E  # noqa: E402
from policy import ScriptedPolicy  # noqa: E402
import rollout as R  # noqa: E402
import generated_tasks as G  # noqa: E402

ENV_KEYS = ("reset_s", "env_s", "grade_s", "close_s")


def run(threads, episodes, latency, cmd, commands, tok, env):
    tasks = G.generate_easy_tasks(episodes, seed=threads)
    cfg = R.RolloutConfig(max_turns=commands + 2, max_tokens_per_turn=256, max_context=4096,
                          num_workers=threads, group_size=1, check_tokens=False)
    with ScriptedPolicy(tok, "fixed", latency_s=latency, commands=[cmd] * commands) as policy:
        t0 = time.perf_counter()
        trajs = R.collect(tasks, policy, env, cfg, progress=False)
        wall = time.perf_counter() - t0
        gen = policy.gen_busy_s
    bad = [t.finish_reason for t in trajs if t.finish_reason != "submitted"]
    if bad:
        raise RuntimeError(f"episodes did not finish cleanly: {bad}")
    env_s = sum(t.timings[k] for t in trajs for k in ENV_KEYS) / threads
    avg = {k: sum(t.timings[k] for t in trajs) / len(trajs) for k in ENV_KEYS + ("gen_s",)}
    return dict(threads=threads, episodes=len(trajs), wall=wall, per_min=60 * len(trajs) / wall,
                gen=gen, env=env_s, overlap=max(gen, env_s) / wall, avg=avg)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--episodes-per-thread", type=int, default=3)
    ap.add_argument("--latency", type=float, default=0.3, help="seconds per engine step")
    ap.add_argument("--cmd", default="sleep 0.$((RANDOM % 10)); echo ok",
                    help="the bash command each turn runs (random sleeps keep the threads out of lockstep)")
    ap.add_argument("--commands", type=int, default=3, help="bash calls per episode (then submit)")
    ap.add_argument("--warm", type=int, default=0, help="Env warm pool size (pre-started containers)")
    a = ap.parse_args()
    import tiny
    tok = tiny.train_tokenizer(tiny.default_corpus(), 4096)
    print(f"fixed-latency scripted policy: {a.latency}s per engine step, "
          f"{a.commands} x `{a.cmd}` + submit per episode")
    print(f"{'threads':>7} {'episodes':>8} {'wall_s':>7} {'ep/min':>7} {'gen_s':>6} {'env_s':>6} "
          f"{'overlap':>7}   per episode: reset / commands / grade / close / waiting for gen (s)")
    with E.Env(warm=a.warm) as env:
        run(1, 1, a.latency, a.cmd, 1, tok, env)  # warm-up: first container start, imports
        for n in a.threads:
            r = run(n, n * a.episodes_per_thread, a.latency, a.cmd, a.commands, tok, env)
            print(f"{r['threads']:>7} {r['episodes']:>8} {r['wall']:>7.1f} {r['per_min']:>7.1f} "
                  f"{r['gen']:>6.1f} {r['env']:>6.1f} {r['overlap']:>7.2f}   "
                  + " / ".join(f"{v:.2f}" for v in r["avg"].values()), flush=True)


if __name__ == "__main__":
    main()
