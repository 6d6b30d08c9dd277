"""learner.rl_step's numbers are pinned: loss, metrics and the update of a tiny Qwen3 model on a
batch with chunked turns, prefilled tokens, a top-k / top-p support and several micro-batches,
two updates on the batch (the second against π_old). The pinned values were computed by the
learner before its micro-batch loop kept everything on the device (no host sync per
micro-batch); a change to how the step is computed must leave them as they are.

`python tests/test_learner_step.py` prints the values the current code computes."""
import json
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]

PINNED = {  # python tests/test_learner_step.py at f3609c5, fp32 on CPU
    "metrics": [
        {"advantage_mean": -0.02272727874794393, "clip_frac_high": 0.0, "clip_frac_low": 0.0,
         "entropy": 3.048149494209675, "filtered_group_share": 0.0, "grad_norm": 2.5797598361968994,
         "invalid_frac": 0.0, "logprob_gap_abs": 2.3314339191068196, "logprob_gap_kl": 1.4840714889401772,
         "long_negative_frac": 0.0, "loss": 0.7373190879821777, "lr": 1.0,
         "masked_token_frac": 0.6864756158873805, "micro_batches": 4.0,
         "mismatch_chunk_frac": 0.6666666666666666, "mismatch_token_frac": 0.6864756158873805,
         "padding_frac": 0.05464480874316935, "positive_frac": 0.3333333333333333,
         "ratio_max": 0.8333333333333334, "ratio_mean": 0.8333333333333334,
         "ratio_min": 0.8333333333333334, "rows_trained": 6.0, "tokens": 173.0, "trained_tokens": 42.0,
         "zero_variance_group_share": 0.0},
        {"advantage_mean": 0.30270267177272486, "clip_frac_high": 0.0, "clip_frac_low": 0.0,
         "entropy": 3.6407600171638257, "filtered_group_share": 0.0, "grad_norm": 1.7587637901306152,
         "invalid_frac": 0.0, "logprob_gap_abs": 2.292996213518836, "logprob_gap_kl": 1.4510784263093008,
         "long_negative_frac": 0.0, "loss": 0.998440432548523, "lr": 1.0,
         "masked_token_frac": 0.6237707390648567, "micro_batches": 3.0, "mismatch_chunk_frac": 0.6,
         "mismatch_token_frac": 0.6237707390648567, "padding_frac": 0.07042253521126762,
         "positive_frac": 0.5, "ratio_max": 1.2581735372543335, "ratio_mean": 1.0587348341941833,
         "ratio_min": 0.672393524646759, "rows_trained": 5.0, "tokens": 173.0, "trained_tokens": 42.0,
         "zero_variance_group_share": 0.0},
    ],
    "update": [1.1377222537994385, 208.1800537109375, 4.012713432312012],
}


def tiny_model(path: Path):
    from transformers import AutoModelForCausalLM, Qwen3Config
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(path)


def chunked_batch(vocab: int):
    """Six rows of different lengths, each a prompt then two or three assistant turns (chunks)
    with tool output between them; row 4's first turn is prefilled (imitation)."""
    import algo
    g = torch.Generator().manual_seed(0)
    lengths = [48, 41, 30, 26, 17, 11]
    B, T = len(lengths), max(lengths)
    ids = torch.randint(1, vocab, (B, T), generator=g)
    att, loss, imit = torch.zeros(B, T, dtype=torch.long), torch.zeros(B, T), torch.zeros(B, T)
    chunk, n_chunks = torch.full((B, T), -1), torch.zeros(B, dtype=torch.long)
    for b, L in enumerate(lengths):
        att[b, :L] = 1
        ids[b, L:] = 0
        turns = 3 if L > 20 else 2
        edges = torch.linspace(L // 4, L, turns + 1).long().tolist()
        for k in range(turns):
            lo, hi = edges[k], edges[k + 1] - (1 if k < turns - 1 else 0)  # one tool-output token between
            (imit if (b == 4 and k == 0) else loss)[b, lo:hi] = 1
            chunk[b, lo:hi] = k
        n_chunks[b] = turns
    return algo.Batch(input_ids=ids, attention_mask=att, loss_mask=loss, imitation_mask=imit,
                      chunk_ids=chunk, num_chunks=n_chunks,
                      infer_logprobs=(-torch.rand(B, T, generator=g) * 3 - 0.1) * loss,
                      reward=torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 0.0]),
                      valid=torch.ones(B, dtype=torch.bool), group_id=torch.tensor([0, 0, 0, 1, 1, 1]),
                      policy_version=torch.zeros(B, dtype=torch.long), finish_reason=["submitted"] * B)


def step_numbers(model_dir: Path) -> dict:
    """Two rl_steps (the second against the first's π_old) under SGD at lr 1 (the weights move by
    exactly −grad): every metric of both, and the summed change of the weights, its absolute sum
    and a fixed random projection of it."""
    import algo
    import config
    import learner
    cfg = config.load_config(ROOT / "configs" / "tiny.yaml", [
        f"model.path={model_dir}", "model.build_tiny=false", "algo.baseline=grpo", "algo.negative_reward=-1",
        "algo.mismatch=chunk_mask", "algo.mismatch_cap=8.0", "algo.mismatch_floor=null",
        "train.micro_batch_tokens=70"])
    acfg = config.algo_cfg(cfg)
    model = learner.load_model(cfg, "cpu")
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    batch = chunked_batch(model.config.vocab_size)
    adv = algo.compute_advantages(batch, acfg)
    metrics = []
    for _ in range(2):
        m = learner.rl_step(model, opt, sched, batch, adv, acfg, cfg.train, temperature=0.9, top_k=40,
                            top_p=0.95, keep_old=True)
        metrics.append({k: float(v) for k, v in sorted(m.items())})
    delta = torch.cat([p.detach().flatten() for p in model.parameters()]) - before
    proj = torch.randn(delta.numel(), generator=torch.Generator().manual_seed(1))
    return {"metrics": metrics, "update": [float(delta.sum()), float(delta.abs().sum()), float(delta @ proj)]}


def test_rl_step_computes_the_pinned_numbers():
    with tempfile.TemporaryDirectory() as d:
        tiny_model(Path(d))
        got = step_numbers(Path(d))
    for want_m, got_m in zip(PINNED["metrics"], got["metrics"]):
        assert want_m.keys() == got_m.keys()
        for k in want_m:
            assert abs(got_m[k] - want_m[k]) <= 1e-5 * max(1.0, abs(want_m[k])), (k, got_m[k], want_m[k])
    for w, g in zip(PINNED["update"], got["update"]):
        assert abs(g - w) <= 1e-5 * max(1.0, abs(w)), (got["update"], PINNED["update"])
    assert got["metrics"][0]["micro_batches"] > 2 and got["metrics"][1]["ratio_max"] != 1.0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory() as d:
        tiny_model(Path(d))
        print(json.dumps(step_numbers(Path(d))))
