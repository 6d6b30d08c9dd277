"""The run directory, as train.py writes it: checkpoints that survive a kill, metrics, curves, summary.

    runs/<name>/checkpoints/step_<N>/{model/, trainer.pt, meta.json}   latest -> step_<N>
        and during SFT sft_<N>/ alike (sft.checkpoint_every), removed once step_000000 is saved
        under torchrun: {dcp/ (each rank's shard of weights and optimizer), trainer.pt, meta.json},
        and model/ at the run's last step
    runs/<name>/metrics.jsonl  *trajectories*.jsonl  (tb/ with TensorBoard)  curves.png  summary.txt

A run directory is never clobbered and has one writer (claim_run_dir, RunLock: writer.lock).
meta.json holds a sha256 per checkpoint file and the size and sha256 of every *.jsonl log when
the checkpoint was saved: a resume (resume_checkpoint) takes the newest checkpoint whose files
and logs still match and cuts the logs back to those sizes, so no row is lost or appears twice.
A checkpoint that cannot be written (a full disk) leaves nothing behind and the ones before it whole.
"""
import errno
import fcntl
import hashlib
import json
import math
import os
import random
import re
import shutil
import socket
import sys
import time
from pathlib import Path


# -----------------------------------------------------------------------------------------------
# the run directory: never clobbered, moved aside (never deleted) to start over


LOCK = "writer.lock"  # in the run directory: the pid and host of the process writing it


class RunLock:
    """The one process writing a run directory: a POSIX lock on <out>/writer.lock, which records
    its pid and host. The kernel drops the lock when that process ends however it ends (SIGKILL
    too), so a lock file left by a dead process is free to take; the file itself is never deleted
    (deleting it would let a second writer lock a new file while the first holds the old one).
    tests/test_rundir.py::test_a_second_process_on_a_run_is_refused_naming_the_writer"""

    def __init__(self, out: Path):
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / LOCK
        self.fh = open(self.path, "a+")
        try:
            fcntl.lockf(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self.fh.close()
            raise SystemExit(f"{out} is being written by {writer(out)}: a second process would interleave "
                             f"its records and checkpoints with that one's. Wait for it to end or stop it, "
                             f"or set another run_name / out_dir.") from None
        self.fh.truncate(0)
        self.fh.write(f"{os.getpid()} {socket.gethostname()}\n")
        self.fh.flush()

    def close(self):
        self.fh.close()  # releases the lock


def writer(out: Path) -> str:
    """Who holds out's lock, as its lock file names it."""
    try:
        pid, host = (out / LOCK).read_text().split()
    except (OSError, ValueError):
        return "another process (its pid is not written yet)"
    return f"process {pid}" + ("" if host == socket.gethostname() else f" on {host}")


def live_writer(out: Path) -> int | None:
    """The pid out's lock file names when that process is alive on this host and started before the
    file was written (a pid reused by a later process is not its writer): for a status display that
    must not take the lock, which a writer starting at that moment would then find held.
    tests/test_compare_algos.py::test_status_says_where_each_run_stands_and_runs_nothing"""
    try:
        pid, host = (out / LOCK).read_text().split()
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        written = (out / LOCK).stat().st_mtime
    except (OSError, ValueError, StopIteration):
        return None
    # field 22, counted after the parenthesised command name (which may hold spaces)
    started = boot + int(stat.rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
    return int(pid) if host == socket.gethostname() and started <= written + 1 else None


def checkpoints(ckpt_root: Path) -> list[Path]:
    """The checkpoints in ckpt_root, oldest first: SFT's (sft_<N>), then RL's (step_<N>, step_000000
    the SFT-only start, saved after the last SFT step)."""
    return sorted(ckpt_root.glob("sft_*")) + sorted(ckpt_root.glob("step_*"))


def _holds_run(out: Path) -> bool:
    return out.is_dir() and any(p.name != LOCK for p in out.iterdir())


def claim_run_dir(out: Path, resume: bool, restart: bool) -> RunLock:
    """Lock `out` for this process (RunLock; a second writer is refused naming the first), before
    anything is written to it, in one process of the run (train.py: rank 0). A directory holding
    a run is continued with --resume, moved to <out>.<date-time> with --restart (also by --resume
    when it holds no checkpoint), and otherwise refused.
    tests/test_rundir.py::test_an_existing_run_is_refused_or_moved_aside_never_clobbered"""
    if resume and restart:
        raise SystemExit("--resume continues the run in out_dir and --restart starts it over: "
                         "pass one of them")
    ckpts = checkpoints(out / "checkpoints")
    if _holds_run(out) and not (resume or restart):  # refused without writing anything
        metrics = out / "metrics.jsonl"
        held = [f"{len(metrics.read_text().splitlines())} metrics records" if metrics.exists()
                else "no metrics",
                f"checkpoints up to {ckpts[-1].name}" if ckpts else "no checkpoint"]
        raise SystemExit(f"{out} already holds a run ({', '.join(held)}). Pass --resume to continue it from "
                         f"its latest checkpoint, or --restart to start over (the old run is moved to "
                         f"{out}.<date-time>, nothing is deleted), or set another run_name / out_dir.")
    lock = RunLock(out)
    ckpts = checkpoints(out / "checkpoints")  # again, now that no one else writes
    if not _holds_run(out) or (resume and ckpts):
        return lock
    aside = out.with_name(f"{out.name}.{time.strftime('%Y%m%d-%H%M%S')}")
    while aside.exists():
        aside = aside.with_name(aside.name + "x")
    os.rename(out, aside)  # the lock moves with it, held until the new directory's is
    try:
        new = RunLock(out)
    finally:
        lock.close()
    why = f"--resume found no checkpoint in {out / 'checkpoints'}" if resume else "--restart"
    print(f"{why}: the old run is now {aside}; starting over in {out}", file=sys.stderr)
    return new


# -----------------------------------------------------------------------------------------------
# checkpoints: tmp dir -> fsync -> rename, then an atomically replaced `latest` pointer


def _fsync_tree(path: Path):
    for p in sorted(path.rglob("*")) + [path]:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _prefix_sha256(path: Path, size: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while size > 0 and (chunk := f.read(min(size, 1 << 20))):
            h.update(chunk)
            size -= len(chunk)
    return h.hexdigest()


def log_digests(out: Path) -> dict:
    """{name: {"size", "sha256"}} of each *.jsonl log of the run directory (every log is appended
    to, never rewritten, so a later checkpoint's digest covers a longer prefix of the same bytes)."""
    return {p.name: {"size": (n := p.stat().st_size), "sha256": _prefix_sha256(p, n)}
            for p in sorted(out.glob("*.jsonl"))}


def _log_problem(out: Path, logs: dict) -> str | None:
    """What keeps the run's logs from being the ones checkpoint meta `logs` recorded: one cut short
    (a resume from it would lose the records past the cut) or changed before the recorded size."""
    for name, rec in logs.items():
        # a checkpoint saved before the digests holds sizes only
        size, digest = (rec, None) if isinstance(rec, int) else (rec["size"], rec["sha256"])
        path = out / name
        held = path.stat().st_size if path.exists() else 0
        if held < size:
            return (f"{name} holds {held} bytes, {size} when it was saved: cut short, it lost records this "
                    f"checkpoint's steps wrote")
        if digest and _prefix_sha256(path, size) != digest:
            return f"{name}'s first {size} bytes differ from the ones recorded when it was saved (rewritten)"
    return None


def _write_atomic(path: Path, text: str):
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fd = os.open(path.parent, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def _disk_full(e: BaseException | None, where: Path) -> bool:
    """Whether error e (or one it was raised from) says the disk is full, or the disk holding
    `where` has next to nothing left: torch.save reports a full disk as "unexpected pos", never ENOSPC."""
    while e is not None:
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT) or re.search(
                r"No space left|Disk quota exceeded|os error (28|122)\b", str(e)):
            return True
        e = e.__cause__ or e.__context__
    usage = shutil.disk_usage(where)
    return usage.free < min(64 << 20, usage.total // 20)


def checkpoint_tmp(ckpt_root: Path, step: int, kind: str = "step") -> Path:
    """The empty directory <kind>_<step>'s checkpoint is written into before save_checkpoint renames
    it: under torchrun rank 0 makes it and every rank writes its shards there first."""
    ckpt_root.mkdir(parents=True, exist_ok=True)
    tmp = ckpt_root / f".tmp-{kind}_{step:06d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    return tmp


def save_checkpoint(ckpt_root: Path, step: int, write_model, state: dict, keep_last: int,
                    tmp: Path | None = None, hashed: dict | None = None, kind: str = "step") -> Path:
    """Write step_<N>/ (model/ in HF format + trainer.pt) atomically, point `latest` at it, keep
    the last K and step 0. kind "sft" writes sft_<N>/, an SFT checkpoint, alike; the last K of those
    are kept until a step_ checkpoint is saved, which supersedes them all.

    `write_model(dir)` saves the model or adapter (plus tokenizer) loadable as is by
    transformers / peft / vLLM; None writes no model/ (a torchrun checkpoint holds its weights in
    the dcp/ shards its ranks wrote into `tmp`, from checkpoint_tmp, with the sha256 of each file
    in `hashed`, computed by the rank that wrote it). A kill at any moment leaves `latest` naming
    a complete checkpoint. meta.json records each file's sha256 and the sizes and sha256 of the
    run's logs (the *.jsonl beside checkpoints/), which resume_checkpoint checks and cuts them
    back to: write a step's records before its checkpoint, so a kill between the two cannot lose
    them. A write that fails removes what it wrote, and on a full disk ends the run with one line
    saying so: the checkpoints before it are untouched
    (tests/test_rundir.py::test_a_full_disk_stops_the_run_in_one_line_and_keeps_the_last_checkpoint).
    """
    import torch
    final = ckpt_root / f"{kind}_{step:06d}"
    try:
        tmp = tmp or checkpoint_tmp(ckpt_root, step, kind)
        if write_model is not None:
            write_model(tmp / "model")
        torch.save(state, tmp / "trainer.pt")
        hashed = hashed or {}
        sha = {rel: hashed.get(rel) or _sha256(p) for p in sorted(tmp.rglob("*")) if p.is_file()
               for rel in [str(p.relative_to(tmp))]}
        (tmp / "meta.json").write_text(json.dumps({"step": step, "time": time.time(), "sha256": sha,
                                                   "logs": log_digests(ckpt_root.parent)}))
        _fsync_tree(tmp)
        if final.exists():  # re-saving a step after a resume: the old copy is equivalent
            shutil.rmtree(final)
        os.rename(tmp, final)
        _write_atomic(ckpt_root / "latest", final.name + "\n")
    except Exception as e:  # not a KeyboardInterrupt: a kill leaves tmp, which the next save sweeps
        checkpoint_failed(ckpt_root, tmp or ckpt_root / f".tmp-{kind}_{step:06d}-{os.getpid()}", final, e)
    # step 0 (the SFT-only start, what every RL gain is measured against) stays whatever keep_last
    # says: tests/test_train.py::test_keep_last_keeps_the_sft_only_start
    for old in sorted(ckpt_root.glob(f"{kind}_*"))[:-keep_last] if keep_last > 0 else []:
        if old != final and old.name != "step_000000":
            shutil.rmtree(old, ignore_errors=True)
    # a resume takes step_000000 (or later) over any SFT checkpoint, so those are dead weight (~the
    # model's size each):
    # tests/test_train.py::test_sigkill_during_sft_and_resume_continues_the_unbroken_run_bit_for_bit
    for old in ckpt_root.glob("sft_*") if kind == "step" else []:
        shutil.rmtree(old, ignore_errors=True)
    for stale in ckpt_root.glob(".tmp-*_*"):  # left by a run killed mid-save
        if not stale.name.endswith(f"-{os.getpid()}"):
            shutil.rmtree(stale, ignore_errors=True)
    return final


def checkpoint_failed(ckpt_root: Path, tmp: Path, final: Path, e: Exception):
    """Remove the partial checkpoint `tmp` that error e stopped; re-raise e, or on a full disk end
    the run with one line naming the disk and the checkpoint a --resume starts from."""
    full = _disk_full(e, ckpt_root)
    shutil.rmtree(tmp, ignore_errors=True)
    if not full:
        raise e
    kept = [p.name for p in checkpoints(ckpt_root)]
    why = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}"
    before = (f"The checkpoints before it are intact ({kept[-1]} the newest)" if kept
              else "No checkpoint was saved yet")
    raise SystemExit(f"checkpoint {final.name} not saved: the disk holding {ckpt_root} is full "
                     f"({shutil.disk_usage(ckpt_root).free >> 20} MiB free once its partial files were "
                     f"removed; {why}). {before}: free space there, then continue with --resume.") from None


def latest_checkpoint(ckpt_root: Path) -> Path | None:
    ptr = ckpt_root / "latest"
    if not ptr.exists():
        return None
    path = ckpt_root / ptr.read_text().strip()
    if not (path / "trainer.pt").exists():
        raise RuntimeError(f"{ptr} names {path}, which is incomplete; remove {ptr} to start over")
    return path


def verify_checkpoint(path: Path) -> str | None:
    """What is wrong with checkpoint `path` (a missing file, one whose sha256 differs from the one
    recorded when it was saved), or None when it is intact."""
    try:
        meta = json.loads((path / "meta.json").read_text())
    except (OSError, ValueError) as e:
        return f"meta.json unreadable ({type(e).__name__}: {e})"
    if not (path / "trainer.pt").is_file():
        return "trainer.pt missing"
    for rel, digest in meta.get("sha256", {}).items():  # checkpoints saved before checksums: unchecked
        f = path / rel
        if not f.is_file():
            return f"{rel} missing"
        if _sha256(f) != digest:
            return f"{rel} does not match the sha256 recorded when it was saved (truncated or overwritten)"
    return None


def resume_checkpoint(ckpt_root: Path) -> tuple[Path | None, dict]:
    """(the newest intact checkpoint, its trainer state), after cutting the run's logs back to
    their sizes at that checkpoint; (None, {}) when there is no checkpoint. A corrupt checkpoint,
    or one whose logs are no longer what it recorded (a log cut short would lose that step's
    records), is reported and the one before it is tried: its steps run again and write them anew.
    tests/test_rundir.py::test_resume_falls_back_past_corrupt_checkpoints_and_trims_the_logs,
    tests/test_rundir.py::test_a_log_cut_inside_the_last_checkpoint_falls_back_to_one_it_holds"""
    import torch
    problems = []
    for path in reversed(checkpoints(ckpt_root)):
        problem = verify_checkpoint(path)
        if problem is None:
            logs = json.loads((path / "meta.json").read_text()).get("logs", {})
            problem = _log_problem(ckpt_root.parent, logs)
        if problem is None:
            try:
                state = torch.load(path / "trainer.pt", weights_only=False)
            except Exception as e:  # noqa: BLE001 -- unpickling errors have no common type
                problem = f"trainer.pt does not load ({type(e).__name__}: {e})"
        if problem is not None:
            problems.append(f"{path.name}: {problem}")
            print(f"resume: skipping {path}: {problem}", file=sys.stderr)
            continue
        if problems:
            print(f"resume: falling back to {path} (an older checkpoint: its steps are trained again)",
                  file=sys.stderr)
        logs = json.loads((path / "meta.json").read_text()).get("logs")
        if logs is not None:
            sizes = {k: v if isinstance(v, int) else v["size"] for k, v in logs.items()}
            for log in ckpt_root.parent.glob("*.jsonl"):
                if log.stat().st_size > sizes.get(log.name, 0):
                    os.truncate(log, sizes.get(log.name, 0))
        return path, state
    if problems:
        raise SystemExit(f"--resume: no intact checkpoint in {ckpt_root} ({'; '.join(problems)}). "
                         f"Pass --restart to start over (the run is moved aside, not deleted).")
    return None, {}


def stop_if_non_finite(step: int, metrics: dict | None = None, weights: dict | None = None):
    """End the run, naming the step, when its loss / grad norm or any weight is NaN or inf: such
    weights must never reach a checkpoint.
    tests/test_rundir.py::test_non_finite_loss_or_weights_stop_the_run"""
    bad = [f"{k} = {metrics[k]}" for k in ("loss", "grad_norm")
           if metrics and k in metrics and not math.isfinite(metrics[k])]
    if weights:
        import torch
        bad += [f"weight {n}" for n, t in weights.items()
                if torch.is_tensor(t) and t.is_floating_point() and not bool(torch.isfinite(t).all())][:3]
    if bad:
        raise SystemExit(f"step {step}: {', '.join(bad)} is not finite; stopping without saving it. Resume "
                         f"from the last checkpoint (--resume), e.g. with a lower train.lr or "
                         f"train.grad_clip.")


def rng_state() -> dict:
    import numpy as np
    import torch
    s = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        s["cuda"] = torch.cuda.get_rng_state_all()
    return s


def set_rng_state(s: dict):
    import numpy as np
    import torch
    random.setstate(s["python"])
    np.random.set_state(s["numpy"])
    torch.set_rng_state(s["torch"])
    if "cuda" in s and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


# -----------------------------------------------------------------------------------------------
# logging: metrics.jsonl, TensorBoard when installed, curves PNG and one-screen summary at the end


class RunLog:
    def __init__(self, out_dir: Path, resumed: bool, tensorboard: bool, write: bool = True):
        self.path = out_dir / "metrics.jsonl"
        self.records = []
        self.fh = self.tb = None
        if not write:  # ranks > 0: rank 0 owns the file (decisions that read it come from rank 0)
            return
        resumed = resumed and self.path.exists()
        if resumed:  # resume_checkpoint checked it and cut it back to the checkpoint's records
            self.records = [json.loads(line) for line in self.path.read_text().splitlines()]
        self.fh = open(self.path, "a" if resumed else "w")
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
                self.tb = SummaryWriter(str(out_dir / "tb"))
            except ImportError:
                pass

    def log(self, rec: dict):
        rec = {k: v for k, v in rec.items() if v is not None}
        self.records.append(rec)
        self.fh.write(json.dumps(rec) + "\n")
        self.fh.flush()
        if self.tb:
            step = rec.get("step", 0)
            for k, v in rec.items():
                if isinstance(v, (int, float)) and k != "step":
                    self.tb.add_scalar(f"{rec.get('phase', 'rl')}/{k}", v, step)

    def close(self):
        if self.fh:
            self.fh.close()
        if self.tb:
            self.tb.close()


def plot_curves(records: list[dict], out: Path) -> str:
    """PNG of reward / success / loss / eval success; returns a line for the summary."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "curves: matplotlib not installed, no PNG (pip install matplotlib)"
    panels = [("sft", "loss", "SFT loss"), ("rl", "reward", "train reward"), ("rl", "loss", "RL loss"),
              ("eval", "success", "held-out success")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3))
    for ax, (phase, key, title) in zip(axes, panels):
        pts = [(r["step"], r[key]) for r in records if r.get("phase") == phase and key in r]
        if pts:
            # markers where the points are few: a lone point shows
            ax.plot(*zip(*pts), marker="o" if phase == "eval" or len(pts) < 30 else None)
        ax.set_title(title)
        ax.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return f"curves: {out}"


def _estimate(rec: dict) -> str:
    """An eval record as the summary says it: success, its 95% interval and what it rests on."""
    ci = rec.get("success_ci")
    return (f"{rec['success']:.1%}" + (f" [{ci[0]:.1%}, {ci[1]:.1%}]" if ci else "")
            + f" (step {rec['step']}" + (f", {rec['episodes']} episodes)" if "episodes" in rec else ")"))


def peak_rss_gib() -> tuple[float, float]:
    """(the most resident memory this process has held, that of its largest finished child), GiB:
    a CPU run's engine runs inside the process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so the first
    is the run's. ru_maxrss is in KiB on Linux, in bytes on macOS."""
    import resource
    unit = 1 if sys.platform == "darwin" else 1024
    return tuple(resource.getrusage(who).ru_maxrss * unit / 2 ** 30
                 for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))


def summary(records: list[dict], wall_s: float, out_dir: Path,
            peak_rss: tuple[float, float] | None = None) -> str:
    ev = [r for r in records if r.get("phase") == "eval"]
    rl = [r for r in records if r.get("phase") == "rl"]
    lines = ["=" * 72, f"run {out_dir}"]
    sft = [r for r in records if r.get("phase") == "sft"]
    if sft:
        val = [r for r in sft if "val_oracle_prob" in r]
        lines.append(f"sft: {len(sft)} steps, loss {sft[-1]['loss']:.3f}" + (
            f"; val_oracle_prob {val[-1]['val_oracle_prob']:.3f}, val_nll {val[-1]['val_nll']:.3f}"
            if val else ""))
    for c in (r for r in records if r.get("phase") == "curate"):
        lines.append(f"curated: RL draws the {len(c['kept'])} of {c['tried']} tasks the start policy both "
                     f"solved and failed in {c['k']} episodes each ({c['time/curate']:.0f}s)")
    if ev:
        lines.append(f"held-out success: start {_estimate(ev[0])} -> end {_estimate(ev[-1])}; "
                     f"best {max(r['success'] for r in ev):.1%}")
    if rl:
        first, last = rl[: max(1, len(rl) // 4)], rl[-max(1, len(rl) // 4):]
        mean = lambda rs, k: sum(r.get(k, 0) for r in rs) / len(rs)  # noqa: E731
        lines.append(f"train reward: first quarter {mean(first, 'reward'):.3f} -> last quarter "
                     f"{mean(last, 'reward'):.3f} over {len(rl)} steps")
        tok = sum(r.get("tokens", 0) for r in rl)
        gaps = [r["sync_gap"] for r in rl if "sync_gap" in r]
        lines.append(f"tokens trained: {tok:,}; padding {mean(rl, 'padding_frac'):.1%}; sync gap "
                     f"(mean |Δlogp|) " + (f"{sum(gaps) / len(gaps):.2e}" if gaps else "not checked"))
        times = {k: sum(r.get(f"time/{k}", 0) for r in rl)
                 for k in ("rollout", "train", "sync", "eval", "checkpoint")}
        lines.append("time: " + ", ".join(f"{k} {v:.0f}s" for k, v in times.items())
                     + f"; wall {wall_s / 60:.1f} min")
    if peak_rss:
        lines.append(f"peak resident memory: {peak_rss[0]:.2f} GiB" + (
            f" (its largest child process: {peak_rss[1]:.2f} GiB)" if peak_rss[1] >= 0.01 else ""))
    lines.append("=" * 72)
    return "\n".join(lines)
