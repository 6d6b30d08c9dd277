"""Run by tests/test_gpu_path.py under `torchrun --nproc-per-node 2` (gloo, CPU): the process group
starts as train.setup starts it, from a config with `--set` overrides, then one of:

  barrier OUT LATE_S KEY=VALUE...   rank 1 reaches a barrier LATE_S seconds after rank 0; each rank
                                    writes how long its barrier waited and the error that ended it
  load OUT MODEL0 MODEL1            learner.load_model with model.path MODEL0 on rank 0 and MODEL1 on
                                    rank 1; each rank writes its weights' fingerprint

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/torchrun_collectives.py MODE OUT ...
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

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"


def barrier(out: Path, late_s: float, overrides: list[str]):
    cfg = config.load_config(TINY, overrides)
    rank, _ = distributed.init_distributed("cpu", cfg.train.collective_timeout_min)
    if rank == 1:
        time.sleep(late_s)
    t0, error = time.time(), None
    try:
        torch.distributed.barrier()
    except Exception as e:  # noqa: BLE001 -- gloo's timeout is a RuntimeError today; its type is not the point
        error = f"{type(e).__name__}: {e}"
    (out / f"rank{rank}.json").write_text(json.dumps({"waited_s": time.time() - t0, "error": error}))
    os._exit(0)  # a group whose barrier timed out cannot be torn down collectively


def load(out: Path, model0: str, model1: str):
    import learner
    rank, world = distributed.init_distributed("cpu", config.TrainConfig().collective_timeout_min)
    cfg = config.load_config(TINY, [f"model.path={model0 if rank == 0 else model1}", "model.build_tiny=false",
                                    "model.lora=false"])
    model = learner.load_model(cfg, "cpu")
    (out / f"rank{rank}.json").write_text(json.dumps({"fingerprint": distributed.weights_fingerprint(model)}))
    torch.distributed.barrier()


if __name__ == "__main__":
    mode, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    if mode == "barrier":
        barrier(out, float(sys.argv[3]), sys.argv[4:])
    else:
        load(out, sys.argv[3], sys.argv[4])
