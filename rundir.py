"""The run directory, as train.py writes it: checkpoints that survive a kill, metrics, curves, summary.

    runs/<name>/checkpoints/step_<N>/{model/, trainer.pt, meta.json}   latest -> step_<N>
    runs/<name>/metrics.jsonl  (tb/ with TensorBoard)  curves.png  summary.txt
"""
import json
import os
import random
import shutil
import time
from pathlib import Path


# -----------------------------------------------------------------------------------------------
# checkpoints: tmp dir -> fsync -> rename, then an atomically replaced `latest` pointer


def _fsync_tree(path: Path):
    for p in sorted(path.rglob("*")) + [path]:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


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
    """
    import torch
    ckpt_root.mkdir(parents=True, exist_ok=True)
    final = ckpt_root / f"step_{step:06d}"
    tmp = ckpt_root / f".tmp-step_{step:06d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    write_model(tmp / "model")
    torch.save(state, tmp / "trainer.pt")
    (tmp / "meta.json").write_text(json.dumps({"step": step, "time": time.time()}))
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


def summary(records: list[dict], wall_s: float, out_dir: Path) -> str:
    ev = [r for r in records if r.get("phase") == "eval"]
    rl = [r for r in records if r.get("phase") == "rl"]
    lines = ["=" * 72, f"run {out_dir}"]
    sft = [r for r in records if r.get("phase") == "sft"]
    if sft:
        val = [r for r in sft if "val_oracle_prob" in r]
        lines.append(f"sft: {len(sft)} steps, loss {sft[-1]['loss']:.3f}" + (
            f"; val_oracle_prob {val[-1]['val_oracle_prob']:.3f}, val_nll {val[-1]['val_nll']:.3f}" if val else ""))
    if ev:
        lines.append(f"held-out success: start {ev[0]['success']:.1%} (step {ev[0]['step']}) -> "
                     f"end {ev[-1]['success']:.1%} (step {ev[-1]['step']}); best {max(r['success'] for r in ev):.1%}")
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
    lines.append("=" * 72)
    return "\n".join(lines)
