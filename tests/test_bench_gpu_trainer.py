"""bench/bench_gpu_trainer.py runs on CPU with a tiny shape: every case of the breakdown is timed,
the bare step beside the configured one, and the MFU it reports is its FLOP count over the time."""
import sys

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import bench_gpu_trainer  # noqa: E402


def test_the_gpu_trainer_bench_runs_on_cpu_with_a_tiny_shape(tmp_path):
    """The shipped LoRA config (its adapter on every linear layer) on the tiny shape, 4 rows."""
    rows = [96, 64, 40, 30]
    results = bench_gpu_trainer.main([
        "--model", "tiny", "--device", "cpu", "--rows", ",".join(map(str, rows)), "--turns", "3",
        "--repeats", "1", "--peak-tflops", "1", "--json", str(tmp_path / "b.json"),
        "--set", "train.micro_batch_tokens=128"])
    assert list(results) == ["as configured", "top_k -1 (no support mask)", "no entropy",
                             "head blocks of 2^24 logits", "pack_rows true"]
    first = results["as configured"]
    assert first["bare_s"] > 0 and first["padding_frac"] > 0 and first["adapter_params"] > 0
    assert all(r["rl_step_s"] > 0 and 0 < r["mfu"] < 1 for r in results.values())
    flops = bench_gpu_trainer.step_flops(bench_gpu_trainer.TINY, rows, first["adapter_params"], True)
    assert abs(first["mfu"] - flops / first["rl_step_s"] / 1e12) < 1e-12
    assert (tmp_path / "b.json").exists()
