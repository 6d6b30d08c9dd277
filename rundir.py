"""The run directory, as train.py writes it: checkpoints that survive a kill, metrics, curves, summary.

    runs/<name>/checkpoints/step_<N>/{model/, trainer.pt, meta.json}   latest -> step_<N>
    runs/<name>/metrics.jsonl  *trajectories*.jsonl  (tb/ with TensorBoard)  curves.png  summary.txt

A run directory is never clobbered (claim_run_dir). meta.json holds a sha256 per checkpoint file
and the size of every *.jsonl log when the checkpoint was saved: a resume (resume_checkpoint)
takes the newest checkpoint whose files still match and cuts the logs back to those sizes, so
no row is lost or appears twice.
"""
import hashlib
import json
import math
import os
import random
import shutil
import sys
import time
from pathlib import Path


# -----------------------------------------------------------------------------------------------
# the run directory: never clobbered, moved aside (never deleted) to start over


def claim_run_dir(out: Path, resume: bool, restart: bool):
    """Call before anything is written to `out`, in one process of the run (train.py: rank 0). A
    directory holding a run is continued with --resume, moved to <out>.<date-time> with --restart
    (also by --resume when it holds no checkpoint), and otherwise refused.
    tests/test_rundir.py::test_an_existing_run_is_refused_or_moved_aside_never_clobbered"""
    if resume and restart:
        raise SystemExit("--resume continues the run in out_dir and --restart starts it over: pass one of them")
    if not out.is_dir() or not any(out.iterdir()):
        return
    ckpts = sorted((out / "checkpoints").glob("step_*"))
    if resume and ckpts:
        return
    if not (resume or restart):
        metrics = out / "metrics.jsonl"
        held = [f"{len(metrics.read_text().splitlines())} metrics records" if metrics.exists() else "no metrics",
                f"checkpoints up to {ckpts[-1].name}" if ckpts else "no checkpoint"]
        raise SystemExit(f"{out} already holds a run ({', '.join(held)}). Pass --resume to continue it from "
                         f"its latest checkpoint, or --restart to start over (the old run is moved to "
                         f"{out}.<date-time>, nothing is deleted), or set another run_name / out_dir.")
    aside = out.with_name(f"{out.name}.{time.strftime('%Y%m%d-%H%M%S')}")
    while aside.exists():
        aside = aside.with_name(aside.name + "x")
    os.rename(out, aside)
    why = f"--resume found no checkpoint in {out / 'checkpoints'}" if resume else "--restart"
    print(f"{why}: the old run is now {aside}; starting over in {out}", file=sys.stderr)


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


def log_sizes(out: Path) -> dict:
    """Bytes in each *.jsonl log of the run directory (every log is appended to, never rewritten)."""
    return {p.name: p.stat().st_size for p in sorted(out.glob("*.jsonl"))}


def _write_atomic(path: Path, text: str):
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def save_checkpoint(ckpt_root: Path, step: int, write_model, state: dict, keep_last: int) -> Path:
    """Write step_<N>/ (model/ in HF format + trainer.pt) atomically, point `latest` at it, keep the last K and step 0.

    `write_model(dir)` saves the model or adapter (plus tokenizer) loadable as is by
    transformers / peft / vLLM. A kill at any moment leaves `latest` naming a complete checkpoint.
    meta.json records each file's sha256 and the sizes of the run's logs (the *.jsonl beside
    checkpoints/), which resume_checkpoint cuts them back to: write a step's records before its
    checkpoint, so a kill between the two cannot lose them.
    """
    import torch
    ckpt_root.mkdir(parents=True, exist_ok=True)
    final = ckpt_root / f"step_{step:06d}"
    tmp = ckpt_root / f".tmp-step_{step:06d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    write_model(tmp / "model")
    torch.save(state, tmp / "trainer.pt")
    sha = {str(p.relative_to(tmp)): _sha256(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
    (tmp / "meta.json").write_text(json.dumps({"step": step, "time": time.time(), "sha256": sha,
                                               "logs": log_sizes(ckpt_root.parent)}))
    _fsync_tree(tmp)
    if final.exists():  # re-saving a step after a resume: the old copy is equivalent
        shutil.rmtree(final)
    os.rename(tmp, final)
    _write_atomic(ckpt_root / "latest", final.name + "\n")
    # step 0 (the SFT-only start, what every RL gain is measured against) stays whatever keep_last
    # says: tests/test_train.py::test_keep_last_keeps_the_sft_only_start
    for old in sorted(ckpt_root.glob("step_*"))[:-keep_last] if keep_last > 0 else []:
        if old != final and old.name != "step_000000":
            shutil.rmtree(old, ignore_errors=True)
    for stale in ckpt_root.glob(".tmp-step_*"):  # left by a run killed mid-save
        if not stale.name.endswith(f"-{os.getpid()}"):
            shutil.rmtree(stale, ignore_errors=True)
    return final


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
    their sizes at that checkpoint; (None, {}) when there is no checkpoint. A corrupt checkpoint
    is reported and the one before it is tried.
    tests/test_rundir.py::test_resume_falls_back_past_corrupt_checkpoints_and_trims_the_logs"""
    import torch
    problems = []
    for path in sorted(ckpt_root.glob("step_*"), reverse=True):
        problem = verify_checkpoint(path)
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
            print(f"resume: falling back to {path} (an older checkpoint: its steps are trained again)", file=sys.stderr)
        sizes = json.loads((path / "meta.json").read_text()).get("logs")
        if sizes is not None:
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
    weights must never reach a checkpoint. tests/test_rundir.py::test_non_finite_loss_or_weights_stop_the_run"""
    bad = [f"{k} = {metrics[k]}" for k in ("loss", "grad_norm")
           if metrics and k in metrics and not math.isfinite(metrics[k])]
    if weights:
        import torch
        bad += [f"weight {n}" for n, t in weights.items()
                if torch.is_tensor(t) and t.is_floating_point() and not bool(torch.isfinite(t).all())][:3]
    if bad:
        raise SystemExit(f"step {step}: {', '.join(bad)} is not finite; stopping without saving it. Resume from "
                         f"the last checkpoint (--resume), e.g. with a lower train.lr or train.grad_clip.")


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
    def __init__(self, out_dir: Path, keep_until_step: int | None, tensorboard: bool, write: bool = True):
        self.path = out_dir / "metrics.jsonl"
        self.records = []
        self.fh = self.tb = None
        if not write:  # ranks > 0: rank 0 owns the file (decisions that read it come from rank 0)
            return
        if self.path.exists() and keep_until_step is not None:
            # a resumed run rewrites history past its checkpoint, so no step appears twice
            for line in self.path.read_text().splitlines():
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:  # a line cut by the kill
                    continue
                if r.get("phase") == "sft" or r.get("step", 0) <= keep_until_step:
                    self.records.append(r)
        self.path.write_text("".join(json.dumps(r) + "\n" for r in self.records))
        self.fh = open(self.path, "a")
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
            ax.plot(*zip(*pts), marker="o" if phase == "eval" or len(pts) < 30 else None)  # a lone point shows
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


def summary(records: list[dict], wall_s: float, out_dir: Path, peak_rss: tuple[float, float] | None = None) -> str:
    ev = [r for r in records if r.get("phase") == "eval"]
    rl = [r for r in records if r.get("phase") == "rl"]
    lines = ["=" * 72, f"run {out_dir}"]
    sft = [r for r in records if r.get("phase") == "sft"]
    if sft:
        val = [r for r in sft if "val_oracle_prob" in r]
        lines.append(f"sft: {len(sft)} steps, loss {sft[-1]['loss']:.3f}" + (
            f"; val_oracle_prob {val[-1]['val_oracle_prob']:.3f}, val_nll {val[-1]['val_nll']:.3f}" if val else ""))
    if ev:
        lines.append(f"held-out success: start {_estimate(ev[0])} -> end {_estimate(ev[-1])}; "
                     f"best {max(r['success'] for r in ev):.1%}")
    if rl:
        first, last = rl[: max(1, len(rl) // 4)], rl[-max(1, len(rl) // 4):]
        mean = lambda rs, k: sum(r.get(k, 0) for r in rs) / len(rs)  # noqa: E731
        lines.append(f"train reward: first quarter {mean(first, 'reward'):.3f} -> last quarter {mean(last, 'reward'):.3f}"
                     f" over {len(rl)} steps")
        tok = sum(r.get("tokens", 0) for r in rl)
        gaps = [r["sync_gap"] for r in rl if "sync_gap" in r]
        lines.append(f"tokens trained: {tok:,}; padding {mean(rl, 'padding_frac'):.1%}; sync gap (mean |Δlogp|) "
                     + (f"{sum(gaps) / len(gaps):.2e}" if gaps else "not checked"))
        times = {k: sum(r.get(f"time/{k}", 0) for r in rl) for k in ("rollout", "train", "sync", "eval", "checkpoint")}
        lines.append("time: " + ", ".join(f"{k} {v:.0f}s" for k, v in times.items()) + f"; wall {wall_s / 60:.1f} min")
    if peak_rss:
        lines.append(f"peak resident memory: {peak_rss[0]:.2f} GiB" + (
            f" (its largest child process: {peak_rss[1]:.2f} GiB)" if peak_rss[1] >= 0.01 else ""))
    lines.append("=" * 72)
    return "\n".join(lines)
