"""algo.py against numbers computed independently here (plain Python loops and math), plus
gradient checks that fail on the mistakes that matter: importance weights on the wrong side,
leaky masks, NaNs on empty batches, micro-batches that do not add up."""
import dataclasses
import math
import statistics

import pytest
import torch

import algo
import logprobs
import config
import learner
from algo import AlgoConfig, Batch



@pytest.fixture(autouse=True)
def float64_single_thread():
    """float64 for exact comparisons (algo.py keeps the dtype it gets); one thread because these
    tensors are tiny and the CPUs are shared. Both restored for the rest of the suite."""
    dtype, threads = torch.get_default_dtype(), torch.get_num_threads()
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    yield
    torch.set_default_dtype(dtype)
    torch.set_num_threads(threads)


def build_batch(layouts, rewards, groups=None, valid=None, vocab=7, seed=0):
    """A Batch from token-kind strings: 'p' prompt, 'o' tool output, 'a' sampled, 'i' prefilled
    (imitation); a run of a/i after p/o starts a new chunk. Right-padded with pad id 0."""
    g = torch.Generator().manual_seed(seed)
    B, T = len(layouts), max(len(s) for s in layouts)
    ids = torch.zeros(B, T, dtype=torch.long)
    att, lm, im = torch.zeros(B, T, dtype=torch.long), torch.zeros(B, T), torch.zeros(B, T)
    cid = torch.full((B, T), -1, dtype=torch.long)
    nch = torch.zeros(B, dtype=torch.long)
    for b, s in enumerate(layouts):
        k, prev = -1, "p"
        for t, c in enumerate(s):
            ids[b, t] = int(torch.randint(1, vocab, (1,), generator=g))
            att[b, t] = 1
            if c in "ai":
                if prev not in "ai":
                    k += 1
                cid[b, t] = k
                (lm if c == "a" else im)[b, t] = 1.0
            prev = c
        nch[b] = k + 1
    valid = torch.tensor(valid if valid is not None else [True] * B)
    reward = torch.tensor(rewards, dtype=torch.get_default_dtype())
    return Batch(input_ids=ids, attention_mask=att, loss_mask=lm, imitation_mask=im, chunk_ids=cid,
                 num_chunks=nch, infer_logprobs=torch.zeros(B, T), reward=reward, valid=valid,
                 group_id=torch.tensor(groups if groups is not None else list(range(B))),
                 policy_version=torch.zeros(B, dtype=torch.long), finish_reason=["submitted"] * B)


def chunk_index(layout):
    """Chunk k of each character of a layout string (None off chunks) and K, by hand."""
    k, prev, out = -1, "p", []
    for c in layout:
        if c in "ai" and prev not in "ai":
            k += 1
        out.append(k if c in "ai" else None)
        prev = c
    return out, k + 1


def rand_lp(batch, seed=1, scale=0.5):
    g = torch.Generator().manual_seed(seed)
    return -torch.rand(batch.input_ids.shape, generator=g) * scale - 0.1


# ------------------------------------------------------------------------------------------
# config and schema errors
# ------------------------------------------------------------------------------------------

def test_config_rejects_bad_values_with_named_key():
    with pytest.raises(ValueError, match="algo.loss"):
        AlgoConfig(loss="grpo")
    with pytest.raises(ValueError, match="algo.gamma"):
        AlgoConfig(gamma=0.0)
    with pytest.raises(ValueError, match="std_normalize"):
        AlgoConfig(baseline="none", std_normalize=True)
    with pytest.raises(config.ConfigError, match="unknown config key 'algo.lr'"):
        config.dataclass_from_dict(AlgoConfig, {"loss": "ppo", "lr": 1e-6}, "algo.")
    assert config.dataclass_from_dict(AlgoConfig, {"loss": "gspo", "gamma": 1.0}, "algo.").loss == "gspo"
    assert config.dataclass_from_dict(AlgoConfig, {"std_eps": "1e-6"}, "algo.").std_eps == 1e-6
    with pytest.raises(config.ConfigError, match="'algo.gamma' expects float"):
        config.dataclass_from_dict(AlgoConfig, {"gamma": "high"}, "algo.")


def test_batch_validate_names_the_broken_field():
    b = build_batch(["paa", "pa"], [1.0, 0.0])
    b.imitation_mask[0, 1] = 1.0
    with pytest.raises(ValueError, match="overlap"):
        b.validate()
    b = build_batch(["paa", "pa"], [1.0, 0.0])
    b.chunk_ids[0, 1] = -1
    with pytest.raises(ValueError, match="chunk_ids is -1"):
        b.validate()
    b = build_batch(["paa", "pa"], [1.0, float("nan")])
    with pytest.raises(ValueError, match="NaN on a row with valid=True"):
        b.validate()
    b = build_batch(["paa", "pa"], [1.0, 0.0])
    b.old_logprobs = torch.zeros(2, 2)
    with pytest.raises(ValueError, match="old_logprobs"):
        b.validate()


# ------------------------------------------------------------------------------------------
# log-probs from logits
# ------------------------------------------------------------------------------------------

def test_token_logprobs_alignment_entropy_and_temperature():
    torch.manual_seed(0)
    B, T, V, tau = 2, 5, 6, 0.7
    logits = torch.randn(B, T, V)
    ids = torch.randint(0, V, (B, T))
    lp, ent = logprobs.token_logprobs(logits, ids, temperature=tau, with_entropy=True, block_size=2)
    for b in range(B):
        assert lp[b, 0] == 0 and ent[b, 0] == 0
        for t in range(1, T):
            z = [math.exp(float(x) / tau) for x in logits[b, t - 1]]
            p = [v / sum(z) for v in z]
            assert lp[b, t].item() == pytest.approx(math.log(p[ids[b, t]]), abs=1e-10)
            assert ent[b, t].item() == pytest.approx(-sum(q * math.log(q) for q in p), abs=1e-10)


def test_token_logprobs_gradient_and_bf16():
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 5, requires_grad=True)
    ids = torch.randint(0, 5, (2, 4))
    assert torch.autograd.gradcheck(lambda x: logprobs.token_logprobs(x, ids, 1.3, block_size=3)[0],
                                    (logits,))
    assert torch.autograd.gradcheck(
        lambda x: logprobs.token_logprobs(x, ids, with_entropy=True, entropy_grad=True)[1], (logits,))
    lp16, _ = logprobs.token_logprobs(logits.detach().bfloat16(), ids)
    assert lp16.dtype == torch.float32
    assert torch.allclose(lp16.double(), logprobs.token_logprobs(logits.detach(), ids)[0], atol=0.05)


# ------------------------------------------------------------------------------------------
# advantages
# ------------------------------------------------------------------------------------------

REWARDS = [1.0, 0.0, 1.0, 0.5, float("nan"), 0.0, 0.0, 1.0]
GROUPS = [3, 3, 3, 3, 3, 9, 9, 5]
VALID = [True, True, True, True, False, True, True, True]


def expected_advantages(baseline, std_normalize, negative_reward):
    r = [(negative_reward if (v and x <= 0 and negative_reward is not None) else x) if v else 0.0
         for x, v in zip(REWARDS, VALID)]
    out = []
    for i, (x, g, v) in enumerate(zip(r, GROUPS, VALID)):
        if not v:
            out.append(0.0)
            continue
        if baseline == "none":
            out.append(x)
            continue
        peers = [r[j] for j in range(len(r)) if VALID[j] and (baseline == "batch" or GROUPS[j] == g)]
        if baseline == "rloo":
            others = [r[j] for j in range(len(r)) if VALID[j] and GROUPS[j] == g and j != i]
            a = x - sum(others) / len(others) if others else 0.0
        else:
            a = x - sum(peers) / len(peers)
        if std_normalize:
            a /= (statistics.stdev(peers) if len(peers) > 1 else 0.0) + 1e-6
        out.append(a)
    return out


@pytest.mark.parametrize("baseline,std_normalize,negative_reward", [
    ("grpo", False, None), ("grpo", True, None), ("rloo", False, None), ("rloo", True, -1.0),
    ("batch", True, None), ("batch", False, -0.5), ("none", False, None), ("none", False, -1.0)])
def test_baseline_advantages_match_hand_computation(baseline, std_normalize, negative_reward):
    valid = torch.tensor(VALID)
    r = algo.shaped_rewards(torch.tensor(REWARDS), valid, negative_reward)
    a = algo.baseline_advantages(r, valid, torch.tensor(GROUPS), baseline, std_normalize)
    assert a.tolist() == pytest.approx(expected_advantages(baseline, std_normalize, negative_reward),
                                       abs=1e-9)
    assert torch.isfinite(a).all()


def test_chunk_returns_discount_per_turn_and_zero_off_chunks():
    # row 0: 3 chunks (one prefilled); row 1: 1 chunk; row 2: invalid
    b = build_batch(["ppiioaaoaaa", "ppaa", "pa"], [1.0, 0.0, float("nan")], groups=[0, 0, 0],
                    valid=[True, True, False])
    cfg = AlgoConfig(baseline="grpo", gamma=0.5, negative_reward=None)
    adv = algo.compute_advantages(b, cfg)
    a_row = [0.5, -0.5]  # group mean 0.5 over the two valid rows
    for r, s in enumerate(["ppiioaaoaaa", "ppaa"]):
        chunks, K = chunk_index(s)
        for t, k in enumerate(chunks):
            want = 0.0 if k is None else a_row[r] * 0.5 ** (K - 1 - k)
            assert adv[r, t].item() == pytest.approx(want)
    assert (adv[2] == 0).all()
    assert adv[0, 2].item() == pytest.approx(0.125) and adv[0, 8].item() == pytest.approx(0.5)
    flat = algo.compute_advantages(b, AlgoConfig(baseline="grpo", gamma=1.0, negative_reward=None))
    assert flat[0][b.chunk_ids[0] >= 0].tolist() == [0.5] * 7


def test_unparsed_turns_get_no_positive_credit():
    # a success whose last two turns did not parse, and a failure with one unparsed turn
    b = build_batch(["paaoaaoaa", "paaoaa"], [1.0, 0.0], groups=[0, 0])
    b.unparsed = ((b.chunk_ids >= 1) & torch.tensor([[True], [False]])
                  | (b.chunk_ids == 0) & torch.tensor([[False], [True]]))
    cfg = AlgoConfig(baseline="grpo", gamma=0.5, negative_reward=None)
    credited = algo.compute_advantages(b, dataclasses.replace(cfg, credit_unparsed=True))
    adv = algo.compute_advantages(b, cfg)
    assert (credited[0][b.chunk_ids[0] >= 0] > 0).all() and (credited[1][b.chunk_ids[1] >= 0] < 0).all()
    assert torch.equal(adv[0], torch.where(b.unparsed[0], 0.0, credited[0]))  # positive: zeroed there
    assert adv[0][b.chunk_ids[0] == 0].gt(0).all()                          # the parsed turn keeps it
    assert torch.equal(adv[1], credited[1])  # a negative advantage still pushes an unparsed turn down
    b.unparsed = b.unparsed[:, :3]
    with pytest.raises(ValueError, match="Batch.unparsed"):
        algo.compute_advantages(b, cfg)


# ------------------------------------------------------------------------------------------
# masks: filters and mismatch
# ------------------------------------------------------------------------------------------

def test_zero_variance_filter_caps_the_filtered_share():
    # groups 0 (all 1), 1 (all 0), 2 (mixed), 3 (all 1, one invalid row) -> 3 zero-variance groups
    reward = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0, float("nan")])
    valid = torch.tensor([True] * 7 + [False])
    gid = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    keep, zv, filt = algo.zero_variance_filter(reward, valid, gid, max_share=0.5)
    assert keep.tolist() == [False, False, False, False, True, True, True, True]
    assert (zv, filt) == (0.75, 0.5)
    keep, _, filt = algo.zero_variance_filter(reward, valid, gid, max_share=1.0)
    assert keep.tolist() == [False] * 4 + [True, True, False, False] and filt == 0.75


def test_keep_rows_masks_long_negatives_and_invalid_rows():
    b = build_batch(["paaaaaa", "paa", "paaaaaa", "pa"], [0.0, 0.0, 1.0, 1.0],
                    valid=[True, True, True, False])
    b.reward[3] = float("nan")
    cfg = AlgoConfig(max_negative_tokens=4)  # baseline none, failures -> -1
    keep, m = algo.keep_rows(b, algo.compute_advantages(b, cfg), cfg)
    assert keep.tolist() == [False, True, True, False]  # long negative, short negative,
                                                        # long positive, invalid
    assert m["long_negative_frac"] == 0.25 and m["invalid_frac"] == 0.25


def test_negative_of_exactly_max_negative_tokens_is_kept():
    """The bound is inclusive: "longer than max_negative_tokens" masks 5 tokens, not 4. Catches an
    off-by-one (`>=` for `>`, or counting only sampled tokens) that silently drops every negative
    trajectory that just fits the configured budget."""
    b = build_batch(["paaa", "paaaa", "pppa", "paaaa"], [0.0, 0.0, 0.0, 1.0])  # 4, 5, 4, 5 tokens
    cfg = AlgoConfig(max_negative_tokens=4)  # baseline none, failures -> -1
    keep, m = algo.keep_rows(b, algo.compute_advantages(b, cfg), cfg)
    assert keep.tolist() == [True, False, True, True]  # the length counts prompt tokens too (row 2)
    assert m["long_negative_frac"] == 0.25


@pytest.mark.parametrize("loss_name", ["ppo", "gspo", "ipa"])
def test_huge_log_ratio_on_a_trained_token_stays_finite(loss_name):
    """A sampled, unmasked token whose π_θ/π_old is e^2000 (a stale π_old, a bf16 underflow) on a
    negative trajectory: the loss, its gradient and every metric stay finite, and the ratio the
    loss used is capped (at most e^20). Catches a log-ratio guard that is removed, applied only to
    masked-out tokens, or applied before a sum that overflows again (exp(inf) -> inf, inf*0 -> NaN)."""
    b = build_batch(["paaoaa", "paa"], [0.0, 1.0], groups=[0, 0])
    lp = rand_lp(b, seed=7).requires_grad_()
    b.old_logprobs = lp.detach().clone()
    b.old_logprobs[0, 1] -= 2000.0          # trained token (loss_mask 1, valid row, kept)
    b.infer_logprobs = b.old_logprobs.clone()  # no train-inference mismatch: nothing masks it
    cfg = AlgoConfig(loss=loss_name, baseline="grpo", negative_reward=-1.0)
    adv = algo.compute_advantages(b, cfg)
    assert adv[0, 1] < 0 and b.loss_mask[0, 1] == 1
    loss, m, _ = algo.policy_loss(lp, b, adv, cfg)
    loss.backward()
    assert math.isfinite(loss.item()) and torch.isfinite(lp.grad).all(), (loss, lp.grad)
    assert all(math.isfinite(v) for v in m.values()), m
    assert m["ratio_max"] <= math.exp(algo.MAX_LOG_RATIO) * (1 + 1e-9)


def test_drop_zero_advantage_averages_over_the_successes_alone():
    """REINFORCE on R in {0,1}: failures have advantage 0, so dropping them leaves the gradient's
    direction and divides by the number of successes instead of all rows (RAFT). A prefilled row
    keeps its imitation term whatever its reward."""
    b = build_batch(["paaoa", "paa", "paaaa", "pa", "pia"], [1.0, 0.0, 1.0, 0.0, 0.0])
    lp = rand_lp(b, seed=3)
    base = AlgoConfig(baseline="none", negative_reward=0.0, mismatch="none")
    drop = AlgoConfig(baseline="none", negative_reward=0.0, mismatch="none", drop_zero_advantage=True)
    adv = algo.compute_advantages(b, base)
    keep, m = algo.keep_rows(b, adv, drop)
    assert (keep.tolist() == [True, False, True, False, True]
            and m["zero_advantage_frac"] == pytest.approx(0.4))
    (l_all, _, _), (l_drop, _, _) = (algo.policy_loss(lp, b, adv, c) for c in (base, drop))
    assert l_drop.item() == pytest.approx(l_all.item() * 5 / 3)  # seq_mean_token_mean: 5 rows -> 3
    # by hand: the mean over rows 0, 2, 4 of each row's token-mean of -G·log π, G = γ^(K-1-k)
    # (+ NLL on the prefill; row 4's sampled token has G = 0 but counts in its row's mean)
    rows = [-(0.95 * lp[0, 1:3].sum() + lp[0, 4]) / 3, -(lp[2, 1:5].sum()) / 4, -(lp[4, 1]) / 2]
    assert l_drop.item() == pytest.approx(sum(float(r) for r in rows) / 3)


def test_mismatch_correction_token_and_chunk_modes():
    b = build_batch(["paaaoaa"], [1.0])
    old = torch.tensor([[0.0, -1.0, -0.2, -3.0, 0.0, -0.5, -0.5]])
    infer = torch.tensor([[0.0, -1.0 - math.log(7), -0.2, -3.0 + math.log(6), 0.0, -0.5 + 0.1, -0.5]])
    # per-token r = π_old/μ: [7, 1, 1/6] in chunk 0, [e^-0.1, 1] in chunk 1
    r = [7.0, 1.0, 1 / 6, math.exp(-0.1), 1.0]
    tok = [1, 2, 3, 5, 6]
    mask = b.loss_mask
    log_r = (old - infer) * mask
    keep, w = algo.mismatch_correction(log_r, mask, b.chunk_ids, "token_tis", 5.0)
    assert keep.eq(1).all() and [w[0, t].item() for t in tok] == pytest.approx([min(x, 5.0) for x in r])
    keep, w = algo.mismatch_correction(log_r, mask, b.chunk_ids, "token_mask", 5.0)
    assert [keep[0, t].item() for t in tok] == [0.0, 1.0, 0.0, 1.0, 1.0] and w.eq(1).all()
    keep, _ = algo.mismatch_correction(log_r, mask, b.chunk_ids, "token_mask", 5.0, floor=0.0)
    assert [keep[0, t].item() for t in tok] == [0.0, 1.0, 1.0, 1.0, 1.0]  # Eq. 6 as written: r ≤ H only
    # chunk 0 geometric mean (7·1·1/6)^(1/3) = 1.054 -> kept; make chunk 1 exceed H
    keep, _ = algo.mismatch_correction(log_r, mask, b.chunk_ids, "chunk_mask", 5.0)
    assert [keep[0, t].item() for t in tok] == [1.0] * 5
    infer2 = infer.clone()
    infer2[0, 5:] -= 2.0  # r = e^1.9, e^2 -> geometric mean e^1.95 > 5
    keep, _ = algo.mismatch_correction((old - infer2) * mask, mask, b.chunk_ids, "chunk_mask", 5.0)
    assert [keep[0, t].item() for t in tok] == [1.0, 1.0, 1.0, 0.0, 0.0]


# ------------------------------------------------------------------------------------------
# per-token losses: values by hand
# ------------------------------------------------------------------------------------------

def test_ppo_clip_loss_values_and_clip_flags():
    lp = torch.tensor([[0.0, -0.5, -0.5, -0.5, -0.5]])
    old = torch.tensor([[0.0, -1.0, -1.0, -0.4, -0.4]])      # r = e^.5, e^.5, e^-.1, e^-.1
    adv = torch.tensor([[0.0, 2.0, -2.0, 1.5, -1.5]])
    mask = torch.tensor([[0.0, 1, 1, 1, 1]])
    loss, ratio, lo, hi = algo.ppo_clip_loss(lp, old, adv, mask, 0.05, 0.28)
    for t in range(1, 5):
        r = math.exp(lp[0, t].item() - old[0, t].item())
        a = adv[0, t].item()
        want = -min(r * a, min(max(r, 0.95), 1.28) * a)
        assert loss[0, t].item() == pytest.approx(want) and ratio[0, t].item() == pytest.approx(r)
    assert hi[0].tolist() == [False, True, False, False, False]   # r=1.65 > 1.28 with A > 0
    assert lo[0].tolist() == [False, False, False, False, True]   # r=0.905 < 0.95 with A < 0


def test_gspo_sequence_ratio_value_and_gradient():
    lp = torch.tensor([[0.0, -0.3, -0.9, -0.6, 0.0], [0.0, -0.2, -0.2, 0.0, 0.0]], requires_grad=True)
    old = torch.tensor([[0.0, -0.4, -1.0, -0.5, 0.0], [0.0, -0.2, -1.0, 0.0, 0.0]])
    mask = torch.tensor([[0.0, 1, 1, 1, 0], [0.0, 1, 1, 0, 0]])
    adv = torch.tensor([[0.0, 1.0, 1.0, 1.0, 0.0], [0.0, 0.5, 0.5, 0.0, 0.0]])
    loss, ratio, lo, hi = algo.gspo_loss(lp, old, adv, mask, 0.1, 0.1)
    s0 = math.exp(((-0.3 + 0.4) + (-0.9 + 1.0) + (-0.6 + 0.5)) / 3)  # e^(0.1/3) inside the band
    s1 = math.exp((0.0 + 0.8) / 2)                                    # e^0.4 clipped at 1.1
    (loss * mask).sum().backward()
    for t in (1, 2, 3):
        assert ratio[0, t].item() == pytest.approx(s0) and loss[0, t].item() == pytest.approx(-s0)
        assert lp.grad[0, t].item() == pytest.approx(-s0)             # s_i·∇log π_θ(t)·A
    for t in (1, 2):
        assert (ratio[1, t].item() == pytest.approx(s1) and loss[1, t].item() == pytest.approx(-1.1 * 0.5)
                and hi[1, t])
        assert lp.grad[1, t].item() == 0.0                            # clipped: no gradient
    assert lp.grad[0, 4].item() == 0.0 and not hi[0].any() and not lo.any()


def test_ipa_chunk_loss_topr_split_by_hand():
    # row 0 positive (2 chunks), row 1 negative (2 chunks); π_old stale on row 1
    b = build_batch(["paaoaa", "paaoaa"], [1.0, 0.0])
    lp = torch.tensor([[0, -0.5, -0.7, 0, -0.2, -0.4], [0, -0.5, -0.7, 0, -0.2, -0.4]])
    old = torch.tensor([[0, -1.5, -1.7, 0, 0.0, 0.0], [0, -0.9, -0.9, 0, 0.4, 0.2]])
    cfg = AlgoConfig(gamma=0.5)  # baseline none, failure -> -1
    adv = algo.compute_advantages(b, cfg)
    loss, rho, lo, hi = algo.ipa_chunk_loss(lp, old, adv, b.loss_mask, b.chunk_ids)
    rho_want = {(0, 0): math.exp(1.0), (0, 1): math.exp(-0.3),
                (1, 0): math.exp(0.3), (1, 1): math.exp(-0.6)}
    G = {0: [0.5, 1.0], 1: [-0.5, -1.0]}
    for (r, k), toks in [((0, 0), (1, 2)), ((0, 1), (4, 5)), ((1, 0), (1, 2)), ((1, 1), (4, 5))]:
        w = 1.0 if r == 0 else min(rho_want[(r, k)], 1.0)
        for t in toks:
            assert rho[r, t].item() == pytest.approx(rho_want[(r, k)])
            assert loss[r, t].item() == pytest.approx(-w * G[r][k] * lp[r, t].item())
    assert hi[1].tolist() == [False, True, True, False, False, False] and not hi[0].any() and not lo.any()


def test_token_level_ipa_is_the_per_token_form():
    """algo.level token: every trained token is its own chunk, so IPA's loss is the per-token form
    by hand: G_t = γ^(N−1−i)·A for the i-th of a row's N trained tokens, w_t = 1 on T+ and
    min(π_θ/π_old, 1) of the token alone on T−, chunk_mask a token mask, seq-mean-token-mean.
    At level chunk the same batch gives another loss (the chunk means differ)."""
    b = build_batch(["paaoaa", "paaoaap"], [1.0, 0.0])
    lp = torch.tensor([[0, -0.5, -0.7, 0, -0.2, -0.4, 0], [0, -0.5, -0.7, 0, -0.2, -0.4, 0]],
                      requires_grad=True)
    b.old_logprobs = torch.tensor([[0, -1.5, -1.7, 0, 0.0, 0.0, 0], [0, -0.9, -0.2, 0, 0.4, 0.2, 0]])
    b.infer_logprobs = b.old_logprobs - torch.tensor([[0, 0, 0, 0, 0, 0, 0], [0, 0, 2.0, 0, 0, 0, 0]])
    cfg = AlgoConfig(gamma=0.5, level="token", mismatch_cap=5.0)  # baseline none, failure -> -1
    tb = algo.at_level(b, cfg.level)
    assert tb.chunk_ids.tolist() == [[-1, 0, 1, -1, 2, 3, -1]] * 2 and tb.num_chunks.tolist() == [4, 4]
    loss, _, _ = algo.policy_loss(lp, tb, algo.compute_advantages(tb, cfg), cfg)
    rows = []
    for r, A in [(0, 1.0), (1, -1.0)]:
        toks = [1, 2, 4, 5]
        terms = []
        for i, t in enumerate(toks):
            if b.old_logprobs[r, t] - b.infer_logprobs[r, t] > math.log(5.0):  # π_old/μ = e^2 > H: masked
                continue
            w = 1.0 if A > 0 else min(math.exp(lp[r, t].item() - b.old_logprobs[r, t].item()), 1.0)
            terms.append(-w * 0.5 ** (len(toks) - 1 - i) * A * lp[r, t].item())
        rows.append(sum(terms) / len(terms))
    assert loss.item() == pytest.approx(sum(rows) / 2)
    ccfg = dataclasses.replace(cfg, level="chunk")
    chunk_loss, _, _ = algo.policy_loss(lp, b, algo.compute_advantages(b, ccfg), ccfg)
    assert chunk_loss.item() != pytest.approx(loss.item())
    assert algo.at_level(b, "chunk") is b
    with pytest.raises(ValueError, match="algo.level"):
        AlgoConfig(level="turn")


def test_k3_kl_and_aggregation_modes_by_hand():
    lp, ref = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]])
    want = [math.exp(r - l) - (r - l) - 1 for l, r in [(-1.0, -1.5), (-2.0, -1.0)]]  # noqa: E741
    assert algo.k3_kl(lp, ref)[0].tolist() == pytest.approx(want)

    loss = torch.tensor([[9.0, 2.0, 0.0, 0.0], [9.0, 1.0, 3.0, 5.0], [7.0, 7.0, 7.0, 7.0]])
    mask = torch.tensor([[0.0, 1, 0, 0], [0.0, 1, 1, 1], [0.0, 0, 0, 0]])
    cases = {"token_mean": (2 + 1 + 3 + 5) / 4,
             "seq_mean_token_mean": (2 / 1 + (1 + 3 + 5) / 3) / 2,
             "seq_sum_norm": (2 + 1 + 3 + 5) / (2 * 10)}
    for agg, want in cases.items():
        den = algo.aggregation_denominator(mask, agg, norm_length=10)
        assert algo.aggregate(loss, mask, agg, den).item() == pytest.approx(want)
    with pytest.raises(ValueError, match="norm_length"):
        algo.aggregation_denominator(mask, "seq_sum_norm")


# ------------------------------------------------------------------------------------------
# policy_loss end to end: values, aggregation, metrics
# ------------------------------------------------------------------------------------------

def test_policy_loss_ppo_with_kl_entropy_tis_by_hand():
    b = build_batch(["paaoa", "paa"], [1.0, 0.0], groups=[0, 0])
    lp = torch.tensor([[0, -0.3, -0.6, 0, -0.2], [0, -0.7, -0.1, 0, 0]], requires_grad=True)
    b.old_logprobs = torch.tensor([[0, -0.4, -0.5, 0, -0.2], [0, -0.5, -0.2, 0, 0]])
    b.infer_logprobs = (b.old_logprobs
                        - torch.tensor([[0, 2.0, 0.0, 0, 0.1], [0, 0.0, -0.3, 0, 0]]) * b.loss_mask)
    ref = torch.tensor([[0, -0.5, -0.5, 0, -0.5], [0, -0.5, -0.5, 0, 0]])
    ent = torch.tensor([[0, 1.0, 2.0, 0, 3.0], [0, 0.5, 0.5, 0, 0]])
    cfg = AlgoConfig(loss="ppo", baseline="grpo", negative_reward=None, gamma=1.0, mismatch="token_tis",
                     mismatch_cap=2.0, agg="token_mean", kl_coef=0.1, entropy_coef=0.01)
    adv = algo.compute_advantages(b, cfg)
    loss, m, _ = algo.policy_loss(lp, b, adv, cfg, entropy=ent, ref_logprobs=ref)
    total, n = 0.0, 0
    for r, toks, a in [(0, (1, 2, 4), 0.5), (1, (1, 2), -0.5)]:
        for t in toks:
            x, o, mu = lp[r, t].item(), b.old_logprobs[r, t].item(), b.infer_logprobs[r, t].item()
            ratio = math.exp(x - o)
            pg = -min(ratio * a, min(max(ratio, 0.8), 1.28) * a) * min(math.exp(o - mu), 2.0)
            d = ref[r, t].item() - x
            total += pg + 0.1 * (math.exp(d) - d - 1) - 0.01 * ent[r, t].item()
            n += 1
    assert loss.item() == pytest.approx(total / n)
    assert m["tokens_trained"] == 5 and m["tis_clip_frac"] == pytest.approx(1 / 5)
    assert m["logprob_gap_abs"] == pytest.approx((2.0 + 0.1 + 0.3) / 5)
    assert m["entropy"] == pytest.approx((1 + 2 + 3 + 0.5 + 0.5) / 5)
    assert m["loss"] == pytest.approx(m["pg_loss"] + 0.1 * m["kl_loss"] - 0.01 * m["entropy_loss"])
    assert all(isinstance(v, float) and math.isfinite(v) for v in m.values())


@pytest.mark.parametrize("loss_name", ["ppo", "gspo", "ipa"])
def test_aggregation_modes_differ_exactly_as_documented(loss_name):
    b = build_batch(["paoaaa", "paaaaaaa", "pa"], [1.0, 0.0, 1.0], groups=[0, 0, 1])
    lp = rand_lp(b)
    b.old_logprobs = lp - 0.05 * b.loss_mask
    b.infer_logprobs = b.old_logprobs.clone()
    # policy_loss must use these clip bounds
    base = AlgoConfig(loss=loss_name, baseline="grpo", negative_reward=None, gamma=0.9,
                      clip_low=0.1, clip_high=0.3, seq_clip_low=1e-3, seq_clip_high=2e-3)
    adv = algo.compute_advantages(b, base)
    per_tok = {"ppo": algo.ppo_clip_loss, "gspo": algo.gspo_loss}.get(loss_name)
    if per_tok:
        clip = ((base.clip_low, base.clip_high) if loss_name == "ppo"
                else (base.seq_clip_low, base.seq_clip_high))
        tok_loss = per_tok(lp, b.old_logprobs, adv, b.loss_mask, *clip)[0]
    else:
        tok_loss = algo.ipa_chunk_loss(lp, b.old_logprobs, adv, b.loss_mask, b.chunk_ids)[0]
    rows = [[tok_loss[r, t].item() for t in range(b.input_ids.shape[1]) if b.loss_mask[r, t]]
            for r in range(3)]
    want = {"token_mean": sum(map(sum, rows)) / sum(map(len, rows)),
            "seq_mean_token_mean": sum(sum(x) / len(x) for x in rows) / 3,
            "seq_sum_norm": sum(map(sum, rows)) / (3 * 12)}
    got = {agg: algo.policy_loss(lp, b, adv,
                                 AlgoConfig(**{**base.__dict__, "agg": agg, "norm_length": 12}))[0].item()
           for agg in want}
    assert got == pytest.approx(want)
    assert len({round(v, 9) for v in got.values()}) == 3


# ------------------------------------------------------------------------------------------
# gradient checks
# ------------------------------------------------------------------------------------------

class TinyPolicy(torch.nn.Module):
    """Logits from a bigram table: enough to have real parameters shared across tokens."""
    def __init__(self, vocab=7, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.table = torch.nn.Parameter(torch.randn(vocab, vocab, generator=g))

    def forward(self, ids):
        return self.table[ids]


def reinforce_surrogate(policy, batch, weights):
    """Σ_b,t weights[b,t]·log π(ids[b,t] | ids[b,t-1]) by explicit loops (independent of algo)."""
    total = 0.0
    for b in range(batch.input_ids.shape[0]):
        for t in range(1, batch.input_ids.shape[1]):
            if weights[b][t] != 0.0:
                row = torch.log_softmax(policy.table[batch.input_ids[b, t - 1]], dim=-1)
                total = total + weights[b][t] * row[batch.input_ids[b, t]]
    return total


def grads(policy, loss):
    policy.zero_grad()
    loss.backward()
    return policy.table.grad.clone()


def test_ipa_gradient_is_reinforce_weighted_by_chunk_returns_when_on_policy():
    b = build_batch(["paaoaaoa", "paaaoa", "paoaaa", "ppaa"], [1.0, 0.0, 1.0, 0.0], groups=[0, 0, 1, 1])
    pol = TinyPolicy()
    cfg = AlgoConfig(gamma=0.8, agg="token_mean", mismatch="none")  # baseline none, failures -> -1
    lp, _ = logprobs.token_logprobs(pol(b.input_ids), b.input_ids)
    b.old_logprobs = lp.detach()  # ρ = 1
    adv = algo.compute_advantages(b, cfg)
    g_ipa = grads(pol, algo.policy_loss(lp, b, adv, cfg)[0])
    # G_k = γ^(K-1-k)·R by hand
    weights = []
    for r, s in enumerate(["paaoaaoa", "paaaoa", "paoaaa", "ppaa"]):
        R = 1.0 if b.reward[r] > 0 else -1.0
        chunks, K = chunk_index(s)
        w = [0.0 if k is None else R * 0.8 ** (K - 1 - k) for k in chunks]
        weights.append(w + [0.0] * (b.input_ids.shape[1] - len(w)))
    n = float(b.loss_mask.sum())
    g_ref = grads(pol, -reinforce_surrogate(pol, b, weights) / n)
    assert torch.allclose(g_ipa, g_ref, atol=1e-12) and g_ref.abs().sum() > 0


def test_ipa_positive_side_carries_no_importance_weight():
    b = build_batch(["paaoaa", "paaoaa"], [1.0, 0.0], groups=[0, 1])
    cfg = AlgoConfig(mismatch="none", agg="token_mean", gamma=1.0)
    adv = algo.compute_advantages(b, cfg)

    def lp_grad(old_shift):
        lp = rand_lp(b, seed=3).requires_grad_()
        b.old_logprobs = lp.detach() + old_shift * b.loss_mask
        algo.policy_loss(lp, b, adv, cfg)[0].backward()
        return lp.grad

    on_policy = lp_grad(0.0)
    stale = lp_grad(torch.tensor([[0, 0.7, 0.1, 0, -2.0, 0.3], [0, 0.4, 0.6, 0, -0.9, -0.1]]))
    assert torch.equal(on_policy[0], stale[0])               # positive row: unchanged by π_old
    # negative row: chunk 0 has ρ = e^-0.5 -> scaled; chunk 1 has ρ = e^0.5 -> clipped to 1
    assert stale[1, 1:3].tolist() == pytest.approx((on_policy[1, 1:3] * math.exp(-0.5)).tolist())
    assert stale[1, 4:6].tolist() == pytest.approx(on_policy[1, 4:6].tolist())


def test_mismatch_masked_chunk_gets_exactly_zero_gradient():
    b = build_batch(["paaoaaaoa", "paaoa"], [1.0, 0.0], groups=[0, 0])
    lp = rand_lp(b, seed=4).requires_grad_()
    b.old_logprobs = lp.detach().clone()
    b.infer_logprobs = b.old_logprobs.clone()
    b.infer_logprobs[0, 4:7] -= 3.0                    # chunk 1 of row 0: π_old/μ = e^3 > H = 5
    cfg = AlgoConfig()                                 # ipa + chunk_mask
    adv = algo.compute_advantages(b, cfg)
    loss, m, _ = algo.policy_loss(lp, b, adv, cfg)
    loss.backward()
    assert torch.equal(lp.grad[0, 4:7], torch.zeros(3))
    assert (lp.grad[b.loss_mask.bool()].ne(0).sum()) == int(b.loss_mask.sum()) - 3
    assert m["mismatch_chunk_frac"] == pytest.approx(1 / 5)
    assert m["mismatch_token_frac"] == pytest.approx(3 / 9) and m["masked_token_frac"] == pytest.approx(3 / 9)


@pytest.mark.parametrize("loss_name", ["ppo", "gspo", "ipa"])
def test_all_masked_batch_gives_finite_zero_loss(loss_name):
    cfg = AlgoConfig(loss=loss_name, kl_coef=0.1, entropy_coef=0.1)
    for b in [build_batch(["paa", "pa"], [float("nan")] * 2, valid=[False, False]),
              build_batch(["ppp", "pp"], [1.0, 0.0])]:      # valid rows, no sampled tokens
        lp = rand_lp(b).requires_grad_()
        b.old_logprobs = lp.detach() - 30.0                 # absurd ratios must not leak NaN
        ent, ref = torch.rand_like(lp), lp.detach() + 50.0
        adv = algo.compute_advantages(b, cfg)
        loss, m, _ = algo.policy_loss(lp, b, adv, cfg, entropy=ent, ref_logprobs=ref)
        loss.backward()
        assert loss.item() == 0.0 and torch.equal(lp.grad, torch.zeros_like(lp))
        assert all(math.isfinite(v) for v in m.values())


@pytest.mark.parametrize("loss_name", ["ppo", "gspo", "ipa"])
def test_invalid_rows_give_zero_gradient_and_change_nothing(loss_name):
    b = build_batch(["paaoa", "paa", "paaaa", "pa"], [1.0, float("nan"), 0.0, 1.0], groups=[0, 0, 0, 1],
                    valid=[True, False, True, True])
    lp = rand_lp(b, seed=5).requires_grad_()
    b.old_logprobs = lp.detach() + 0.1 * b.loss_mask
    b.infer_logprobs = b.old_logprobs.clone()
    b.infer_logprobs[1] = 99.0                         # garbage on the invalid row must not matter
    ref = lp.detach() - 0.3                            # KL gives every trained token a gradient
    cfg = AlgoConfig(loss=loss_name, baseline="grpo", negative_reward=None, kl_coef=0.1)
    adv = algo.compute_advantages(b, cfg)
    loss, m, _ = algo.policy_loss(lp, b, adv, cfg, ref_logprobs=ref)
    loss.backward()
    assert torch.equal(lp.grad[1], torch.zeros(5)) and lp.grad[0].abs().sum() > 0
    sub, _ = learner.select_rows(b, [0, 2, 3])
    sub_loss, _, _ = algo.policy_loss(lp.detach()[[0, 2, 3]], sub, algo.compute_advantages(sub, cfg), cfg,
                                   ref_logprobs=ref[[0, 2, 3]])
    assert loss.item() == pytest.approx(sub_loss.item())
    assert m["invalid_frac"] == 0.25 and m["logprob_gap_abs"] == 0.0


def test_imitation_term_is_discount_weighted_nll_on_prefilled_tokens():
    b = build_batch(["piioiioaa", "paa"], [0.0, 1.0], groups=[0, 0])
    lp = rand_lp(b, seed=6).requires_grad_()
    cfg = AlgoConfig(gamma=0.5, imitation_coef=0.3, rl_coef=2.0, agg="token_mean", mismatch="none")
    adv = algo.compute_advantages(b, cfg)
    loss, m, _ = algo.policy_loss(lp, b, adv, cfg)
    loss.backward()
    n = 2 + 2 + 2 + 2  # imitation 4 + sampled 4 tokens
    for t, k in [(1, 0), (2, 0), (4, 1), (5, 1)]:      # K = 3
        assert lp.grad[0, t].item() == pytest.approx(-0.3 * 0.5 ** (2 - k) / n)
    for t in (7, 8):                                   # sampled chunk of a failure (R -> -1), ρ = 1
        assert lp.grad[0, t].item() == pytest.approx(2.0 * 1.0 / n)
    assert lp.grad[1, 1].item() == pytest.approx(-2.0 / n)
    assert m["imitation_loss"] > 0 and m["tokens_trained"] == n
    off = AlgoConfig(**{**cfg.__dict__, "imitation_coef": 0.0})
    assert algo.policy_loss(lp.detach(), b, adv, off)[1]["tokens_trained"] == 4


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_sum_norm"])
def test_micro_batches_add_up_to_the_full_batch(agg):
    layouts = ["paaoaa", "paaaaaaa", "pa", "paoa", "ppaaaoa", "pa"]
    b = build_batch(layouts, [1.0, 0.0, 0.0, 0.0, 1.0, 1.0], groups=[0, 0, 1, 1, 2, 2])
    pol = TinyPolicy()
    cfg = AlgoConfig(agg=agg, filter_zero_variance=True, max_filtered_share=0.5, max_negative_tokens=7,
                     entropy_coef=0.01, norm_length=16)
    with torch.no_grad():
        b.old_logprobs = logprobs.token_logprobs(pol(b.input_ids), b.input_ids)[0] - 0.1 * b.loss_mask
    b.infer_logprobs = b.old_logprobs.clone()
    b.infer_logprobs[4, 5] -= 5.0                      # one chunk masked by mismatch
    adv = algo.compute_advantages(b, cfg)
    lp, ent = logprobs.token_logprobs(pol(b.input_ids), b.input_ids, with_entropy=True, entropy_grad=True)
    full, fm, _ = algo.policy_loss(lp, b, adv, cfg, entropy=ent)
    g_full = grads(pol, full)
    assert fm["filtered_group_share"] == pytest.approx(1 / 3)  # group 1 is all failures

    keep, _ = algo.keep_rows(b, adv, cfg)
    rows, probe, known = algo.rows_that_train(b, adv, keep, cfg)
    # entropy: every kept row trains
    assert known is None and not probe and rows == [i for i in range(len(b)) if keep[i]]
    total, masks = 0.0, torch.zeros_like(b.loss_mask)
    pol.zero_grad()
    for idx in [[0, 2, 4], [1, 3, 5]]:                 # groups split across micro-batches
        mb, ex = learner.select_rows(b, idx, {"adv": adv})
        lp, ent = logprobs.token_logprobs(pol(mb.input_ids), mb.input_ids, with_entropy=True,
                                          entropy_grad=True)
        loss, _, mask = algo.policy_loss(lp, mb, ex["adv"], cfg, entropy=ent, keep=keep[idx], denominator=1.0)
        loss.backward()
        total += loss.item()
        masks[idx, :mask.shape[1]] = mask.to(masks.dtype)
    den = algo.aggregation_denominator(masks, cfg.agg, cfg.norm_length)
    assert total / den == pytest.approx(full.item())
    assert torch.allclose(pol.table.grad / den, g_full, atol=1e-12)


def test_rows_that_train_leave_out_rows_without_signal_and_keep_their_tokens_in_the_denominator():
    """REINFORCE on R in {0, 1} (no baseline): failures have advantage 0 everywhere, so they are not
    forwarded, but the whole-batch mask still counts their tokens (a wrong denominator would scale
    every update by the success rate)."""
    b = build_batch(["paa", "paaa", "pa"], [1.0, 0.0, 1.0])
    b.old_logprobs = b.infer_logprobs.clone()
    cfg = AlgoConfig(baseline="none", negative_reward=0.0, mismatch="none", agg="token_mean")
    adv = algo.compute_advantages(b, cfg)
    keep, _ = algo.keep_rows(b, adv, cfg)
    rows, probe, known = algo.rows_that_train(b, adv, keep, cfg)
    assert rows == [0, 2] and not probe and known is not None
    assert algo.aggregation_denominator(known, cfg.agg) == float(b.loss_mask.sum())
    b.old_logprobs = None  # a mismatch mask needs π_old: without it,
                           # the failure is forwarded for its mask alone
    assert (algo.rows_that_train(b, adv, keep, AlgoConfig(baseline="none", negative_reward=0.0))
            == ([0, 2], [1], None))


def test_policy_loss_errors_name_the_missing_input():
    b = build_batch(["paa"], [1.0])
    lp = rand_lp(b)
    adv = algo.compute_advantages(b, AlgoConfig())
    with pytest.raises(ValueError, match="ref_logprobs"):
        algo.policy_loss(lp, b, adv, AlgoConfig(kl_coef=0.1))
    with pytest.raises(ValueError, match="entropy"):
        algo.policy_loss(lp, b, adv, AlgoConfig(entropy_coef=0.1))
    with pytest.raises(ValueError, match="advantages has shape"):
        algo.policy_loss(lp, b, adv[:, :2], AlgoConfig())


# ------------------------------------------------------------------------------------------
# the paper's equations, exactly (issue 18)
# ------------------------------------------------------------------------------------------

def test_chunk_returns_are_exact_in_the_rewards_float64():
    """Bug: chunk returns computed γ^(K−1−k) in float32 whatever the reward dtype, so Eq. 7's
    G_k = γ^Δ(k)·A was off by ~1e-7 relative in a float64 batch."""
    K = 40
    b = build_batch(["p" + "ao" * K, "pa"], [1.0, 0.0], groups=[0, 0])
    for gamma in (0.95, 0.9, 0.7):
        adv = algo.compute_advantages(b, AlgoConfig(baseline="grpo", gamma=gamma, negative_reward=None))
        assert adv.dtype == torch.float64
        chunks, _ = chunk_index("p" + "ao" * K)
        got = [adv[0, t].item() for t, k in enumerate(chunks) if k is not None]
        want = [0.5 * gamma ** (K - 1 - k) for k in chunks if k is not None]  # A = 1 − group mean 0.5
        assert got == want                             # bit for bit


def test_one_extreme_token_masks_its_chunk():
    """Bug: token log-ratios were clamped to ±20 before the chunk's geometric mean, so a chunk of 20
    tokens with one token at π_old/μ = e^100 averaged to e^1 < H and stayed in: the very token the
    chunk mask exists for un-masked its chunk."""
    b = build_batch(["p" + "a" * 20], [1.0])
    b.old_logprobs = torch.zeros_like(b.loss_mask) - 0.5 * b.loss_mask
    b.infer_logprobs = b.old_logprobs.clone()
    b.infer_logprobs[0, 3] -= 100.0                   # geometric mean of π_old/μ: e^5 > H = 5
    log_r = (b.old_logprobs - b.infer_logprobs) * b.loss_mask
    keep, _ = algo.mismatch_correction(log_r, b.loss_mask, b.chunk_ids, "chunk_mask", 5.0, floor=0.0)
    assert keep[0, 1:].eq(0).all()
    _, m, _ = algo.policy_loss(b.old_logprobs.clone(), b, algo.compute_advantages(b, AlgoConfig()),
                               AlgoConfig())
    assert m["mismatch_chunk_frac"] == 1.0


def test_chunk_ratio_is_the_unclamped_geometric_mean():
    """Bug: the same pre-mean clamp set IPA's ρ_c (Eq. 8) of a chunk with one token at
    π_θ/π_old = e^-100 among 19 at 1 to e^-1 instead of e^-5, so T− chunks got 55 times the weight."""
    b = build_batch(["p" + "a" * 20], [0.0])
    lp = torch.zeros_like(b.loss_mask) - 0.5 * b.loss_mask
    old = lp.clone()
    old[0, 7] += 100.0
    adv = algo.compute_advantages(b, AlgoConfig())
    _, rho, _, _ = algo.ipa_chunk_loss(lp, old, adv, b.loss_mask, b.chunk_ids)
    assert rho[0, 1:].tolist() == [math.exp(-100.0 / 20)] * 20
    _, ratio, _, _ = algo.gspo_loss(lp, old, adv, b.loss_mask, 0.1, 0.1)
    assert ratio[0, 1].item() == pytest.approx(math.exp(-5.0), rel=1e-12)  # GSPO's sequence ratio too


def test_dr_grpo_constant_leaves_valid_rows_unchanged_by_a_padded_invalid_row():
    """Bug: seq_sum_norm (Dr.GRPO) divided by the batch's padded length T, prompt and tool tokens
    included, so one long invalid row in the batch rescaled every valid row's loss."""
    cfg = AlgoConfig(loss="ppo", baseline="grpo", agg="seq_sum_norm", norm_length=64, mismatch="none")
    rows, rewards = ["paaoaa", "paaa", "pa"], [1.0, 0.0, 1.0]
    b = build_batch(rows, rewards, groups=[0, 0, 1])
    bigger = build_batch(rows + ["p" * 40 + "a" * 9], rewards + [float("nan")], groups=[0, 0, 1, 1],
                         valid=[True, True, True, False])
    losses = []
    for batch in (b, bigger):
        lp = rand_lp(batch, seed=9)[:, :]
        lp[:3, :6] = rand_lp(b, seed=9)              # the same log-probs on the valid rows
        loss, _, _ = algo.policy_loss(lp, batch, algo.compute_advantages(batch, cfg), cfg)
        losses.append(loss.item())
    assert losses[0] == losses[1] and losses[0] != 0.0
    with pytest.raises(ValueError, match="algo.norm_length"):
        AlgoConfig(agg="seq_sum_norm")


def test_topr_split_on_reward_as_eq5_or_on_advantage():
    """Bug: Eq. 5 splits T+/T− on the reward, algo.py only on the advantage's sign: a success
    below its group's mean (reward 0.5 beside 1.0) got T−'s importance weight [ρ]₀¹."""
    b = build_batch(["paa", "paa"], [0.5, 1.0], groups=[0, 0])
    lp = torch.tensor([[0.0, -0.5, -0.7], [0.0, -0.5, -0.7]])
    old = lp + torch.tensor([[0.0, 0.5, 0.5], [0.0, 0.0, 0.0]])  # ρ_c = e^-0.5 on row 0
    b.old_logprobs, b.infer_logprobs = old, old.clone()
    for split, w in [("reward", 1.0), ("advantage", math.exp(-0.5))]:
        cfg = AlgoConfig(baseline="grpo", negative_reward=None, gamma=1.0, split_on=split,
                         agg="token_mean", mismatch="none")
        adv = algo.compute_advantages(b, cfg)          # row 0: A = −0.25
        lpg = lp.clone().requires_grad_()
        algo.policy_loss(lpg, b, adv, cfg)[0].backward()
        assert lpg.grad[0, 1:].tolist() == pytest.approx([0.25 * w / 4] * 2, rel=1e-12)
    with pytest.raises(ValueError, match="algo.split_on"):
        AlgoConfig(split_on="sign")


def test_defaults_are_the_papers_one_sided_reward_split():
    """Bug: the module said its defaults were the paper's while the masks were two-sided (Eq. 6 is
    r ≤ H only) and T+/T− split on the advantage (Eq. 5 splits on the reward)."""
    cfg = AlgoConfig()
    assert (cfg.loss, cfg.mismatch, cfg.mismatch_floor, cfg.split_on, cfg.mismatch_cap) == \
        ("ipa", "chunk_mask", 0.0, "reward", 5.0)
    b = build_batch(["paa"], [1.0])
    b.old_logprobs = torch.tensor([[0.0, -3.0, -3.0]])
    b.infer_logprobs = torch.tensor([[0.0, -0.5, -0.5]])  # π_old/μ = e^-2.5 < 1/H: kept by Eq. 6
    _, m, _ = algo.policy_loss(b.old_logprobs.clone(), b, algo.compute_advantages(b, cfg), cfg)
    assert m["mismatch_chunk_frac"] == 0.0


@pytest.mark.parametrize("loss_name", ["ipa", "gspo"])
def test_chunk_ratio_under_token_mask_is_over_the_whole_chunk(loss_name):
    """Bug: with mismatch token_mask, IPA's ρ_c (Eq. 8) was the geometric mean of π_θ/π_old over
    the chunk's kept tokens, not over the chunk: log-ratios [0.4, −0.4, −1.0] with the third token
    masked gave ρ_c = 1 instead of e^(−1/3), and a T− chunk its full weight. GSPO's sequence
    ratio s_i is over the whole response in the same way."""
    b = build_batch(["paaa"], [0.0])                      # T−: ρ_c weights the row
    lp = torch.tensor([[0.0, -1.0, -1.0, -1.0]])
    b.old_logprobs = lp - torch.tensor([[0.0, 0.4, -0.4, -1.0]])
    b.infer_logprobs = b.old_logprobs.clone()
    b.infer_logprobs[0, 3] -= 2.0                         # π_old/μ = e^2 > H = 5: token_mask drops it
    cfg = AlgoConfig(loss=loss_name, mismatch="token_mask")
    lpg = lp.clone().requires_grad_()
    loss, m, _ = algo.policy_loss(lpg, b, algo.compute_advantages(b, cfg), cfg)
    assert m["mismatch_token_frac"] == pytest.approx(1 / 3)
    assert m["ratio_mean"] == pytest.approx(math.exp(-1 / 3), rel=1e-12)
    if loss_name == "ipa":  # −w·G·log π per kept token, G = −1, w = ρ_c, mean over the 2 kept tokens
        loss.backward()
        assert lpg.grad[0].tolist() == pytest.approx([0.0, math.exp(-1 / 3) / 2, math.exp(-1 / 3) / 2, 0.0],
                                                     rel=1e-12)


def test_k3_kl_keeps_its_gradient_where_the_policy_drifted_furthest():
    """Bug: k3_kl clamped d = log π_ref − log π_θ itself to ±20, so where d < −20 (π_θ far above
    π_ref) its value was stuck at 19 and its gradient was 0: the KL term let go exactly there.
    Only the exponent needs the clamp (e^d cannot overflow for d < 0)."""
    lp = torch.tensor([[-1.0, -1.0, -1.0]], requires_grad=True)
    ref = torch.tensor([[-31.0, -1.5, 30.0]])             # d = −30, −0.5, +31
    kl = algo.k3_kl(lp, ref)
    assert kl[0, :2].tolist() == pytest.approx([math.exp(-30) + 29, math.exp(-0.5) - 0.5], rel=1e-12)
    assert math.isfinite(kl[0, 2].item())
    kl.sum().backward()                                   # d k3 / d lp = 1 − e^d
    assert lp.grad[0, :2].tolist() == pytest.approx([1 - math.exp(-30), 1 - math.exp(-0.5)], rel=1e-12)
    assert math.isfinite(lp.grad[0, 2].item())
