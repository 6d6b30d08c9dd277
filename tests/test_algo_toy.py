"""Each loss actually learns: a two-turn toy task optimised with algo.py's real pieces.

Trajectory layout "p a a o a a": a prompt token, a sampled turn of 2 tokens, a tool-output token,
a second sampled turn of 2 tokens. The policy is a per-position table of logits over 3 tokens;
the episode succeeds (R = 1) when at least 3 of the 4 sampled tokens match a fixed target
(chance ≈ 1/9). The engine's log-probs get small noise (train–inference mismatch) and every batch
is used for two optimiser steps, so the second one is off-policy (ratios ≠ 1, clipping active).
"""
import pytest
import torch

import algo
import logprobs
from algo import AlgoConfig, Batch



@pytest.fixture(autouse=True)
def single_thread():
    """Tiny tensors run faster on one thread, and the CPUs are shared; restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


LAYOUT = "paaoaa"
SAMPLED = [1, 2, 4, 5]
TARGET = [2, 0, 1, 2]
V, T = 3, len(LAYOUT)
LR = 2.0


def make_batch(tokens, logprobs, groups, prefill, gen):
    """Batch for B rows of sampled `tokens` [B,4]; rows with prefill=True got turn 0 from the
    expert (the target) and only sample turn 1."""
    B = tokens.shape[0]
    ids = torch.zeros(B, T, dtype=torch.long)
    ids[:, SAMPLED] = tokens
    loss_mask, imitation_mask = torch.zeros(B, T), torch.zeros(B, T)
    loss_mask[:, SAMPLED] = 1.0
    imitation_mask[prefill, 1:3], loss_mask[prefill, 1:3] = 1.0, 0.0
    infer = (logprobs + 0.02 * torch.randn(B, T, generator=gen)) * loss_mask
    reward = ((tokens == torch.tensor(TARGET)).sum(-1) >= 3).float()
    return Batch(input_ids=ids, attention_mask=torch.ones(B, T, dtype=torch.long), loss_mask=loss_mask,
                 imitation_mask=imitation_mask, chunk_ids=torch.tensor([-1, 0, 0, -1, 1, 1]).repeat(B, 1),
                 num_chunks=torch.full((B,), 2), infer_logprobs=infer, reward=reward,
                 valid=torch.ones(B, dtype=torch.bool), group_id=groups,
                 policy_version=torch.zeros(B, dtype=torch.long), finish_reason=["submitted"] * B)


def policy_logits(table, B):
    # logits[b, t] predict token t+1 (the contract's alignment); table[t] is position t's policy
    return torch.cat([table[1:], table[:1]]).unsqueeze(0).expand(B, T, V)


def train(cfg, steps=40, groups=8, group_size=8, prefill_share=0.0, lr=LR, seed=0):
    gen = torch.Generator().manual_seed(seed)
    table = torch.zeros(T, V, requires_grad=True)
    B = groups * group_size
    gid = torch.arange(groups).repeat_interleave(group_size)
    history = []
    for _ in range(steps):
        with torch.no_grad():
            probs = torch.softmax(table[SAMPLED], -1)
            tokens = torch.stack([torch.multinomial(p, B, replacement=True, generator=gen) for p in probs], 1)
            prefill = torch.rand(B, generator=gen) < prefill_share
            tokens[prefill, :2] = torch.tensor(TARGET[:2])
            ids = torch.zeros(B, T, dtype=torch.long)
            ids[:, SAMPLED] = tokens
            lp_sampling, _ = logprobs.token_logprobs(policy_logits(table, B), ids)
        batch = make_batch(tokens, lp_sampling, gid, prefill, gen)
        history.append(batch.reward[~prefill].mean().item())
        batch.old_logprobs = lp_sampling
        adv = algo.compute_advantages(batch, cfg)
        for _ in range(2):
            lp, ent = logprobs.token_logprobs(policy_logits(table, B), batch.input_ids, with_entropy=True)
            loss, metrics, _ = algo.policy_loss(lp, batch, adv, cfg, entropy=ent)
            grad, = torch.autograd.grad(loss, table)
            with torch.no_grad():  # plain SGD: torch.optim's first use imports torch._dynamo (seconds)
                table -= lr * grad
        assert all(v == v for v in metrics.values())  # no NaN metric along the way
    return history, metrics


CONFIGS = {
    "ppo": (AlgoConfig(loss="ppo", baseline="grpo", std_normalize=True, negative_reward=None, gamma=1.0,
                       mismatch="token_tis", agg="token_mean"), 0.0),
    "gspo": (AlgoConfig(loss="gspo", baseline="grpo", std_normalize=True, negative_reward=None, gamma=1.0,
                        mismatch="token_mask"), 0.0),
    "ipa": (AlgoConfig(), 0.0),                              # the paper's recipe: defaults
    "ipa_prefill": (AlgoConfig(imitation_coef=0.5), 0.5),    # half the rows start from the expert turn
}


@pytest.mark.parametrize("name", CONFIGS)
def test_each_loss_increases_reward_on_toy_task(name):
    cfg, prefill_share = CONFIGS[name]
    history, metrics = train(cfg, prefill_share=prefill_share)
    start, end = history[0], sum(history[-10:]) / 10   # step 0: uniform policy, success ≈ 1/9
    assert start < 0.3, f"{name}: task too easy at start ({start:.2f})"
    assert end > 0.85, f"{name}: reward {start:.2f} -> {end:.2f} after {len(history)} steps"
    assert metrics["tokens_trained"] > 0


def test_toy_control_without_policy_gradient_does_not_improve():
    history, _ = train(AlgoConfig(rl_coef=0.0))
    assert sum(history[-10:]) / 10 < 0.3
