"""logprobs.py's support and blocks: the top-k / top-p support from torch.topk equals the
full-vocabulary sort it replaced, mask for mask, under both tie rules; the output head's blocks
are sized from the device and never change a log-prob; entropy is the distribution's."""
import pytest
import torch

import logprobs
import memory_plan


def sorted_support(x, top_k=-1, top_p=1.0, rule="ties"):
    """The support as a full-vocabulary sort per position computes it: the reference the topk
    implementation must equal (the engine's rules, logprobs.topk_rule)."""
    V = x.shape[-1]
    if rule == "exact":
        xs, idx = x.sort(dim=-1, descending=True, stable=True)
        keep = torch.ones_like(xs, dtype=torch.bool)
        if 0 < top_k < V:
            keep[..., top_k:] = False
        if top_p < 1.0:
            p = xs.masked_fill(~keep, float("-inf")).softmax(-1)
            keep &= p.cumsum(-1) - p < top_p
            keep[..., 0] = True
        return torch.zeros_like(keep).scatter(-1, idx, keep)
    if top_p >= 1.0:
        keep = torch.ones_like(x, dtype=torch.bool)
        return x >= x.topk(top_k, dim=-1).values[..., -1:] if 0 < top_k < V else keep
    xs, idx = x.sort(dim=-1)
    keep = torch.ones_like(xs, dtype=torch.bool)
    if 0 < top_k < V:
        keep = xs >= xs[..., V - top_k:V - top_k + 1]
    drop = xs.masked_fill(~keep, float("-inf")).softmax(-1).cumsum(-1) <= 1 - top_p
    drop[..., -1] = False
    return torch.zeros_like(keep).scatter(-1, idx, keep & ~drop)


def logits_cases():
    g = torch.Generator().manual_seed(0)
    tied = (torch.randn(3, 50, 1000, generator=g) * 3).bfloat16().float()  # bf16: many ties at the k-th
    coarse = torch.randint(0, 6, (2, 40, 64), generator=g).float()  # rows of ties, top-p's edge inside one
    return {"bf16 ties": tied, "fp32": torch.randn(2, 60, 1000, generator=g) * 2, "coarse ties": coarse}


@pytest.mark.parametrize("rule", ["exact", "ties"])
def test_topk_support_equals_the_sorted_support_mask_for_mask(rule):
    for name, x in logits_cases().items():
        V = x.shape[-1]
        for top_k, top_p in [(50, 1.0), (1, 1.0), (20, 0.9), (50, 0.5), (-1, 0.9), (-1, 0.3), (V, 1.0),
                             (V + 7, 0.8), (V - 1, 0.95), (-1, 1.0), (7, 0.0001)]:
            want = sorted_support(x, top_k, top_p, rule)
            got = logprobs.sampling_support(x, top_k, top_p, rule)
            assert torch.equal(got, want), (name, rule, top_k, top_p, (got != want).sum())
    x = logits_cases()["bf16 ties"]
    ties, exact = (logprobs.sampling_support(x, 50, rule=r) for r in ("ties", "exact"))
    assert (ties.sum(-1) > 50).sum() > 10 and (exact.sum(-1) == 50).all()  # the cases do tie at the k-th


def test_head_blocks_are_sized_from_the_device_and_change_no_logprob():
    GiB = 2 ** 30
    assert memory_plan.head_block_logits(0, "cpu") == 2 ** 26
    assert memory_plan.head_block_logits(0, "cuda", free_bytes=100 * GiB) == 2 ** 27  # capped
    assert memory_plan.head_block_logits(0, "cuda", free_bytes=20 * GiB) == 2 ** 25  # 1/16 of free, 24 B each
    assert memory_plan.head_block_logits(0, "cuda", free_bytes=GiB // 4) == 2 ** 19  # a crowded card
    assert memory_plan.head_block_logits(12345, "cuda", free_bytes=100 * GiB) == 12345  # the key wins
    assert memory_plan.head_block_logits(0, "cuda", free_bytes=0) == 2 ** 16  # never below one small block

    g = torch.Generator().manual_seed(1)
    h = torch.randn(2, 33, 16, generator=g, dtype=torch.float64)
    W = torch.randn(100, 16, generator=g, dtype=torch.float64)
    ids = torch.randint(0, 100, (2, 33), generator=g)
    outs = []
    for block_logits in (1, 200, 2 ** 24):  # one position a block, several, the whole sequence at once
        hh, WW = h.clone().requires_grad_(), W.clone().requires_grad_()
        lp, ent = logprobs.linear_token_logprobs(hh, WW, ids, 0.7, True, True, top_k=30, top_p=0.9,
                                                 block_logits=block_logits)
        (lp.sum() + ent.sum()).backward()
        outs.append((lp.detach(), ent.detach(), hh.grad, WW.grad))
    for got in outs[1:]:  # the head's matmul is blocked differently: equal to fp64 rounding
        for a, b in zip(got, outs[0]):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.7}, {"top_p": 0.8},
                                      {"temperature": 1.3, "top_k": 30, "top_p": 0.9}])
def test_the_heads_blocks_and_their_backward_equal_autograd_on_the_full_logits(sampling):
    """linear_token_logprobs' own backward (dlp/dz = onehot − p, dH/dz = −p (log p + H), written
    over each block's logits made again) gives the log-probs, the entropy and the gradients of the
    hidden states and of the head's weight that autograd gives through token_logprobs of h @ Wᵀ;
    with the entropy a metric (no gradient) or a loss term; and a frozen head gets no gradient."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 100, (2, 9), generator=g)
    weights = (torch.arange(9) - 3.0).double()  # a loss that weighs positions differently, some negatively
    for entropy_grad in (False, True):
        h = torch.randn(2, 9, 16, generator=g, dtype=torch.float64, requires_grad=True)
        W = torch.randn(100, 16, generator=g, dtype=torch.float64, requires_grad=True)
        got = logprobs.linear_token_logprobs(h, W, ids, with_entropy=True, entropy_grad=entropy_grad,
                                             block_logits=300, **sampling)  # 3 positions a block
        want = logprobs.token_logprobs(h @ W.T, ids, with_entropy=True, entropy_grad=entropy_grad, **sampling)
        grads = []
        for lp, ent in (got, want):
            assert ent.requires_grad == entropy_grad
            loss = (lp * weights).sum() + (ent.sum() if entropy_grad else 0)
            grads.append(torch.autograd.grad(loss, (h, W)))
        for a, b in zip([*got, *grads[0]], [*want, *grads[1]]):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    if not sampling.get("top_k") and not sampling.get("top_p"):  # no support edge to step over
        assert torch.autograd.gradcheck(lambda hh, WW: logprobs.linear_token_logprobs(
            hh, WW, ids, with_entropy=True, entropy_grad=True, block_logits=300, **sampling), (h, W))
    frozen = W.detach()
    lp, _ = logprobs.linear_token_logprobs(h, frozen, ids, block_logits=300, **sampling)
    lp.sum().backward()
    assert frozen.grad is None and h.grad is not None


def test_positions_left_out_of_the_head_are_0_and_change_nothing_at_the_others():
    """With `positions`, only those go through the head: their log-probs, entropies and the
    gradients of a loss over them equal the whole sequence's, and the others are 0."""
    g = torch.Generator().manual_seed(5)
    h = torch.randn(3, 12, 16, generator=g, dtype=torch.float64, requires_grad=True)
    W = torch.randn(80, 16, generator=g, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 80, (3, 12), generator=g)
    at = torch.rand(3, 12, generator=g) > 0.6
    at[2] = False  # a row with no position at all
    read = at.clone()
    read[:, 0] = False  # position 0 has no token before it: 0 either way
    outs = []
    for positions in (at, None):
        lp, ent = logprobs.linear_token_logprobs(h, W, ids, 0.8, True, True, top_k=40, block_logits=160,
                                                 positions=positions)
        outs.append((lp, ent, *torch.autograd.grad(((lp + ent) * read).sum(), (h, W))))
    (lp, ent, gh, gw), want = outs
    for a, b in zip((lp[read], ent[read], gh, gw), (want[0][read], want[1][read], *want[2:])):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert (lp[~read] == 0).all() and (ent[~read] == 0).all() and read.sum() > 5


def test_the_head_under_bf16_autocast_computes_in_bf16_as_its_linear_would():
    """Under autocast the head's matmuls run in bf16, fp32 weights or not, as F.linear's would: the
    log-probs and gradients equal autograd's through the autocast F.linear to bf16 rounding, and the
    weight's gradient comes back in the weight's fp32."""
    g = torch.Generator().manual_seed(4)
    h = torch.randn(2, 40, 64, generator=g, requires_grad=True)
    W = (torch.randn(3000, 64, generator=g) / 8).requires_grad_()
    ids = torch.randint(0, 3000, (2, 40), generator=g)
    outs = []
    for fused in (True, False):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if fused:
                lp, _ = logprobs.linear_token_logprobs(h, W, ids, block_logits=3000 * 7)
            else:
                lp, _ = logprobs.token_logprobs(torch.nn.functional.linear(h, W), ids)
        outs.append((lp, *torch.autograd.grad(lp.sum(), (h, W))))
    for a, b in zip(*outs):
        assert a.dtype == b.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=0.02, atol=0.02 * float(b.detach().abs().max()))


def test_entropy_from_the_log_softmax_is_the_distributions():
    """H = lse − Σ p·z over the support, with p = exp(z − lse) reused from the log-prob's lse, equals
    the entropy of the renormalised distribution computed directly, and its gradient too."""
    g = torch.Generator().manual_seed(2)
    z = (torch.randn(2, 9, 50, generator=g, dtype=torch.float64) * 2).requires_grad_()
    ids = torch.randint(0, 50, (2, 9), generator=g)
    lp, ent = logprobs.token_logprobs(z, ids, 1.5, True, True, top_k=20, top_p=0.8)
    keep = logprobs.sampling_support(z.detach()[:, :-1] / 1.5, 20, 0.8)
    keep.scatter_(-1, ids[:, 1:, None], True)
    q = (z[:, :-1] / 1.5).masked_fill(~keep, float("-inf")).log_softmax(-1)
    want = -(q.exp() * q.masked_fill(~keep, 0.0)).sum(-1)
    torch.testing.assert_close(ent[:, 1:], want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lp[:, 1:], q.gather(-1, ids[:, 1:, None])[..., 0], rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda x: logprobs.token_logprobs(x, ids, 1.5, True, True, top_k=20)[1],
                                    (z.detach().clone().requires_grad_(),))
