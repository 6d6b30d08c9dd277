"""Run by tests/test_gpu_path.py under `torchrun --nproc-per-node 2` (gloo, CPU): the process group
starts as train.setup starts it, from a config with `--set` overrides; rank 1 then arrives at a
barrier `late_s` seconds after rank 0. Writes <out>/rank<r>.json: how long that rank's barrier
waited and the error that ended it, if any.

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/torchrun_collectives.py OUT LATE_S KEY=VALUE...
"""
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import config  # noqa: E402
import distributed  # noqa: E402


def main(out: str, late_s: float, overrides: list[str]):
    cfg = config.load_config(Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml", overrides)
    rank, _ = distributed.init_distributed("cpu", cfg.train.collective_timeout_min)
    if rank == 1:
        time.sleep(late_s)
    t0, error = time.time(), None
    try:
        torch.distributed.barrier()
    except Exception as e:  # noqa: BLE001 -- gloo's timeout is a RuntimeError today; its type is not the point
        error = f"{type(e).__name__}: {e}"
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / f"rank{rank}.json").write_text(json.dumps({"waited_s": time.time() - t0, "error": error}))
    os._exit(0)  # a group whose barrier timed out cannot be torn down collectively


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), sys.argv[3:])
