"""Run by tests/test_gpu_path.py under `torchrun --nproc-per-node 2` (gloo, CPU): every rank starts
its own vLLM engine through train.make_engine (the path train.run takes), checks where vLLM placed
it, loads rank-specific weights into it, generates, and compares the engine's log-probs with its
own trainer's and with the other rank's. Writes <out>/rank<r>.json.

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/torchrun_engines.py MODEL OUT
"""
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import logprobs  # noqa: E402
import config  # noqa: E402
import distributed  # noqa: E402
from engines import Sampling  # noqa: E402
from policy import sync_check  # noqa: E402
import train  # noqa: E402


def main(model_path: str, out: str):
    cfg = config.load_config(Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml",
                             [f"model.path={model_path}", "model.build_tiny=false",
                              "engine.max_model_len=256"])
    rank, world = distributed.init_distributed("cpu", cfg.train.collective_timeout_min)
    engine = train.make_engine(cfg, model_path, "cpu")
    placement = engine.placement()
    distributed.check_engine_placement(*placement, "cpu")
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    torch.manual_seed(100 + rank)  # each rank trains to different weights
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1 + 0.2 * torch.randn_like(p))
    engine.update_weights(model.named_parameters())
    prompt = list(range(5, 25))
    comp = engine.generate([prompt], Sampling(temperature=1.0, max_tokens=12, seed=7))[0]
    seq = prompt + comp.token_ids
    with torch.no_grad():
        lp, _ = logprobs.token_logprobs(model(input_ids=torch.tensor([seq])).logits, torch.tensor([seq]))
    everyone = distributed.gather((seq, lp[0].tolist()), world)  # every rank's sequence + trainer log-probs
    # the engine against each rank's trainer: its own must match, the other's (other weights) must not
    gaps = [sync_check(engine, [s], [torch.tensor(t)])["sync/max_abs_logprob_gap"] for s, t in everyone]
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / f"rank{rank}.json").write_text(json.dumps({
        "rank": rank, "placement": list(placement), "tokens": comp.token_ids, "gaps": gaps}))
    torch.distributed.barrier()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
