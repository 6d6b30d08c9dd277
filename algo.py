"""termrl's math: advantages and policy losses as small pure functions over tensors.

No model, no I/O: everything here takes tensors and returns tensors, so a reader can put the
paper ("Let It Flow", arXiv 2512.24873; equation numbers below are the paper's) and the code side
by side. One batch schema (`Batch`, built by rollout.py), one config (`AlgoConfig`, nested under
`algo:` in train.py's YAML), and two entry points:

    adv = compute_advantages(batch, cfg)                         # [B,T], Eq. 7 chunk returns
    loss, metrics, mask = policy_loss(logprobs, batch, adv, cfg) # PPO-clip | GSPO | IPA (Eq. 9)

Conventions
- Every [B,T] tensor is right-padded; `lp[b,t] = log π(input_ids[b,t] | input_ids[b,:t])`,
  position 0 is 0 (logprobs.py computes it from the model's logits).
- IPA's T+ / T− split (Eq. 5, 9) and the long-negative mask: T+ = rows with R > 0, as the paper
  (`split_on: advantage` splits on the advantage's sign instead).
- Losses are built per token, then reduced once by `aggregate`. Masks never change shapes:
  a token that must not train gets weight 0 and leaves the denominator.

Gradient accumulation (micro-batches), as learner.rl_step does it: the batch-level parts are
computed once on the whole batch, each micro-batch's loss is summed (denominator 1), and the summed
gradient is divided by the whole batch's denominator. The gradient is linear in 1/denominator, so
this is exactly the full-batch loss, and it needs no micro-batch's π_old before that micro-batch
runs (on-policy, the mismatch masks depend on the log-probs of its own forward):

    adv = compute_advantages(batch, cfg)
    keep, _ = keep_rows(batch, adv, cfg)                 # group filters need whole groups
    rows, probe, known = rows_that_train(batch, adv, keep, cfg)  # which rows to forward
    masks = [<train_masks of the probe rows, under their no-grad π_old>] if probe else []
    for idx in micro_batches_of(rows):                   # learner.py packs them by token budget
        mb = <rows idx of batch>
        lp, ent = logprobs.token_logprobs(model(mb.input_ids).logits, mb.input_ids)
        loss, m, mask = policy_loss(lp, mb, adv[idx], cfg, ent, keep=keep[idx], denominator=1.0)
        loss.backward()
        masks.append(mask)                               # the tokens it trained
    den = aggregation_denominator(known if known is not None else cat(masks), cfg.agg, cfg.norm_length)
    for p in params: p.grad /= den                       # sum of micro losses / den == full loss
    # before the step each lp is log π_old: the later updates on the batch take old_logprobs from them
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

import torch

LOSSES = ("ppo", "gspo", "ipa")
BASELINES = ("grpo", "rloo", "batch", "none")
MISMATCH_MODES = ("none", "token_tis", "token_mask", "chunk_mask")
AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_sum_norm")
IMITATION_WEIGHTS = ("discount", "return")
SPLITS = ("reward", "advantage")
LEVELS = ("chunk", "token")
PER_ROW = ("num_chunks", "reward", "valid", "group_id", "policy_version")  # the Batch fields of shape [B]
MAX_LOG_RATIO = 20.0  # clamp a log-ratio right before exp() so it never overflows into inf·0 = NaN
#                       gradients; never before a chunk's or sequence's mean (tests/test_algo.py::
#                       test_one_extreme_token_masks_its_chunk,
#                       ::test_chunk_ratio_is_the_unclamped_geometric_mean)


# --------------------------------------------------------------------------------------------
# Batch schema and config
# --------------------------------------------------------------------------------------------

@dataclass
class Batch:
    """Padded tensors for B trajectories of (padded) length T; rollout.py builds it.

    Per token [B,T] (right-padded):
      input_ids       LongTensor   prompt, assistant, tool-output and pad tokens, in order.
      attention_mask  LongTensor   1 on real tokens, 0 on padding.
      loss_mask       FloatTensor  1 on tokens the policy sampled; 0 on prompt, tool output,
                                   prefilled expert tokens and padding.
      imitation_mask  FloatTensor  1 on expert-prefilled assistant tokens (Eq. 10's imitation
                                   part); disjoint from loss_mask.
      chunk_ids       LongTensor   k of the assistant turn (chunk) a sampled or prefilled token
                                   belongs to, 0 ≤ k < num_chunks[b]; -1 everywhere else.
      infer_logprobs  FloatTensor  log μ(token) the inference engine reported when sampling;
                                   0 where loss_mask is 0.
      old_logprobs    FloatTensor | None  log π_old(token), the policy before the first update on
                                   the batch, from that update's forwards (learner.rl_step; rows
                                   never forwarded hold infer_logprobs). None means "on-policy":
                                   policy_loss then uses the current log-probs, detached.
      ref_logprobs    FloatTensor | None  log π_ref(token), the reference policy's, for the KL term
                                   (algo.kl_coef); learner.fill_ref_logprobs fills it.
    Per trajectory [B]:
      num_chunks      LongTensor   K, the number of assistant turns (sampled + prefilled).
      reward          FloatTensor  final reward R; NaN for an infrastructure failure.
      valid           BoolTensor   False = infrastructure failure: the row stays in the batch
                                   (shape kept) but contributes nothing.
      group_id        LongTensor   same task = same group (the GRPO / RLOO grouping key).
      policy_version  LongTensor   policy version that started the trajectory (staleness).
      finish_reason   list[str]    why the episode ended (rollout.py's finish reasons).
    Optional [B,T]:
      unparsed        BoolTensor | None  True on the tokens of assistant turns whose tool call
                                   did not parse (the environment answered with an error).
    """
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    imitation_mask: torch.Tensor
    chunk_ids: torch.Tensor
    num_chunks: torch.Tensor
    infer_logprobs: torch.Tensor
    reward: torch.Tensor
    valid: torch.Tensor
    group_id: torch.Tensor
    policy_version: torch.Tensor
    finish_reason: list = field(default_factory=list)
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    unparsed: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def to(self, device) -> "Batch":
        """A copy with every tensor on `device`."""
        return Batch(**{f.name: v.to(device) if isinstance(v := getattr(self, f.name), torch.Tensor) else v
                        for f in fields(self)})

    def validate(self) -> None:
        """Raise ValueError naming the field that breaks the schema above."""
        B, T = self.input_ids.shape if self.input_ids.dim() == 2 else (None, None)
        if B is None:
            raise ValueError(f"Batch.input_ids must be [B,T], got shape {tuple(self.input_ids.shape)}")
        per_token = ["attention_mask", "loss_mask", "imitation_mask", "chunk_ids", "infer_logprobs"]
        per_token += [n for n in ("old_logprobs", "ref_logprobs", "unparsed") if getattr(self, n) is not None]
        for name, want in [(n, (B, T)) for n in per_token] + [(n, (B,)) for n in PER_ROW]:
            if (shape := tuple(getattr(self, name).shape)) != want:
                raise ValueError(f"Batch.{name} has shape {shape}, expected {want} "
                                 f"(B = {B}, T = {T}, as input_ids)")
        if len(self.finish_reason) != B:
            raise ValueError(f"Batch.finish_reason has {len(self.finish_reason)} entries, expected B = {B}")
        if self.valid.dtype != torch.bool:
            raise ValueError(f"Batch.valid must be a bool tensor, got {self.valid.dtype}")
        if ((self.loss_mask > 0) & (self.imitation_mask > 0)).any():
            raise ValueError("Batch.loss_mask and Batch.imitation_mask overlap: a token is either "
                             "sampled by the policy or prefilled from the expert, not both")
        trained = (self.loss_mask > 0) | (self.imitation_mask > 0)
        if (trained & (self.chunk_ids < 0)).any():
            raise ValueError("Batch.chunk_ids is -1 on a token with loss_mask or imitation_mask 1: "
                             "every trained token must belong to an assistant turn (chunk)")
        if (self.chunk_ids >= self.num_chunks[:, None]).any():
            raise ValueError("Batch.chunk_ids has an index ≥ num_chunks for its row: "
                             "chunk ids must run 0..K-1 with K = num_chunks[b]")
        if (self.chunk_ids > torch.arange(T, device=self.chunk_ids.device)).any():
            raise ValueError("Batch.chunk_ids has chunk k at a position below k: the prompt and every "
                             "turn before chunk k hold a token before it (chunk_sums relies on it)")
        if (self.valid & torch.isnan(self.reward)).any():
            raise ValueError("Batch.reward is NaN on a row with valid=True: infrastructure "
                             "failures must have valid=False")


@dataclass
class AlgoConfig:
    """Every knob of the math, with its default. train.py reads it from the YAML key `algo:`.

    Defaults follow the paper's IPA recipe where it is published: REINFORCE without critic, KL or
    entropy (Eq. 9); T+/T− split on the reward (Eq. 5); one-sided chunk-level mismatch masking
    m_c = 1[geo-mean π_old/μ ≤ H] with H = 5 (Eq. 6, chunk form); γ = 0.95 as in a public ROLL
    IPA config; ROLL's sequence-mean-token-mean aggregation. Where the paper is silent, or where
    we offer a choice beside it, the choice is named and the reason given:
      negative_reward = -1   the paper does not say how failures get a non-zero value, without
                             which Eq. 9's T− term vanishes; -1 is one choice, a baseline another.
      baseline               the paper's G_k uses R_final (baseline "none"); "grpo" / "rloo" /
                             "batch" are offered because the T− term needs a value and because a
                             group baseline lowers variance on tasks that always/never pass.
      mismatch_floor = None  two-sided masks [1/H, H]: also drop tokens the engine sampled that
                             the trainer finds very unlikely (their T− gradient is the largest).
      split_on = advantage   T+ = positive advantage: with graded rewards a success below its
                             group's mean then gets the importance weight of a T− row.
      mismatch = token_tis   truncated IS (weight min(π_old/μ, H)) instead of a mask, as GRPO
                             recipes use it.
    """
    loss: str = "ipa"              # "ppo" token PPO-clip (GRPO/DAPO) | "gspo" | "ipa" (Eq. 9)
    baseline: str = "none"         # "grpo" group mean | "rloo" leave-one-out | "batch" | "none"
    std_normalize: bool = False    # divide by the group (grpo/rloo) or batch std; no whitening in IPA
    std_eps: float = 1e-6          # added to the std before dividing
    negative_reward: float | None = -1.0  # value for rewards ≤ 0 (failures) before baselines;
    #                                       with R = 0 IPA's T− term vanishes (our choice: -1).
    #                                       None keeps raw rewards.
    gamma: float = 0.95            # chunk discount γ in G_k = γ^(K-1-k)·A (Eq. 7); 1 = flat
    clip_low: float = 0.2          # ppo: ratio lower bound 1 - clip_low
    clip_high: float = 0.28        # ppo: ratio upper bound 1 + clip_high (DAPO clip-higher)
    seq_clip_low: float = 3e-4     # gspo: sequence-ratio bounds (GSPO paper's values)
    seq_clip_high: float = 4e-4    # gspo: upper bound 1 + seq_clip_high
    mismatch: str = "chunk_mask"   # train–inference mismatch: "none" | "token_tis" (weight
    #                                min(π_old/μ, H)) | "token_mask" (Eq. 6) | "chunk_mask" (IPA)
    mismatch_cap: float = 5.0      # H
    mismatch_floor: float | None = 0.0  # masks keep ratios in [floor, H]: 0 = one-sided, as Eq. 6
    #                                     is written (the paper); None = 1/H, two-sided (ours)
    split_on: str = "reward"       # IPA's T+/T− (Eq. 5, 9) and the long-negative mask: "reward" R > 0
    #                                (the paper) | "advantage" its sign (differs for graded rewards)
    agg: str = "seq_mean_token_mean"  # "token_mean" | "seq_mean_token_mean" (ROLL default) |
    #                                   "seq_sum_norm" (Dr.GRPO: token sum / norm_length per seq)
    norm_length: int | None = None # seq_sum_norm's constant, e.g. rollout.max_context; required there
    rl_coef: float = 1.0           # λ_RL (Eq. 10)
    imitation_coef: float = 1.0    # λ_IL (Eq. 10) on imitation_mask tokens
    imitation_weight: str = "discount"  # NLL weight on prefilled chunk k: "discount" = γ^(K-1-k)
    #                                     (the expert succeeded, R = 1) | "return" = this row's G_k
    kl_coef: float = 0.0           # k3 KL to ref_logprobs, per sampled token
    entropy_coef: float = 0.0      # entropy bonus, per sampled token
    credit_unparsed: bool = False  # False: a turn whose tool call did not parse gets no positive
                                   # advantage (a success after it would reinforce it)
    max_negative_tokens: int | None = None  # mask negative trajectories longer than this
    #                                         (attention_mask tokens); paper fixed a collapse at ~20k
    level: str = "chunk"           # Eq. 7's credit, Eq. 8's ratio: "chunk" (a turn, IPA) | "token" (at_level)
    drop_zero_advantage: bool = False  # drop rows with advantage 0 on every sampled token and no
    #                                    imitation tokens (R in {0,1}, no baseline: the failures), so the
    #                                    mean runs over the successes alone (RAFT / rejection-sampling FT)
    filter_zero_variance: bool = False  # drop groups whose rewards are all equal (DAPO/ROLL) ...
    max_filtered_share: float = 0.5     # ... but never more than this share of the groups

    def __post_init__(self):
        for name, allowed in [("loss", LOSSES), ("baseline", BASELINES), ("mismatch", MISMATCH_MODES),
                              ("agg", AGGREGATIONS), ("imitation_weight", IMITATION_WEIGHTS),
                              ("split_on", SPLITS), ("level", LEVELS)]:
            if getattr(self, name) not in allowed:
                raise ValueError(f"algo.{name} = {getattr(self, name)!r}; choose one of {allowed}")
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"algo.gamma = {self.gamma}; it must be in (0, 1]")
        if self.mismatch_cap < 1.0:
            raise ValueError(f"algo.mismatch_cap = {self.mismatch_cap}; H must be ≥ 1")
        if self.mismatch_floor is not None and not 0.0 <= self.mismatch_floor <= 1.0:
            raise ValueError(f"algo.mismatch_floor = {self.mismatch_floor}; use a value in [0, 1] or null")
        if self.baseline == "none" and self.std_normalize:
            raise ValueError("algo.std_normalize needs a baseline to normalise around; "
                             "set baseline to grpo, rloo or batch, or std_normalize to false")
        if not (0 <= self.clip_low < 1 and 0 <= self.seq_clip_low < 1
                and min(self.clip_high, self.seq_clip_high) >= 0):
            raise ValueError("algo.clip_low / seq_clip_low must be in [0, 1), clip_high / seq_clip_high ≥ 0")
        if not 0.0 <= self.max_filtered_share <= 1.0:
            raise ValueError(f"algo.max_filtered_share = {self.max_filtered_share}; use a value in [0, 1]")
        if self.norm_length is not None and self.norm_length < 1:
            raise ValueError(f"algo.norm_length = {self.norm_length}; use a positive token count or null")
        if self.agg == "seq_sum_norm" and self.norm_length is None:
            raise ValueError("algo.agg = 'seq_sum_norm' (Dr.GRPO) divides by a constant: "
                             "set algo.norm_length, e.g. to rollout.max_context "
                             "(a batch's padded length would change with its rows)")


# --------------------------------------------------------------------------------------------
# Advantages and chunk returns
# --------------------------------------------------------------------------------------------

def shaped_rewards(reward, valid, negative_reward):
    """R per trajectory with failures (R ≤ 0) set to `negative_reward` (so IPA's T− term of Eq. 9
    is not multiplied by 0); invalid rows → 0."""
    reward = reward if reward.is_floating_point() else reward.float()
    r = torch.where(valid, reward, torch.zeros_like(reward))
    if negative_reward is not None:
        r = torch.where(valid & (r <= 0), torch.full_like(r, float(negative_reward)), r)
    return r


def _group_index(group_id):
    """Dense group index 0..G-1 for arbitrary group ids (sorted by id)."""
    _, inv = torch.unique(group_id, return_inverse=True)
    return inv, int(inv.max()) + 1 if inv.numel() else 0


def group_moments(x, valid, group_id):
    """Per row: its group's count n, mean and unbiased std over valid rows (std 0 when n < 2)."""
    inv, G = _group_index(group_id)
    w = valid.to(x.dtype)
    x = torch.where(valid, x, torch.zeros_like(x))  # NaN rewards of invalid rows must not leak
    n = torch.zeros(G, dtype=x.dtype, device=x.device).index_add(0, inv, w)
    mean = torch.zeros_like(n).index_add(0, inv, x * w) / n.clamp(min=1)
    dev2 = (x - mean[inv]) ** 2 * w
    var = torch.zeros_like(n).index_add(0, inv, dev2) / (n - 1).clamp(min=1)
    return n[inv], mean[inv], var.sqrt()[inv]


def baseline_advantages(r, valid, group_id, baseline, std_normalize=False, eps=1e-6):
    """Trajectory advantage A from shaped rewards r: "grpo" r − group mean (÷ group std if
    std_normalize), "rloo" r − mean of the other group members (÷ group std), "batch" r − batch
    mean (÷ batch std), "none" r (absolute returns, as IPA). Invalid rows → 0 and are left out of
    every statistic."""
    if baseline == "none":
        a = r.clone()
    else:
        gid = group_id if baseline != "batch" else torch.zeros_like(group_id)
        n, mean, std = group_moments(r, valid, gid)
        if baseline == "rloo":
            # r − (Σ_group − r)/(n − 1) = n/(n − 1)·(r − mean); a lone member has no baseline
            a = torch.where(n > 1, n / (n - 1).clamp(min=1) * (r - mean), torch.zeros_like(r))
        else:
            a = r - mean
        if std_normalize:
            a = a / (std + eps)
    return torch.where(valid, a, torch.zeros_like(a))


def chunk_discount(chunk_ids, num_chunks, gamma, dtype=torch.float32):
    """γ^(K−1−k) for every token of chunk k of a K-chunk trajectory (Eq. 7's Δ(k) = K−1−k); 0 off
    chunks. The powers are Python's, rounded once to `dtype` (torch.pow is 1 ulp off on some
    exponents): exact in float64 (tests/test_algo.py::test_chunk_returns_are_exact_in_the_rewards_float64)."""
    steps = (num_chunks[:, None] - 1 - chunk_ids).clamp(min=0)
    n = int(steps.max()) + 1 if steps.numel() else 1
    powers = torch.tensor([gamma ** d for d in range(n)],
                          dtype=torch.float64).to(dtype=dtype, device=steps.device)
    return torch.where(chunk_ids >= 0, powers[steps], torch.zeros((), dtype=dtype, device=steps.device))


def at_level(batch: Batch, level: str) -> Batch:
    """The batch as algo.level sees it: "token" makes every trained token its own chunk, so Eq. 7's Δ(k)
    counts tokens, IPA's ρ_c (Eq. 8) is per token and chunk_mask a token mask; train.py applies it once,
    for all of algo.py and learner.py (tests/test_algo.py::test_token_level_ipa_is_the_per_token_form)."""
    if level == "chunk":
        return batch
    trained = (batch.loss_mask > 0) | (batch.imitation_mask > 0)
    ids = torch.where(trained, trained.long().cumsum(-1) - 1, torch.full_like(batch.chunk_ids, -1))
    return replace(batch, chunk_ids=ids, num_chunks=trained.long().sum(-1))


def compute_advantages(batch: Batch, cfg: AlgoConfig):
    """[B,T] per-token advantages: chunk returns G_k = γ^(K−1−k)·A (Eq. 7) with A the trajectory
    advantage from `baseline_advantages`, broadcast over chunk k's tokens (sampled and
    prefilled); 0 off chunks and on invalid rows. γ = 1 gives plain trajectory-level advantages.
    Unless cfg.credit_unparsed, positive G_k is 0 on turns whose tool call did not parse: under
    γ < 1 the garbage turns after a task already done would get the largest credit of all."""
    batch.validate()
    r = shaped_rewards(batch.reward, batch.valid, cfg.negative_reward)
    a = baseline_advantages(r, batch.valid, batch.group_id, cfg.baseline, cfg.std_normalize, cfg.std_eps)
    adv = chunk_discount(batch.chunk_ids, batch.num_chunks, cfg.gamma, a.dtype) * a[:, None]
    if batch.unparsed is not None and not cfg.credit_unparsed:
        adv = torch.where(batch.unparsed & (adv > 0), torch.zeros_like(adv), adv)
    return adv


# --------------------------------------------------------------------------------------------
# Masks: rows, train–inference mismatch, chunks
# --------------------------------------------------------------------------------------------

def trajectory_sign(advantages):
    """+1 / 0 / −1 per row: the sign its (same-signed, discounted) chunk returns share."""
    return torch.sign(advantages.sum(dim=-1))


def positive_trajectories(batch: Batch, advantages, split_on):
    """[B] bool: IPA's T+ (Eq. 5, 9): valid rows with R > 0 ("reward", the paper) or with a
    positive advantage ("advantage"). The two differ only where a success can sit below its
    baseline (graded rewards). T− is every other row."""
    if split_on == "reward":
        return batch.valid & (torch.nan_to_num(batch.reward, nan=0.0) > 0)
    return trajectory_sign(advantages) > 0


def zero_variance_filter(r, valid, group_id, max_share):
    """Rows to keep after dropping groups whose valid rewards are all equal (no signal under a
    group baseline; DAPO dynamic sampling / ROLL GroupFilter), dropping at most
    floor(max_share·groups) of them, lowest group ids first. Returns (keep [B], zero-variance
    group share, filtered group share)."""
    inv, G = _group_index(group_id)
    _, _, std = group_moments(r, valid, group_id)
    has_valid = torch.zeros(G, dtype=torch.bool, device=r.device).index_fill(0, inv[valid], True)
    zero_var = torch.zeros(G, dtype=torch.bool, device=r.device)
    zero_var[inv] = std <= 1e-8  # rows of a group all carry the same std
    zero_var &= has_valid
    n_groups = int(has_valid.sum())
    budget = math.floor(max_share * n_groups + 1e-9)
    dropped = torch.zeros_like(zero_var)
    dropped[torch.nonzero(zero_var).flatten()[:budget]] = True
    share = (lambda k: k / n_groups if n_groups else 0.0)  # noqa: E731
    return ~dropped[inv], share(int(zero_var.sum())), share(int(dropped.sum()))


def rows_with_signal(advantages, sampled, imitation):
    """[B] bool: rows with a sampled token of nonzero advantage or an imitation token, the rows
    whose policy-gradient and imitation terms can move the weights."""
    return ((advantages * sampled).abs().sum(-1) > 0) | (imitation.sum(-1) > 0)


def can_move(batch: Batch, advantages, cfg: AlgoConfig) -> bool:
    """Whether any term of the loss can move the weights, whatever the masks: a KL or entropy term,
    or a valid row with a sampled token of nonzero advantage or an imitation token. False for a
    batch of failures under a loss that learns from successes only (IPA's T+ with R in {0, 1})."""
    if cfg.kl_coef or cfg.entropy_coef:
        return True
    valid = batch.valid[:, None].float()
    imitation = batch.imitation_mask.float() * valid * (cfg.imitation_coef != 0)
    return bool(rows_with_signal(advantages, batch.loss_mask.float() * valid, imitation).any())


def rows_that_train(batch: Batch, advantages, keep, cfg: AlgoConfig):
    """(rows whose loss can move the weights: forward with grad; rows that cannot but whose mask needs
    π_old: forward once without grad; the whole batch's trained-token mask if known without a
    forward, else None). Rows not in `keep` have empty masks and are never forwarded. Without a KL
    or entropy term, a row whose trained tokens all have advantage 0 (a failure under REINFORCE, a
    zero-variance group under GRPO) has zero gradient under every loss here, yet its tokens count
    in the denominator, and "token_mask" / "chunk_mask" pick which from π_old/μ."""
    rows = [i for i in range(len(batch)) if keep[i]]
    if cfg.kl_coef or cfg.entropy_coef:
        return rows, [], None
    if batch.old_logprobs is None and cfg.mismatch in ("token_mask", "chunk_mask"):
        sampled = batch.loss_mask.float() * batch.valid[:, None]
        imitation = batch.imitation_mask.float() * (cfg.imitation_coef != 0)
        moves = rows_with_signal(advantages, sampled, imitation)
        return [i for i in rows if moves[i]], [i for i in rows if not moves[i]], None
    old = (batch.old_logprobs if batch.old_logprobs is not None
           else batch.infer_logprobs)  # unused by the masks then
    rl, il, _, _ = train_masks(batch, advantages, cfg, old, keep)
    moves = rows_with_signal(advantages, rl, il)
    return [i for i in rows if moves[i]], [], rl + il


def keep_rows(batch: Batch, advantages, cfg: AlgoConfig):
    """Rows that may train, [B] bool: valid, not in a filtered zero-variance group, not a
    negative trajectory longer than max_negative_tokens, and (drop_zero_advantage) not a row
    without signal. Needs the whole batch (group statistics): compute it once before splitting
    into micro-batches. Returns (keep, metrics)."""
    keep = batch.valid.clone()
    metrics = {"invalid_frac": float((~batch.valid).float().mean()) if len(batch) else 0.0,
               "zero_variance_group_share": 0.0, "filtered_group_share": 0.0, "long_negative_frac": 0.0}
    if cfg.drop_zero_advantage:
        silent = ~rows_with_signal(advantages, batch.loss_mask, batch.imitation_mask)
        metrics["zero_advantage_frac"] = float((silent & batch.valid).float().mean()) if len(batch) else 0.0
        keep &= ~silent
    if cfg.filter_zero_variance:
        r = shaped_rewards(batch.reward, batch.valid, cfg.negative_reward)
        kz, metrics["zero_variance_group_share"], metrics["filtered_group_share"] = \
            zero_variance_filter(r, batch.valid, batch.group_id, cfg.max_filtered_share)
        keep &= kz
    if cfg.max_negative_tokens is not None:
        long_neg = (~positive_trajectories(batch, advantages, cfg.split_on)
                    & (batch.attention_mask.sum(-1) > cfg.max_negative_tokens))
        metrics["long_negative_frac"] = float((long_neg & batch.valid).float().mean())
        keep &= ~long_neg
    return keep, metrics


def chunk_sums(values, chunk_ids):
    """[B, T+1] sums of `values` per chunk; column k+1 is chunk k, column 0 collects chunk_ids −1.
    T columns hold every chunk, as a chunk's id is at most its position (Batch.validate), and the
    shape needs no look at the ids (no host sync inside learner.py's micro-batch loop)."""
    out = torch.zeros(values.shape[0], chunk_ids.shape[-1] + 1, dtype=values.dtype, device=values.device)
    return out.scatter_add(1, (chunk_ids + 1).clamp(min=0), values)


def chunk_mean(values, chunk_ids, mask):
    """Each token gets the mean of `values` over the masked tokens of its chunk (0 if none)."""
    sums = chunk_sums(torch.where(mask > 0, values, torch.zeros_like(values)), chunk_ids)
    counts = chunk_sums(mask.float(), chunk_ids)
    return (sums / counts.clamp(min=1)).gather(1, (chunk_ids + 1).clamp(min=0))


def mismatch_correction(log_r, mask, chunk_ids, mode, cap, floor=None):
    """Train–inference mismatch from log r = log π_old/μ on sampled tokens (`mask`): "token_tis"
    weights each token by min(r, H) (truncated IS); "token_mask" keeps tokens with r in
    [floor, H] (Eq. 6; floor 0 for its one-sided form); "chunk_mask" keeps whole chunks whose
    geometric-mean r is in [floor, H] (IPA). floor None = 1/H. Returns (keep [B,T] 0/1, weight
    [B,T])."""
    floor = 1.0 / cap if floor is None else floor
    ones = torch.ones_like(log_r)
    if mode == "none":
        return ones, ones
    if mode == "token_tis":
        return ones, _exp(log_r).clamp(max=cap)
    log_r = chunk_mean(log_r, chunk_ids, mask) if mode == "chunk_mask" else log_r
    lo = math.log(floor) if floor > 0 else -math.inf
    keep = (log_r >= lo - 1e-9) & (log_r <= math.log(cap) + 1e-9)  # tolerance: ratios on the bound stay
    return keep.float(), ones


def train_masks(batch: Batch, advantages, cfg: AlgoConfig, old_logprobs, keep=None):
    """Token masks every loss shares: (rl [B,T] sampled tokens that train, il [B,T] prefilled tokens
    that train, is_weight [B,T], metrics as 0-d tensors). Rows not in `keep` and mismatch-masked
    tokens are 0."""
    keep, metrics = keep_rows(batch, advantages, cfg) if keep is None else (keep, {})
    sampled = batch.loss_mask.float() * batch.valid[:, None]
    log_r = _log_ratio(old_logprobs.detach(), batch.infer_logprobs, sampled)  # log π_old/μ
    mm_keep, is_weight = mismatch_correction(log_r, sampled, batch.chunk_ids, cfg.mismatch,
                                             cfg.mismatch_cap, cfg.mismatch_floor)
    rl = sampled * mm_keep * keep[:, None]
    il = batch.imitation_mask.float() * keep[:, None] * (cfg.imitation_coef != 0)

    # what a practitioner watches: how far trainer and engine disagree, and what got masked
    n_sampled = sampled.sum()
    chunk_tok = chunk_sums(sampled, batch.chunk_ids)[:, 1:]
    chunk_kept = chunk_sums(sampled * mm_keep, batch.chunk_ids)[:, 1:]
    n_chunks = (chunk_tok > 0).sum()
    metrics.update({
        "logprob_gap_abs": _ratio(log_r.abs().sum(), n_sampled),
        "logprob_gap_kl": _ratio((_exp(log_r) - 1 - log_r).sum(), n_sampled),  # k3 of KL(μ‖π_old)
        "mismatch_token_frac": _ratio((sampled * (1 - mm_keep)).sum(), n_sampled),
        "mismatch_chunk_frac": _ratio(((chunk_tok > 0) & (chunk_kept == 0)).sum(), n_chunks),
        "masked_token_frac": _ratio((sampled - rl).sum(), n_sampled),
        "tokens_trained": rl.sum() + il.sum(),
    })
    if cfg.mismatch == "token_tis":
        metrics["tis_weight_mean"] = _ratio((is_weight * sampled).sum(), n_sampled)
        over_cap = (log_r > math.log(cfg.mismatch_cap)).float()
        metrics["tis_clip_frac"] = _ratio((over_cap * sampled).sum(), n_sampled)
    return rl, il, is_weight, metrics


def _ratio(num, den):
    """num/den of a sum over a count of tokens, rows or chunks, as a float64 0-d tensor on their
    device (read once a step, not per micro-batch); 0 for an empty set (metrics must stay finite)."""
    return torch.as_tensor(num).double() / torch.as_tensor(den).double().clamp(min=1.0)


# --------------------------------------------------------------------------------------------
# Per-token policy-gradient losses (each returns loss [B,T] and detached diagnostics)
# --------------------------------------------------------------------------------------------

def clipped_surrogate(ratio, advantages, clip_low, clip_high):
    """PPO's pessimistic surrogate −min(r·A, clip(r, 1−ε_low, 1+ε_high)·A) per token, and which
    tokens the lower / upper bound clipped (the bound that actually took the min)."""
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = -torch.minimum(ratio * advantages, clipped * advantages)
    r = ratio.detach()
    return loss, (r < 1.0 - clip_low) & (advantages < 0), (r > 1.0 + clip_high) & (advantages > 0)


def _log_ratio(logprobs, old_logprobs, mask):
    """log(π/π_old) on `mask`, 0 elsewhere; not clamped, so chunk and sequence means see the
    extreme tokens the mismatch masks exist for (clamp with `_exp`, after the mean)."""
    return torch.where(mask > 0, logprobs - old_logprobs, torch.zeros_like(logprobs))


def _exp(log_ratio):
    """exp of a log-ratio clamped to ±MAX_LOG_RATIO, so it stays finite."""
    return torch.exp(log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))


def ppo_clip_loss(logprobs, old_logprobs, advantages, mask, clip_low, clip_high):
    """Token-level PPO-clip (GRPO; DAPO's asymmetric clip-higher): r_t = π_θ(t)/π_old(t).
    Returns (loss, ratio, clipped_low, clipped_high), all [B,T]."""
    ratio = _exp(_log_ratio(logprobs, old_logprobs, mask))
    loss, lo, hi = clipped_surrogate(ratio, advantages, clip_low, clip_high)
    return loss, ratio.detach(), lo, hi


def gspo_loss(logprobs, old_logprobs, advantages, mask, clip_low, clip_high):
    """GSPO-token: s_i = exp(mean_{t∈i} log π_θ/π_old) (sequence geometric-mean ratio) carried by
    every token as s_i,t = sg[s_i]·π_θ(t)/sg[π_θ(t)], clipped at sequence level; equals GSPO when
    a row's advantages are equal, and allows per-chunk G_k; the mean is over all of `mask`. Returns as
    ppo_clip_loss."""
    log_ratio = _log_ratio(logprobs, old_logprobs, mask)
    seq = (log_ratio.sum(-1) / mask.sum(-1).clamp(min=1)).detach().clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    ratio = torch.exp(seq[:, None] + logprobs - logprobs.detach())
    loss, lo, hi = clipped_surrogate(ratio, advantages, clip_low, clip_high)
    return loss, ratio.detach(), lo, hi


def ipa_chunk_loss(logprobs, old_logprobs, advantages, mask, chunk_ids, positive=None):
    """IPA chunk-level REINFORCE (Eqs. 5, 8, 9): −w_c·G_t·log π_θ(t) with w_c = 1 on T+ rows
    (`positive` [B], default: positive advantage; no importance weight) and w_c = sg[clip(ρ_c, 0, 1)]
    on T−, ρ_c = exp(mean_{t∈c} log π_θ(t)/π_old(t)) (Eq. 8) over all of chunk c's `mask`. Returns
    (loss, ρ_c per token, clipped_low (never), clipped_high = T− tokens whose ρ_c was cut to 1)."""
    rho = _exp(chunk_mean(_log_ratio(logprobs.detach(), old_logprobs, mask), chunk_ids, mask))
    positive = (trajectory_sign(advantages) > 0 if positive is None else positive)[:, None]
    weight = torch.where(positive, torch.ones_like(rho), rho.clamp(max=1.0))
    loss = -weight * advantages * logprobs
    return loss, rho, torch.zeros_like(rho, dtype=torch.bool), ~positive & (rho > 1.0)


def imitation_loss(logprobs, weight):
    """Eq. 10's imitation part: weighted NLL −w_t·log π_θ(t) on expert-prefilled tokens."""
    return -weight * logprobs


def k3_kl(logprobs, ref_logprobs):
    """Schulman's k3 estimator of KL(π_θ‖π_ref) per token: e^d − d − 1 (≥ 0), d = ref − lp. Only the
    exponent is clamped: d keeps its gradient (tests/test_algo.py::
    test_k3_kl_keeps_its_gradient_where_the_policy_drifted_furthest)."""
    d = ref_logprobs - logprobs
    return torch.exp(d.clamp(max=MAX_LOG_RATIO)) - d - 1


# --------------------------------------------------------------------------------------------
# Aggregation and the entry point
# --------------------------------------------------------------------------------------------

def aggregation_denominator(mask, agg, norm_length=None):
    """The one number `aggregate` divides by: trained tokens ("token_mean"), sequences with a
    trained token ("seq_mean_token_mean"), or those sequences × the constant norm_length
    ("seq_sum_norm"; never the padded length, which rows without a trained token would change:
    tests/test_algo.py::test_dr_grpo_constant_leaves_valid_rows_unchanged_by_a_padded_invalid_row).
    At least 1, so an all-masked batch gives 0, not NaN."""
    if agg == "token_mean":
        return max(float(mask.sum()), 1.0)
    n_seq = max(float((mask.sum(-1) > 0).sum()), 1.0)
    if agg == "seq_mean_token_mean":
        return n_seq
    if norm_length is None:
        raise ValueError("aggregation 'seq_sum_norm' needs norm_length (algo.norm_length), a constant")
    return n_seq * float(norm_length)


def aggregate(loss, mask, agg, denominator, row_tokens=None):
    """Reduce a per-token loss [B,T] over `mask`: "token_mean" Σ_b,t ℓ / #tokens;
    "seq_mean_token_mean" Σ_b (Σ_t ℓ / #tokens_b) / #seqs; "seq_sum_norm" (Dr.GRPO)
    Σ_b,t ℓ / (#seqs · norm_length) — no length bias, a constant scale. `denominator` comes from
    `aggregation_denominator`; `row_tokens` (default mask.sum(-1)) lets a part of the loss that
    covers only some of a row's tokens be averaged over all of them, so parts add up."""
    masked = torch.where(mask > 0, loss * mask, torch.zeros_like(loss))
    if agg == "seq_mean_token_mean":
        row_tokens = mask.sum(-1) if row_tokens is None else row_tokens
        return (masked.sum(-1) / row_tokens.clamp(min=1)).sum() / denominator
    return masked.sum() / denominator


def advantage_stats(advantages, rl) -> dict:
    """Mean advantage over trained sampled tokens `rl`, and the share of rows with a trained token
    whose trajectory is positive (floats)."""
    return as_floats(_advantage_stats(advantages, rl))


def _advantage_stats(advantages, rl) -> dict:
    trained = rl.sum(-1) > 0
    return {"advantage_mean": _ratio((advantages * rl).sum(), rl.sum()),
            "positive_frac": _ratio(((trajectory_sign(advantages) > 0) & trained).sum(), trained.sum())}


def as_floats(metrics: dict) -> dict:
    """Metrics as plain floats, the tensors among them read in one transfer."""
    tensors = {k: v for k, v in metrics.items() if torch.is_tensor(v)}
    out = {k: float(v) for k, v in metrics.items() if not torch.is_tensor(v)}
    if tensors:
        dev = next(iter(tensors.values())).device
        out.update(zip(tensors, torch.stack([v.detach().to(dev, torch.float64)
                                             for v in tensors.values()]).tolist()))
    return {k: out[k] for k in metrics}


def imitation_weights(batch: Batch, advantages, cfg: AlgoConfig, dtype=torch.float32):
    """Eq. 10's weight on prefilled chunk k: γ^(K−1−k) ("discount": the expert succeeded) or the
    row's G_k ("return")."""
    if cfg.imitation_weight == "return":
        return advantages
    return chunk_discount(batch.chunk_ids, batch.num_chunks, cfg.gamma, dtype)


def policy_loss(logprobs, batch: Batch, advantages, cfg: AlgoConfig, entropy=None, ref_logprobs=None,
                keep=None, denominator=None, on_device=False, imitation=None):
    """Total loss λ_RL·PG + λ_IL·imitation (Eq. 10) + kl_coef·KL − entropy_coef·H, all per token and
    reduced once by `aggregate` over sampled ∪ prefilled trained tokens. PG is cfg.loss's
    per-token loss times the mismatch IS weight. `keep` [B] and `denominator` default to this
    batch's own (pass the full batch's when micro-batching). Returns (scalar loss, float metrics,
    the trained-token mask [B,T] it reduced over: its aggregation_denominator is the batch's).
    `on_device` (learner.py's micro-batches): the caller validated the whole batch and the metrics
    stay 0-d tensors on the device; with `imitation` (False: no prefilled token; else the
    imitation_weights [B,T] of these rows) known on the host too, nothing here waits for the device.

    Metrics (plain floats; a mean over an empty set is 0.0):
      loss = rl_coef·pg_loss + imitation_coef·imitation_loss + kl_coef·kl_loss
             − entropy_coef·entropy_loss
      ratio_min/mean/max    the loss's own ratio over trained sampled tokens (ppo: π_θ/π_old per
                            token; gspo: sequence s_i; ipa: chunk ρ_c), token-weighted mean
      clip_frac_low/high    share of those tokens whose term a clip bound took (ipa: ρ_c cut to 1)
      logprob_gap_abs/_kl   mean |log π_old − log μ| and k3 KL(μ‖π_old), sampled tokens of valid rows
      mismatch_token_frac, mismatch_chunk_frac   sampled tokens / chunks the mismatch mask removed
      masked_token_frac     sampled tokens of valid rows removed by any mask (filters, length, mismatch)
      tis_weight_mean, tis_clip_frac (token_tis only), tokens_trained, advantage_mean,
      positive_frac (rows), kl_ref, entropy (when given)
      invalid_frac, zero_variance_group_share, filtered_group_share, long_negative_frac — from
                            keep_rows; absent when `keep` is passed in (log your own call's)."""
    if not on_device:
        batch.validate()
    for name, t in [("logprobs", logprobs), ("advantages", advantages), ("entropy", entropy),
                    ("ref_logprobs", ref_logprobs)]:
        if t is not None and tuple(t.shape) != tuple(batch.input_ids.shape):
            raise ValueError(f"{name} has shape {tuple(t.shape)}, "
                             f"expected [B,T] = {tuple(batch.input_ids.shape)}")
    ref_logprobs = batch.ref_logprobs if ref_logprobs is None else ref_logprobs
    if cfg.kl_coef and ref_logprobs is None:
        raise ValueError("algo.kl_coef > 0 needs ref_logprobs (the reference policy's token log-probs), "
                         "as an argument or in batch.ref_logprobs")
    if cfg.entropy_coef and entropy is None:
        raise ValueError("algo.entropy_coef > 0 needs entropy: "
                         "logprobs.token_logprobs(..., with_entropy=True, entropy_grad=True)")
    old = batch.old_logprobs if batch.old_logprobs is not None else logprobs.detach()
    advantages = advantages.detach()
    rl, il, is_weight, metrics = train_masks(batch, advantages, cfg, old, keep)

    # GSPO's s_i and IPA's ρ_c (Eq. 8) average the whole sequence / chunk, mismatch-masked tokens too
    sampled = batch.loss_mask.float() * batch.valid[:, None]
    if cfg.loss == "ppo":
        pg, ratio, lo, hi = ppo_clip_loss(logprobs, old, advantages, sampled, cfg.clip_low, cfg.clip_high)
    elif cfg.loss == "gspo":
        pg, ratio, lo, hi = gspo_loss(logprobs, old, advantages, sampled, cfg.seq_clip_low, cfg.seq_clip_high)
    else:
        pg, ratio, lo, hi = ipa_chunk_loss(logprobs, old, advantages, sampled, batch.chunk_ids,
                                           positive_trajectories(batch, advantages, cfg.split_on))
    pg = pg * is_weight

    mask = rl + il
    den = denominator if denominator is not None else aggregation_denominator(mask, cfg.agg, cfg.norm_length)
    parts = {"pg_loss": (cfg.rl_coef, pg, rl)}
    metrics["imitation_loss"] = logprobs.new_zeros((), dtype=torch.float64)  # same keys with or without
    if imitation is None and il.any():
        imitation = imitation_weights(batch, advantages, cfg, logprobs.dtype)
    if imitation is not None and imitation is not False:
        parts["imitation_loss"] = (cfg.imitation_coef, imitation_loss(logprobs, imitation), il)
    if cfg.kl_coef:
        kl = k3_kl(logprobs, ref_logprobs)
        parts["kl_loss"] = (cfg.kl_coef, kl, rl)
        metrics["kl_ref"] = _ratio((kl.detach() * rl).sum(), rl.sum())
    if cfg.entropy_coef:
        parts["entropy_loss"] = (-cfg.entropy_coef, entropy, rl)
    if entropy is not None:
        metrics["entropy"] = _ratio((entropy.detach() * rl).sum(), rl.sum())

    loss = logprobs.new_zeros(())
    row_tokens = mask.sum(-1)
    for name, (coef, term, m) in parts.items():
        # every part is reduced with the shared denominators, so the parts add up to the loss
        value = aggregate(term, m, cfg.agg, den, row_tokens)
        loss = loss + coef * value
        metrics[name] = value.detach()

    n_rl = rl.sum()
    trained = rl > 0
    some = trained.any()
    zero = ratio.new_zeros(())
    metrics.update({
        "loss": loss.detach(),
        "clip_frac_low": _ratio((lo.float() * rl).sum(), n_rl),
        "clip_frac_high": _ratio((hi.float() * rl).sum(), n_rl),
        "ratio_min": torch.where(some, torch.where(trained, ratio, float("inf")).min(), zero),
        "ratio_mean": _ratio(torch.where(trained, ratio, zero).sum(), trained.sum()),
        "ratio_max": torch.where(some, torch.where(trained, ratio, float("-inf")).max(), zero),
        **_advantage_stats(advantages, rl),
    })
    return loss, (metrics if on_device else as_floats(metrics)), mask
