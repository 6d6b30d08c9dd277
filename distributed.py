"""Many GPUs, on one box or several: what train.py needs under torchrun (DDP or FSDP2), kept apart
so the loop stays readable. Every function is a no-op or the identity for a single process.

    torchrun --nproc-per-node 8 train.py --config configs/qwen3-full-8gpu.yaml
    torchrun --nnodes 2 --node-rank K --nproc-per-node 8 --master-addr NODE0 --master-port 29500 train.py ...

RANK (0..world-1) decides what exists once per run: the run directory's files, checkpoints, logs.
LOCAL_RANK (0..per-node-1) decides what exists once per machine: the GPU a rank uses, its engine's
placement, the copy of an error printed to that node's log.
"""
import contextlib
import os
import signal
import time
from pathlib import Path


@contextlib.contextmanager
def error_said_once():
    """A set-up error every rank meets alike (no GPU, a bad key, no Docker) is printed once per
    node, by its local rank 0; the node's other ranks exit with the same status, silently. Eight
    copies of one line above torchrun's own failure report hid the line: tests/test_readme.py runs
    the README's torchrun commands (one node, and two nodes) on a machine without GPUs and counts
    it in each node's output."""
    try:
        yield
    except SystemExit as e:
        if not isinstance(e.code, str) or int(os.environ.get("LOCAL_RANK", "0")) == 0:
            raise
        # this node's local rank 0 meets the same error and fails, and this node's torchrun then
        # stops this rank: that SIGTERM ends it quietly (exit 0), so torchrun's report names local
        # rank 0 alone (another node's torchrun cannot stop it: RANK 0 would not do). A rank whose
        # error its local rank 0 did not share is not stopped, and says it after the wait.
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
        time.sleep(30)
        raise


def unwrap(model):
    return model.module if hasattr(model, "module") else model


def full_state_dict(model) -> dict | None:
    """Gathered parameters (FSDP2 DTensors -> full tensors); plain models return their own."""
    sd = unwrap(model).state_dict()
    if any(type(v).__name__ == "DTensor" for v in sd.values()):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return sd


def sharded(model) -> bool:
    return any(type(p).__name__ == "DTensor" for p in model.parameters())


def load_optimizer_state(model, opt, sd: dict):
    """A checkpoint's trainer.pt optimizer state into opt: one process's or DDP's opt.state_dict(),
    or (written under FSDP2 before checkpoints were sharded) the gathered one keyed by name."""
    if all(isinstance(k, int) for k in sd.get("state", {})):  # opt.state_dict(): one process or DDP wrote it
        if sharded(model) and sd.get("state"):
            raise SystemExit("this checkpoint's optimizer state is unsharded (written without FSDP); "
                             "resume it with train.parallel: ddp or on one process")
        opt.load_state_dict(sd)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
    set_optimizer_state_dict(model, opt, sd, options=StateDictOptions(full_state_dict=True))


SHARDS = "dcp"  # in a torchrun checkpoint: torch.distributed.checkpoint's files, one a rank + .metadata

# the trainable weights only: LoRA's frozen base is model.path's, read again at a resume
_TRAINABLE = dict(ignore_frozen_params=True)


def _trainer_state(model, opts: dict, weights: bool = True) -> dict:
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)
    options = StateDictOptions(**_TRAINABLE)
    return {**({"model": get_model_state_dict(model, options=options)} if weights else {}),
            **{key: get_optimizer_state_dict(model, opt, options=options) for key, opt in opts.items()}}


def save_shards(path: Path, model, opts: dict) -> dict:
    """Write this rank's shard of the weights and of each optimizer in `opts` ({key: optimizer})
    into `path` with torch.distributed.checkpoint, every rank its own file at once: nothing is
    gathered (under FSDP2 a rank writes the DTensor shards it holds; under DDP the replicated
    tensors are shared out among the ranks). Collective. Returns {path under the checkpoint:
    sha256} of the files this rank wrote, for meta.json, so no one rank reads every shard back.
    tests/test_train.py::test_torchrun_two_ranks_move_in_step_and_resume_exactly"""
    import hashlib
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    dcp.save(_trainer_state(model, opts), checkpoint_id=path)
    mine = (sorted(path.glob(f"__{dist.get_rank()}_*"))
            + ([path / ".metadata"] if dist.get_rank() == 0 else []))
    digests = {}
    for f in mine:
        with open(f, "rb") as fh:
            digests[f"{path.name}/{f.name}"] = hashlib.file_digest(fh, "sha256").hexdigest()
    return digests


def load_shards(path: Path, model, opts: dict, weights: bool = True):
    """The weights (unless not `weights`) and each optimizer's state in `opts` ({key it was saved
    under: optimizer}) from save_shards' files, each rank reading the part it holds; the number of
    ranks and the parallel mode may differ from the run that wrote them (DCP reshards). Collective."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                         set_optimizer_state_dict)
    state = _trainer_state(model, opts, weights)
    dcp.load(state, checkpoint_id=path)  # in place; a key the files lack is an error
    options = StateDictOptions(**_TRAINABLE, strict=False)  # the frozen weights are not in the files
    if weights:
        set_model_state_dict(model, state["model"], options=options)
    for key, opt in opts.items():
        set_optimizer_state_dict(model, opt, state[key], options=options)


def local_weights(model) -> dict:
    """{name: this rank's part of the weight} (its shard under FSDP2), read without a collective."""
    return {n: t.to_local() if hasattr(t, "to_local") else t for n, t in unwrap(model).state_dict().items()}


def weights_fingerprint(model) -> list:
    """[float64 sum, sum of squares, sha256 of every weight's bytes in name order] of the full
    weights (what this rank's engine is given). Ranks in step agree on all three; the digest makes
    that bit for bit (the sums alone can miss a difference that cancels or rounds away). Hashing
    costs about what writing the checkpoint does. Collective under FSDP2."""
    import hashlib
    import torch
    s = torch.zeros(2, dtype=torch.float64)
    digest = hashlib.sha256()
    for name, p in unwrap(model).named_parameters():
        t = (p.full_tensor() if hasattr(p, "full_tensor") else p).detach()
        s += torch.stack([t.double().sum(), (t.double() ** 2).sum()]).cpu()
        digest.update(name.encode())
        digest.update(t.contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes())
    return s.tolist() + [digest.hexdigest()]


def broadcast_from_rank0(model):
    """Rank 0's weights and buffers into every rank's copy, in place, one tensor at a time.
    Collective."""
    import torch
    import torch.distributed as dist
    with torch.no_grad():
        for t in model.state_dict().values():
            dist.broadcast(t, src=0)


def init_distributed(device: str, timeout_min: float) -> tuple[int, int]:
    """(rank, world) under torchrun; (0, 1) otherwise. Every collective waits up to `timeout_min`
    (train.collective_timeout_min) before the run stops: torch's defaults (10 min for NCCL) end a
    run whose ranks finish their rollouts minutes apart, as 8B episodes of 360-600 s do
    (tests/test_gpu_path.py::test_the_collective_timeout_is_the_configs)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 1
    import datetime
    import torch
    import torch.distributed as dist
    if device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if device == "cuda" else "gloo",
                            timeout=datetime.timedelta(minutes=timeout_min))
    return dist.get_rank(), dist.get_world_size()


def check_shared_dirs(paths: list, world: int):
    """Stop every rank unless every rank sees the same `paths` (one filesystem, e.g. NFS, mounted on
    every node): rank 0 alone moves an old run aside, builds the tiny model and writes the
    checkpoints that every rank's engine and --resume then read; a node with its own copy of the
    directory would find them missing or stale
    (tests/test_train.py::test_nodes_that_see_different_run_dirs_stop_at_once). Rank 0 writes a
    probe with a fresh name into each; every rank looks for it. Collective."""
    if world == 1:
        return
    import secrets
    import socket
    import torch.distributed as dist
    name = from_rank0(f".probe-{secrets.token_hex(8)}", world)
    if dist.get_rank() == 0:
        for p in paths:
            (Path(p) / name).write_text("")
    dist.barrier()
    seen = gather((socket.gethostname(), [(str(p), (Path(p) / name).exists()) for p in paths]), world)
    dist.barrier()
    if dist.get_rank() == 0:
        for p in paths:
            (Path(p) / name).unlink()
    blind = [f"rank {r} on {host}: {p} does not hold what rank 0 wrote in {p0}"
             for r, (host, looked) in enumerate(seen)
             for (p, ok), (p0, _) in zip(looked, seen[0][1]) if not ok]
    if blind:
        raise SystemExit("the ranks do not share a filesystem (" + "; ".join(blind) + "). Put out_dir (and "
                         "model.path with model.build_tiny) on a filesystem every node mounts at the same "
                         "path, e.g. NFS.")


def engine_launch_kwargs() -> dict:
    """vLLM executor arguments for this process. Under torchrun every rank runs its own one-GPU
    engine: vLLM 0.32 would pick its single-process executor, which takes local rank 0 and switches
    every rank to cuda:0; "external_launcher" takes RANK/LOCAL_RANK from torchrun and the process
    group already there, as TRL's colocate mode and verl do (tests/test_gpu_path.py,
    test_two_ranks_run_independent_engines_on_their_own_devices)."""
    return ({"distributed_executor_backend": "external_launcher"}
            if int(os.environ.get("WORLD_SIZE", "1")) > 1 else {})


def check_engine_placement(engine_device: str, engine_local_rank: int, trainer_device: str):
    """Raise unless this rank's engine and trainer sit on this rank's device (cuda:LOCAL_RANK; on CPU
    the engine's local rank still tells which executor placed it)."""
    import torch
    local = int(os.environ.get("LOCAL_RANK", "0"))
    want = f"cuda:{local}" if trainer_device.startswith("cuda") else "cpu"
    trainer = f"cuda:{torch.cuda.current_device()}" if want.startswith("cuda") else trainer_device
    if (engine_device, engine_local_rank, trainer) != (want, local, want):
        raise RuntimeError(
            f"rank with LOCAL_RANK={local} expects engine and trainer on {want}; the engine is "
            f"on {engine_device} as local rank {engine_local_rank}, the trainer on {trainer}. "
            f"Under torchrun the engine needs distributed_executor_backend=external_launcher "
            f"(distributed.engine_launch_kwargs) and one visible GPU per rank.")


def wrap_parallel(model, cfg, device: str, compute_dtype=None):
    """DDP, or FSDP2 (fully_shard every decoder layer, then the root). FSDP2 gathers the fp32
    master weights as `compute_dtype` for forward/backward and reduces gradients in fp32."""
    import torch
    if cfg.train.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        return DDP(model, device_ids=[torch.cuda.current_device()] if device == "cuda" else None)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mp = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for m in model.modules():
        if type(m).__name__.endswith("DecoderLayer"):
            fully_shard(m, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    return model


def all_mean(values: list[float], world: int, weight: float = 1.0) -> list[float]:
    """Per-rank means -> the mean over all ranks' items, `weight` = this rank's item count (can differ)."""
    if world == 1:
        return values
    import torch
    import torch.distributed as dist
    t = torch.tensor([v * weight for v in values] + [weight], dtype=torch.float64,
                     device="cuda" if torch.cuda.is_available() else "cpu")
    dist.all_reduce(t)
    return (t[:-1] / t[-1].clamp(min=1e-12)).tolist()


def from_rank0(obj, world: int):
    """Rank 0's value on every rank: for decisions all ranks must take together."""
    if world == 1:
        return obj
    import torch.distributed as dist
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def world_size() -> int:
    import torch.distributed as dist
    return dist.get_world_size() if dist.is_initialized() else 1


def gather(obj, world: int) -> list:
    """Every rank's `obj`, in rank order ([obj] for a single process)."""
    if world == 1:
        return [obj]
    import torch.distributed as dist
    out = [None] * world
    dist.all_gather_object(out, obj)
    return out


def forward_count(model, n: int, op: str) -> int:
    """How many forwards to run so every rank runs the same number: under FSDP2 each forward is a
    collective (op "max": pad, "min": cut); otherwise this rank's own `n`."""
    import torch
    import torch.distributed as dist
    if not (dist.is_initialized() and sharded(model)):
        return n
    t = torch.tensor([n], device=next(model.parameters()).device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.MIN)
    return int(t)


def check_in_step(model, world: int, step: int) -> list:
    """Every rank's weight fingerprint; raises if they differ (a missed all-reduce or a skipped update
    would otherwise train on silently). Collective: every rank calls it."""
    fps = gather(weights_fingerprint(model), world)
    if any(f != fps[0] for f in fps):
        raise RuntimeError(f"step {step}: the ranks hold different weights (float64 sum, sum of squares, "
                           f"sha256 per rank: {fps})")
    return fps
