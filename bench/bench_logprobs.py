"""Peak memory and time of the trainer's token log-probs + backward at a real vocabulary size.

    python bench/bench_logprobs.py                        # T = 8192 chunked; the full-logits way at T <= 2048
    python bench/bench_logprobs.py --T 4096 --modes full chunked
    python bench/bench_logprobs.py --T 2048 --V 262144 --hidden 640 --modes chunked --bf16   # Gemma 3's head

B x T x V = 1 x T x 151936 (Qwen3's vocabulary) with a 1-layer, 64-wide (--hidden) Qwen3 so the
output head dominates. "full": model(...).logits then logprobs.token_logprobs (what
learner.optimizer_step did: [B,T,V] logits plus the blocks autograd keeps for backward).
"chunked": learner.model_logprobs (hidden states through the head in blocks made again in
backward, logprobs.linear_token_logprobs). Each case runs in a fresh process, twice; time = the
second's; peak = the process's max RSS minus its RSS before the first forward (its gradients
included).
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def one(mode: str, T: int, V: int, bf16: bool, hidden: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config
    import logprobs
    import learner
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=V, hidden_size=hidden, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=1, num_key_value_heads=1, head_dim=64, tie_word_embeddings=False,
                      max_position_embeddings=T)
    model = AutoModelForCausalLM.from_config(cfg).float()
    if bf16:
        model.forward = torch.autocast("cpu", dtype=torch.bfloat16)(model.forward)
    ids = torch.randint(0, V, (1, T))
    base = rss_mb()
    for _ in range(2):  # the second call's time: the first also pays for first touches of its buffers
        t0 = time.perf_counter()
        if mode == "full":
            lp, _ = logprobs.token_logprobs(model(input_ids=ids, use_cache=False).logits, ids)
        else:
            lp, _ = learner.model_logprobs(model, ids)
        lp.sum().backward()
        dt = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {"mode": mode, "T": T, "V": V, "bf16": bf16, "hidden": hidden, "peak_mb": peak - base,
            "time_s": dt}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--T", type=int, nargs="+", default=[1024, 2048, 8192])
    ap.add_argument("--V", type=int, default=151936)
    ap.add_argument("--modes", nargs="+", default=["full", "chunked"])
    ap.add_argument("--max-full-T", type=int, default=2048,
                    help="skip the full-logits way above this T (memory)")
    ap.add_argument("--bf16", action="store_true", help="compute under bf16 autocast, as on a GPU")
    ap.add_argument("--hidden", type=int, default=64, help="the head's width (Gemma 3 270M: 640)")
    ap.add_argument("--one", nargs=2, metavar=("MODE", "T"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one[0], int(a.one[1]), a.V, a.bf16, a.hidden)))
        return
    print(f"{'mode':>8} {'B x T x V':>18} {'peak MB':>9} {'time s':>7}")
    for T in a.T:
        for mode in a.modes:
            if mode == "full" and T > a.max_full_T:
                print(f"{mode:>8} {f'1 x {T} x {a.V}':>18}   skipped (--max-full-T {a.max_full_T})")
                continue
            r = subprocess.run([sys.executable, __file__, "--one", mode, str(T), "--V", str(a.V),
                                "--hidden", str(a.hidden)]
                               + (["--bf16"] if a.bf16 else []), capture_output=True, text=True, check=True)
            res = json.loads(r.stdout.strip().splitlines()[-1])
            print(f"{mode:>8} {f'1 x {T} x {a.V}':>18} {res['peak_mb']:>9.0f} {res['time_s']:>7.1f}")


if __name__ == "__main__":
    main()
