"""The GPU path's pieces, proved on CPU stand-ins (issue 19): engine placement under torchrun,
fp32 master weights, sampling-consistent log-probs, chunked log-probs, async mode."""
import json
import os
import subprocess
import sys

import pytest
import torch

import distributed
from conftest import ROOT


# --- engines under torchrun -----------------------------------------------------------------

def test_engine_placement_check_rejects_an_engine_on_another_ranks_device(monkeypatch):
    """Bug: under torchrun vLLM's single-process executor took local rank 0 on every rank (all
    engines on cuda:0); the check after engine start must refuse that and accept the right one."""
    monkeypatch.setenv("LOCAL_RANK", "1")
    distributed.check_engine_placement("cpu", 1, "cpu")
    with pytest.raises(RuntimeError, match="external_launcher"):
        distributed.check_engine_placement("cpu", 0, "cpu")  # what the uni executor reports on rank 1
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert distributed.engine_launch_kwargs() == {"distributed_executor_backend": "external_launcher"}
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert distributed.engine_launch_kwargs() == {}


@pytest.mark.slow
def test_two_ranks_run_independent_engines_on_their_own_devices(tiny_model_dir, tmp_path):
    """Bug: every rank's engine on local rank 0 (cuda:0 on a GPU box). 2 gloo ranks each start a
    vLLM CPU engine through train.make_engine (external_launcher), pass the placement check, load
    their own weights; each engine matches its own trainer's log-probs and not the other rank's."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(ROOT / "tests" / "torchrun_engines.py"), str(tiny_model_dir), str(tmp_path)]
    r = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    res = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(2)]
    for i, rr in enumerate(res):
        assert rr["placement"] == ["cpu", i]
        assert rr["gaps"][i] < 1e-3          # own trainer: the sync landed in this rank's engine
        assert rr["gaps"][1 - i] > 0.05      # the other rank's trainer: separate weights
    assert res[0]["tokens"] != res[1]["tokens"]


# --- fp32 master weights, bf16 compute --------------------------------------------------------

def _fake_trajectories(n: int, length: int, vocab: int, seed: int = 0):
    """n trajectories of random tokens whose second half is 'sampled' (loss_mask 1), reward 1."""
    import random

    import rollout
    rng = random.Random(seed)
    out = []
    for i in range(n):
        t = rollout.Trajectory(task_name=f"t{i}", group_id=i // 2, reward=1.0, finish_reason="submitted")
        t.append([rng.randrange(vocab) for _ in range(length // 2)])
        t.append([rng.randrange(vocab) for _ in range(length - length // 2)], loss=1, chunk=0,
                 logprobs=[-1.0] * (length - length // 2))
        out.append(t)
    return out


def test_bf16_compute_moves_every_weight_at_lr_1e_6(tiny_model_dir, vllm_engine, tmp_path):
    """Bug: full fine-tuning loaded the model in bf16, so AdamW stepped bf16 weights (bf16 state):
    at lr 1e-6 only ~2% of the weights changed in 10 steps. With fp32 master weights and bf16
    compute every weight that gets a gradient moves, and the engine's log-probs after the sync
    still match the trainer's (engine fp32 here; the trainer computes in bf16)."""
    import config
    import learner
    import rollout
    import train
    cfg = config.load_config(ROOT / "configs" / "tiny.yaml", [
        f"model.path={tiny_model_dir}", "model.build_tiny=false", "model.dtype=bfloat16", "model.lora=false",
        "model.gradient_checkpointing=false", "train.lr=1e-6", "train.warmup_steps=0", "train.grad_clip=0",
        "train.weight_decay=0", "train.micro_batch_tokens=4096"])
    model = learner.load_model(cfg, "cpu")
    with torch.no_grad():
        probe = model(input_ids=torch.tensor([[5, 6, 7]])).logits
    assert probe.dtype == torch.bfloat16  # the compute
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    got_grad = {n: torch.zeros_like(p, dtype=torch.bool) for n, p in model.named_parameters()}

    def note(name):
        def hook(g):
            got_grad[name].logical_or_(g != 0)
        return hook
    for n, p in model.named_parameters():
        p.register_hook(note(n))
    opt, sched = learner.make_optimizer(model, 1e-6, 0.0, cfg.train.adam_betas, 0, 10, "constant")
    batch = rollout.make_batch(_fake_trajectories(4, 48, model.config.vocab_size), 0)
    for _ in range(10):
        learner.sft_step(model, opt, sched, batch, cfg.train)
    moved = {n: p.detach() != start[n] for n, p in model.named_parameters()}
    trained = sum(int(g.sum()) for g in got_grad.values())
    frac = sum(int((moved[n] & got_grad[n]).sum()) for n in moved) / trained
    total = sum(int(m.sum()) for m in moved.values()) / sum(m.numel() for m in moved.values())
    print(f"\nbf16 compute, lr 1e-6, 10 steps: {frac:.2%} of weights with a gradient moved, {total:.2%} of all")
    assert frac > 0.99, f"{frac:.2%} of the weights with a gradient moved ({total:.2%} of all weights)"
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the master weights

    policy = rollout.Policy(vllm_engine, _tokenizer(tiny_model_dir))
    try:
        train.sync_weights(model, policy, cfg, tmp_path, 1)
        gap = train.sync_gap(model, policy, batch, cfg, "cpu", n=1)  # several at once trip punica_cpu with LoRA enabled
        assert gap["sync/mean_abs_logprob_gap"] < 0.02 and gap["sync/max_abs_logprob_gap"] < 0.2, gap
    finally:
        from transformers import AutoModelForCausalLM
        orig = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        policy.update_weights(orig.named_parameters(), version=0)
        policy.close()


def _tokenizer(path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(path)
