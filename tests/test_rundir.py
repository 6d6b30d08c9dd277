"""rundir.py, on real files and the tiny model: a run directory is never clobbered, a resume
continues from the newest intact checkpoint with every log cut back to it, and non-finite
weights never reach a checkpoint. Fast: no training, no engine."""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import config
import learner
import rundir
import train

ROOT = Path(__file__).resolve().parents[1]


def _cli(out: Path, *flags, model="missing-model-dir/x/y"):
    """train.py's CLI on `out`, with a model path that fails to load (the issue's case)."""
    return train.main(["--config", str(ROOT / "configs" / "tiny.yaml"), "--set", f"out_dir={out}",
                       "--set", "model.build_tiny=false", "--set", f"model.path={model}", *flags])


def test_an_existing_run_is_refused_or_moved_aside_never_clobbered(tmp_path):
    """Bug: re-running a run_name without --resume, with a model that then failed to load, cut the
    old metrics.jsonl from 38 lines to 0 and overwrote config.yaml."""
    out = tmp_path / "run"
    (out / "checkpoints" / "step_000002").mkdir(parents=True)
    (out / "metrics.jsonl").write_text("".join(json.dumps({"phase": "rl", "step": i}) + "\n"
                                               for i in range(38)))
    (out / "config.yaml").write_text("the old run's config\n")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(SystemExit, match=r"38 metrics records.*--resume.*--restart"):
        _cli(out)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert len(list(tmp_path.iterdir())) == 1
    with pytest.raises(SystemExit, match="pass one of them"):
        _cli(out, "--resume", "--restart")
    with pytest.raises(SystemExit, match="does not exist"):  # --restart: moved aside first
        _cli(out, "--restart")
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("run.")]
    # every file moved aside, and beside them the lock it was moved under
    assert len(aside) == 1 and {aside[0] / p.relative_to(out) for p in before} == {
        p for p in aside[0].rglob("*") if p.is_file() and p.name != rundir.LOCK}
    assert all((aside[0] / p.relative_to(out)).read_bytes() == b for p, b in before.items())
    # --resume of a directory without any checkpoint has nothing to continue: it starts over, the old one kept
    (out / "metrics.jsonl").write_text('{"phase": "sft", "step": 0}\n')
    with pytest.raises(SystemExit, match="does not exist"):
        _cli(out, "--resume")
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("run.")]) == 2


_HOLDER = """
import sys, time
from pathlib import Path
import rundir
lock = rundir.claim_run_dir(Path(sys.argv[1]), resume=sys.argv[2] == "resume", restart=False)
print("locked", flush=True)
time.sleep(600)
"""


def _holder(out: Path, how: str) -> subprocess.Popen:
    """A process that claims `out` as train.py's rank 0 does and goes on holding it."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(out), how], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline() == "locked\n"
    return proc


def test_a_second_process_on_a_run_is_refused_naming_the_writer(tmp_path):
    """Bugs: a --resume while the same run was training was not refused (both wrote: RL steps logged
    1,2,3,4,3,5,4,6.., trajectories doubled, one died on the other's deleted .tmp dir), nor a plain
    start on a run directory still empty. A second process is refused, naming the writer's pid,
    whatever its flags; once the writer is dead (SIGKILL: no clean-up ran) its lock is taken over."""
    out, fresh = tmp_path / "run", tmp_path / "fresh"
    (out / "checkpoints" / "step_000001").mkdir(parents=True)
    (out / "metrics.jsonl").write_text('{"phase": "rl", "step": 1}\n')
    holders = [_holder(out, "resume"), _holder(fresh, "start")]
    try:
        for flags in (["--resume"], ["--restart"]):
            with pytest.raises(SystemExit,
                               match=rf"{out} is being written by process {holders[0].pid}: .*Wait for it"):
                _cli(out, *flags)
        with pytest.raises(SystemExit, match=r"already holds a run"):
            _cli(out)
        with pytest.raises(SystemExit, match=rf"{fresh} is being written by process {holders[1].pid}"):
            _cli(fresh)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh", "run"]  # nothing moved aside
        assert (out / "metrics.jsonl").read_text() == '{"phase": "rl", "step": 1}\n'
    finally:
        for h in holders:
            h.kill()
            h.wait()
    assert (out / rundir.LOCK).read_text().split()[0] == str(holders[0].pid)  # left by the dead writer
    with pytest.raises(SystemExit, match="does not exist"):  # past the claim: the model path is what fails
        _cli(out, "--resume")
    assert (out / rundir.LOCK).read_text().split()[0] == str(os.getpid())


def _append(path: Path, rows):
    with open(path, "a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))


def test_resume_falls_back_past_corrupt_checkpoints_and_trims_the_logs(tiny_model_dir, tmp_path, capsys):
    """Bugs: on resume trajectories.jsonl and eval_trajectories.jsonl were not trimmed (64 duplicate
    rows after one kill) and metrics.jsonl gained a duplicate eval record; a truncated checkpoint
    file gave a raw traceback, and 64 KiB overwritten in model.safetensors loaded silently (NaN
    weights, trained on and saved)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    cfg = config.load_config(ROOT / "configs" / "tiny.yaml", [f"model.path={tiny_model_dir}"])
    model, tok = learner.load_model(cfg, "cpu"), AutoTokenizer.from_pretrained(tiny_model_dir)
    out = tmp_path / "run"
    out.mkdir()
    logs = {}
    for step in (1, 2, 3):  # each step's rows are written before its checkpoint, as train.py does
        _append(out / "trajectories.jsonl", [{"step": step, "episode": e} for e in range(4)])
        _append(out / "eval_trajectories.jsonl", [{"step": step}])
        _append(out / "metrics.jsonl", [{"phase": "eval", "step": step}, {"phase": "rl", "step": step}])
        rundir.save_checkpoint(out / "checkpoints", step, lambda d: learner.save_model(model, tok, d),
                               {"step": step}, keep_last=5)
        logs[step] = {p.name: p.read_bytes() for p in out.glob("*.jsonl")}
    # killed during step 4: its rows are half written, one log is new
    _append(out / "trajectories.jsonl", [{"step": 4, "episode": 0}])
    (out / "metrics.jsonl").open("a").write('{"phase": "eval", "st')
    _append(out / "trajectories.rank1.jsonl", [{"step": 4}])

    def resume():
        path, state = rundir.resume_checkpoint(out / "checkpoints")
        assert state["step"] == int(path.name[5:])
        held = {p.name: p.read_bytes() for p in out.glob("*.jsonl") if p.stat().st_size}
        assert held == logs[state["step"]]
        return state["step"]

    assert resume() == 3  # intact: the logs are cut back to step 3's, nothing else changes
    st = out / "checkpoints" / "step_000003" / "model" / "model.safetensors"
    with open(st, "r+b") as f:  # 64 KiB of garbage inside the weights (not the header)
        f.seek(st.stat().st_size // 2)
        f.write(os.urandom(64 << 10))
    _append(out / "trajectories.jsonl", [{"step": 4, "episode": 0}])
    assert resume() == 2
    err = capsys.readouterr().err
    assert "step_000003" in err and "model/model.safetensors does not match the sha256" in err
    assert "falling back" in err
    two = out / "checkpoints" / "step_000002" / "model" / "model.safetensors"
    os.truncate(two, two.stat().st_size // 2)
    assert resume() == 1 and "step_000002: model/model.safetensors does not match" in capsys.readouterr().err
    (out / "checkpoints" / "step_000001" / "trainer.pt").write_bytes(b"")
    with pytest.raises(SystemExit,
                       match=r"no intact checkpoint.*step_000001: trainer.pt does not match.*--restart"):
        rundir.resume_checkpoint(out / "checkpoints")
    # an intact checkpoint's weights are what was saved
    good = rundir.save_checkpoint(out / "checkpoints", 5, lambda d: learner.save_model(model, tok, d),
                                  {"step": 5}, 5)
    assert rundir.verify_checkpoint(good) is None
    loaded = AutoModelForCausalLM.from_pretrained(good / "model")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))


def test_sft_checkpoints_resume_before_step_0_and_go_once_it_is_saved(tmp_path):
    """SFT checkpoints (sft_<N>, kind "sft") are written and checked as RL's are: a --resume of a run
    that holds only them continues it (not moved aside), skips one cut short for the one before it
    and cuts the log back to that one; the SFT-only start (step_000000) comes after every one of
    them, and saving it removes them all (and a killed save's leftovers)."""
    def write(d):
        d.mkdir()
        (d / "w.bin").write_bytes(os.urandom(64))
    out = tmp_path / "run"
    out.mkdir()
    ck = out / "checkpoints"
    for step in (2, 4, 6):
        _append(out / "metrics.jsonl", [{"phase": "sft", "step": s} for s in range(step - 2, step)])
        rundir.save_checkpoint(ck, step, write, {"sft": {"step": step}}, keep_last=2, kind="sft")
    assert sorted(p.name for p in ck.iterdir()) == ["latest", "sft_000004", "sft_000006"]
    assert rundir.latest_checkpoint(ck).name == "sft_000006"
    _append(out / "metrics.jsonl", [{"phase": "sft", "step": 6}])  # killed during SFT step 7
    rundir.claim_run_dir(out, resume=True, restart=False).close()
    assert [p.name for p in tmp_path.iterdir()] == ["run"]  # continued, not moved aside
    (ck / "sft_000006" / "trainer.pt").write_bytes(b"")
    path, state = rundir.resume_checkpoint(ck)
    assert path.name == "sft_000004" and state == {"sft": {"step": 4}}
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3]
    (ck / ".tmp-sft_000006-999999999").mkdir()  # a save a kill cut short
    rundir.save_checkpoint(ck, 0, write, {"step": 0}, keep_last=2)
    assert sorted(p.name for p in ck.iterdir()) == ["latest", "step_000000"]
    assert rundir.resume_checkpoint(ck)[0].name == "step_000000"


def test_non_finite_loss_or_weights_stop_the_run(tiny_model_dir):
    """Bug: NaN weights (from a corrupted checkpoint) trained on and were saved as a NaN checkpoint.
    A non-finite loss or weight now ends the run naming the step, before anything is saved."""
    from transformers import AutoModelForCausalLM
    weights = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    rundir.stop_if_non_finite(7, {"loss": 0.5, "grad_norm": 1.0}, weights)  # finite: goes on
    with pytest.raises(SystemExit, match=r"step 7: loss = nan.*not finite"):
        rundir.stop_if_non_finite(7, {"loss": float("nan"), "grad_norm": 1.0})
    name = next(iter(weights))
    weights[name][0, 0] = float("inf")
    with pytest.raises(SystemExit, match=rf"step 9: weight {name} is not finite"):
        rundir.stop_if_non_finite(9, None, weights)


def test_a_model_path_that_cannot_load_says_what_to_do_at_once(tmp_path):
    """Bugs: a hub id without network failed after 55 s with a raw OSError; a missing local path
    got transformers' "Repo id must be in the form ..."."""
    def check(path):
        cfg = config.load_config(ROOT / "configs" / "tiny.yaml",
                                 ["model.build_tiny=false", f"model.path={path}"])
        t0 = time.monotonic()
        with pytest.raises(SystemExit) as e:
            learner.check_model_path(cfg)
        return str(e.value), time.monotonic() - t0
    msg, took = check("termrl-tests/no-such-model")
    assert took < 15 and "HF_HUB_OFFLINE" in msg and "local model directory" in msg
    assert "huggingface-cli download" in msg
    msg, _ = check(tmp_path / "no-model-here")
    assert "does not exist" in msg and "Repo id" not in msg
    msg, _ = check("runs/no-model-here")  # shaped like a hub id, meant as a local path
    assert "does not exist" in msg and "HF_HUB_OFFLINE" in msg
    (tmp_path / "empty").mkdir()
    assert "no config.json" in check(tmp_path / "empty")[0]


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of 64 MiB mounted in tmp_path (needs root, as the machine's tests run), and a
    function that leaves only n bytes of it free (a filler file the test removes to free space)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(disk)]
    if subprocess.run(mount, capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root")

    def leave_free(n: int) -> Path:
        filler = disk / "filler"
        with open(filler, "ab") as f:
            os.posix_fallocate(f.fileno(), f.tell(), shutil.disk_usage(disk).free - n)
        return filler
    yield disk, leave_free
    subprocess.run(["umount", "-l", str(disk)], check=True)


@pytest.mark.parametrize("fails", ["model", "trainer.pt"])
def test_a_full_disk_stops_the_run_in_one_line_and_keeps_the_last_checkpoint(tiny_model_dir, small_disk,
                                                                              fails):
    """Bug: a full disk during a checkpoint gave raw tracebacks (SafetensorError ... No space left
    from the model's file, RuntimeError ... unexpected pos from torch.save, which never says disk)
    and left half-written .tmp dirs. On a real full filesystem the save ends the run with one line
    saying the disk is full and where, removes its partial files, and leaves the checkpoint before
    it intact; once there is room again the next save and a resume work."""
    from transformers import AutoTokenizer
    cfg = config.load_config(ROOT / "configs" / "tiny.yaml", [f"model.path={tiny_model_dir}"])
    model, tok = learner.load_model(cfg, "cpu"), AutoTokenizer.from_pretrained(tiny_model_dir)
    disk, leave_free = small_disk
    root = disk / "run" / "checkpoints"
    (disk / "run").mkdir()
    (disk / "run" / "metrics.jsonl").write_text('{"phase": "rl", "step": 1}\n')
    state = {"step": 1, "moments": torch.zeros(1 << 20)}  # 4 MiB, as an optimizer's state

    def save(step):
        return rundir.save_checkpoint(root, step, lambda d: learner.save_model(model, tok, d),
                                      {**state, "step": step}, 3)
    one = save(1)
    model_bytes = sum(p.stat().st_size for p in (one / "model").iterdir())
    filler = leave_free(64 << 10 if fails == "model" else model_bytes + (1 << 20))
    with pytest.raises(SystemExit) as e:
        save(2)
    msg = str(e.value)
    assert "\n" not in msg, msg
    assert msg.startswith(f"checkpoint step_000002 not saved: the disk holding {root} is full"), msg
    assert ("SafetensorError" if fails == "model" else "RuntimeError") in msg, msg
    assert "step_000001 the newest" in msg, msg
    assert msg.endswith("free space there, then continue with --resume."), msg
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000001"]  # no partial files
    assert rundir.verify_checkpoint(one) is None and rundir.latest_checkpoint(root) == one
    filler.unlink()  # room again: the run's next save and its resume work
    two = save(2)
    path, resumed = rundir.resume_checkpoint(root)
    assert path == two and resumed["step"] == 2


def test_a_log_cut_inside_the_last_checkpoint_falls_back_to_one_it_holds(tmp_path, capsys):
    """Bug: metrics.jsonl / trajectories.jsonl cut mid-line inside the last checkpoint resumed with
    exit 0 and no warning, losing that step's records. A checkpoint notes each log's size and sha256;
    a resume takes the newest checkpoint its logs still hold unchanged (the steps after it run again
    and write their records anew), says why it passed over the others, and refuses when none is."""
    out = tmp_path / "run"
    out.mkdir()
    logs = {}
    for step in (1, 2, 3):
        _append(out / "trajectories.jsonl", [{"step": step, "episode": e} for e in range(4)])
        _append(out / "metrics.jsonl", [{"phase": "eval", "step": step}, {"phase": "rl", "step": step}])
        rundir.save_checkpoint(out / "checkpoints", step, lambda d: d.mkdir(), {"step": step}, keep_last=5)
        logs[step] = {p.name: p.read_bytes() for p in out.glob("*.jsonl")}
    metrics = out / "metrics.jsonl"
    os.truncate(metrics, len(logs[3]["metrics.jsonl"]) - 5)  # mid-line, inside step 3's records
    path, state = rundir.resume_checkpoint(out / "checkpoints")
    assert state["step"] == 2 and {p.name: p.read_bytes() for p in out.glob("*.jsonl")} == logs[2]
    err = capsys.readouterr().err
    size = len(logs[3]["metrics.jsonl"])
    assert (f"skipping {out / 'checkpoints' / 'step_000003'}: metrics.jsonl holds {size - 5} "
            f"bytes, {size} when it was saved: cut short") in err and "falling back" in err
    # the same size, other bytes
    metrics.write_bytes(logs[2]["metrics.jsonl"].replace(b'"step": 2', b'"step": 7'))
    assert rundir.resume_checkpoint(out / "checkpoints")[1]["step"] == 1
    assert "metrics.jsonl's first" in capsys.readouterr().err
    os.truncate(out / "trajectories.jsonl", 10)
    with pytest.raises(SystemExit, match=r"no intact checkpoint.*step_000001: "
                                         r"trajectories.jsonl holds 10 bytes.*--restart"):
        rundir.resume_checkpoint(out / "checkpoints")
