"""train.py: config errors, token-budget micro-batches, exact gradient accumulation, atomic
checkpoints, data order, and (slow) a short real run that is SIGKILLed and resumed."""
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import kill_group_when

import algo
import logprobs
import distributed
import config
import learner
import rundir
import sft as sftmod
import train
from generated_tasks import task_kind

ROOT = Path(__file__).resolve().parents[1]


# --- config ---------------------------------------------------------------------------------

def test_config_loads_and_overrides():
    cfg = config.load_config(ROOT / "configs" / "tiny.yaml",
                             ["train.steps=3", "train.lr=1e-5", "algo.loss=ppo"])
    assert cfg.train.steps == 3 and cfg.train.lr == 1e-5 and cfg.algo["loss"] == "ppo"
    assert cfg.out_dir == "runs/tiny"


@pytest.mark.parametrize("override, needle", [
    ("trian.steps=3", "did you mean 'train'"),
    ("train.stepz=3", "did you mean 'train.steps'"),
    ("rollout.max_turn=3", "did you mean 'rollout.max_turns'"),
    ("algo.los=ppo", "did you mean 'algo.loss'"),
    ("train.lr=fast", "'train.lr' expects float"),
    ("train.steps=2.5", "'train.steps' expects int"),
    ("model.lora=maybe", "'model.lora' expects bool"),
    ("train.mode=turbo", "'train.mode' is 'turbo'"),
    ("algo.loss=reinforce", "algo.loss"),
    ("data.generated_kinds=[copy,move]", "unknown kinds ['move']"),
    ("train.generated_kinds=[count,chain]", "'train.generated_kinds' has kinds ['chain']"),
    ("nonsense", "expected key=value"),
])
def test_config_errors_name_the_key(override, needle):
    with pytest.raises(config.ConfigError) as e:
        config.load_config(ROOT / "configs" / "tiny.yaml", [override])
    assert needle in str(e.value)


def test_generated_kinds_restrict_train_and_eval_tasks():
    cfg = config.load_config(ROOT / "configs" / "tiny.yaml", ["data.generated_kinds=[copy,rename]"])
    train_tasks, held = train.load_task_sets(cfg)
    kinds = {t.metadata["kind"] for t in train_tasks}
    assert kinds == {t.metadata["kind"] for t in held} == {"copy", "rename"}
    assert not {t.instruction for t in held} & {t.instruction for t in train_tasks}


def test_every_shipped_config_loads():
    paths = sorted((ROOT / "configs").glob("*.yaml"))
    assert len(paths) >= 5
    for p in paths:
        config.load_config(p)


def test_dry_run_cli_reports_a_missing_model(tmp_path):
    r = subprocess.run([sys.executable, "train.py", "--config", "configs/tiny.yaml", "--dry-run",
                        "--set", "model.build_tiny=false", "--set", f"model.path={tmp_path}/nope"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    assert f"{tmp_path}/nope does not exist" in r.stdout and "docker: reachable" in r.stdout


def test_dry_run_names_the_script_that_makes_a_missing_model(tmp_path):
    """Bug: before scripts/get_smollm2.py had run, the SmolLM2 config's relative model.path
    (out/<name>, shaped like a hub id) got `huggingface-cli download out/<name>`, a hub command for
    a local folder. A config whose model a script makes says so (model.fetch), and the error
    names that one command."""
    text = (ROOT / "configs" / "smollm2-cpu.yaml").read_text()
    assert "out/smollm2-135m-instruct" in text and "fetch: python scripts/get_smollm2.py" in text
    missing = f"out/{tmp_path.name}-smollm2"  # relative, as shipped, and absent
    (tmp_path / "smollm2.yaml").write_text(text.replace("out/smollm2-135m-instruct", missing))
    r = subprocess.run([sys.executable, "train.py", "--config", str(tmp_path / "smollm2.yaml"), "--dry-run"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    assert f"{(ROOT / missing).resolve()} does not exist" in r.stdout
    assert "`python scripts/get_smollm2.py`" in r.stdout and "huggingface-cli" not in r.stdout


# --- data order and micro-batches ---------------------------------------------------------

def test_step_tasks_is_a_pure_function_of_step_covering_each_epoch():
    tasks = list(range(10))
    a = [train.step_tasks(tasks, s, 4, seed=1) for s in range(5)]
    assert a == [train.step_tasks(tasks, s, 4, seed=1) for s in range(5)]
    flat = sum(a, [])
    assert sorted(flat[:10]) == tasks and sorted(flat[10:20]) == tasks  # each epoch: every task once
    assert flat != sum((train.step_tasks(tasks, s, 4, seed=2) for s in range(5)), [])


def test_pack_by_tokens_respects_budget_and_keeps_padding_low():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(200, 2000, (64,), generator=g).tolist()
    groups = learner.pack_by_tokens(lengths, 8192)
    assert sorted(i for grp in groups for i in grp) == list(range(64))
    for grp in groups:
        assert len(grp) * max(lengths[i] for i in grp) <= 8192 or len(grp) == 1
    assert learner.padding_fraction(lengths, groups) < 0.10
    naive = [list(range(i, min(i + 4, 64))) for i in range(0, 64, 4)]  # count-based, unsorted
    assert learner.padding_fraction(lengths, groups) < learner.padding_fraction(lengths, naive)
    assert learner.pack_by_tokens([5000, 10], 100) == [[0], [1]]  # an over-budget row goes alone


def _synthetic_batch(vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = [40, 33, 25, 18, 12, 7]
    B, T = len(lengths), max(lengths)
    ids = torch.randint(1, vocab, (B, T), generator=g)
    att = torch.zeros(B, T, dtype=torch.long)
    loss = torch.zeros(B, T)
    chunk = torch.full((B, T), -1)
    for b, L in enumerate(lengths):
        att[b, :L] = 1
        ids[b, L:] = 0
        loss[b, L // 2:L] = 1
        chunk[b, L // 2:L] = 0
    return algo.Batch(input_ids=ids, attention_mask=att, loss_mask=loss, imitation_mask=torch.zeros(B, T),
                      chunk_ids=chunk, num_chunks=torch.ones(B, dtype=torch.long),
                      infer_logprobs=-torch.rand(B, T, generator=g) * loss,
                      reward=torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0]),
                      valid=torch.ones(B, dtype=torch.bool), group_id=torch.tensor([0, 0, 0, 1, 1, 1]),
                      policy_version=torch.zeros(B, dtype=torch.long), finish_reason=["submitted"] * B)


@pytest.mark.parametrize("sft", [False, True])
def test_micro_batching_gives_the_full_batch_update(tiny_model_dir, sft):
    """Same loss, gradient norm and weights after one step in one micro-batch or in several."""
    cfg = config.load_config(ROOT / "configs" / "tiny.yaml",
                            ["algo.baseline=grpo", "algo.mismatch=none", f"model.path={tiny_model_dir}"])
    acfg = None if sft else config.algo_cfg(cfg)
    results = []
    for budget in (10_000, 45):
        cfg.train.micro_batch_tokens = budget
        model = learner.load_model(cfg, "cpu")
        opt = torch.optim.SGD(model.parameters(), lr=1.0)  # params move by exactly -grad (Adam would
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)  # blow up float noise on ~0 grads)
        batch = _synthetic_batch(model.config.vocab_size)
        m = learner.sft_step(model, opt, sched, batch, cfg.train) if sft else \
            learner.rl_step(model, opt, sched, batch, algo.compute_advantages(batch, acfg), acfg, cfg.train)
        results.append((m, [p.detach().clone() for p in model.parameters()]))
    (m1, p1), (m2, p2) = results
    assert m1["micro_batches"] == 1 and m2["micro_batches"] > 2
    assert m2["padding_frac"] < m1["padding_frac"]
    assert abs(m1["loss"] - m2["loss"]) < 1e-4 * max(1.0, abs(m1["loss"]))
    assert m1["grad_norm"] > 0 and abs(m1["grad_norm"] - m2["grad_norm"]) < 1e-4 * max(1.0, m1["grad_norm"])
    for a, b in zip(p1, p2):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_rows_with_zero_gradient_are_skipped_and_the_update_is_unchanged(tiny_model_dir):
    """REINFORCE on a 0/1 reward: failed rows (advantage 0) are not forwarded, yet the step equals
    one full-batch policy_loss step, whose denominator counts their tokens."""
    cfg = config.load_config(ROOT / "configs" / "tiny.yaml",
                            ["algo.baseline=none", "algo.negative_reward=0.0", "algo.mismatch=none",
                             f"model.path={tiny_model_dir}", "train.micro_batch_tokens=45",
                             "train.grad_clip=0"])  # a clipped step would hide a wrong denominator
    acfg = config.algo_cfg(cfg)
    batch = _synthetic_batch(learner.load_model(cfg, "cpu").config.vocab_size)
    params = []
    for skip in (True, False):
        model = learner.load_model(cfg, "cpu")
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        if skip:
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
            m = learner.rl_step(model, opt, sched, batch, algo.compute_advantages(batch, acfg), acfg,
                                cfg.train)
        else:  # the reference: every row in one forward
            lp, _ = logprobs.token_logprobs(model(input_ids=batch.input_ids,
                                                  attention_mask=batch.attention_mask,
                                                  use_cache=False).logits, batch.input_ids)
            loss, ref, _ = algo.policy_loss(lp, batch, algo.compute_advantages(batch, acfg), acfg)
            loss.backward()
            opt.step()
        params.append([p.detach().clone() for p in model.parameters()])
    assert m["rows_trained"] == 3 and m["positive_frac"] == pytest.approx(ref["positive_frac"]) == 0.5
    assert 0.0 <= m["padding_frac"] < 0.5  # of the rows fed to the model, not of the whole batch
    assert m["loss"] == pytest.approx(float(loss.detach()), rel=1e-4)
    moved = 0.0
    for a, b, p0 in zip(params[0], params[1], learner.load_model(cfg, "cpu").parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
        moved = max(moved, float((a - p0).abs().max()))
    assert moved > 1e-4


def test_second_update_on_a_batch_measures_ratios_against_pi_old(tiny_model_dir):
    """updates_per_step > 1: policy_logprobs (in micro-batches) equals a one-piece forward at the
    trained tokens (and is 0 at the others), the first update sees ratio 1 and the second one
    ratios away from 1 (not π_θ against itself)."""
    cfg = config.load_config(ROOT / "configs" / "tiny.yaml",
                            ["algo.loss=ppo", "algo.baseline=grpo", "algo.mismatch=none",
                             f"model.path={tiny_model_dir}", "train.micro_batch_tokens=45"])
    acfg = config.algo_cfg(cfg)
    model = learner.load_model(cfg, "cpu")
    batch = _synthetic_batch(model.config.vocab_size)
    pieces = learner.policy_logprobs(model, batch, cfg.train.micro_batch_tokens)
    with torch.no_grad():
        whole, _ = logprobs.token_logprobs(model(input_ids=batch.input_ids,
                                                 attention_mask=batch.attention_mask,
                                                 use_cache=False).logits, batch.input_ids)
    m = learner.trained_positions(batch)  # the tokens a loss reads: the others are never computed
    torch.testing.assert_close(pieces[m], whole[m], rtol=1e-4, atol=1e-5)
    assert (pieces[~m] == 0).all() and m.sum() > 10
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    adv = algo.compute_advantages(batch, acfg)
    first = learner.rl_step(model, opt, sched, batch, adv, acfg, cfg.train, keep_old=True)
    torch.testing.assert_close(batch.old_logprobs[m], whole[m], rtol=1e-4, atol=1e-5)
    second = learner.rl_step(model, opt, sched, batch, adv, acfg, cfg.train, keep_old=True)
    assert first["ratio_min"] == pytest.approx(1.0, abs=1e-5)
    assert first["ratio_max"] == pytest.approx(1.0, abs=1e-5)
    assert second["ratio_max"] - second["ratio_min"] > 1e-3


def _forwarded_rows(model, batch):
    """Record, for each forward of `model`, which rows of `batch` it fed and whether grad was on
    (rows are told apart by their tokens, which _synthetic_batch draws at random)."""
    seen = []

    def hook(module, args, kwargs):
        for ids in kwargs["input_ids"].cpu():
            for b in range(len(batch)):
                L = int(batch.attention_mask[b].sum())
                if ids.shape[0] >= L and torch.equal(ids[:L], batch.input_ids[b, :L]):
                    seen.append((b, torch.is_grad_enabled()))
    return seen, distributed.unwrap(model).register_forward_pre_hook(hook, with_kwargs=True)


@pytest.mark.parametrize("case, lora, budget", [
    ("reinforce", False, 1), ("reinforce", True, 1), ("ppo_tis", False, 45), ("kl", True, 1),
    ("kl", False, 1)])
def test_pi_old_from_the_first_update_equals_a_separate_pass_bit_for_bit(tiny_model_dir, case, lora, budget):
    """updates_per_step > 1: π_old of the later updates is the first update's own forward, which runs
    before its optimizer step. Two updates that way give the same losses, gradient norms, weights and
    π_old, bit for bit, as the two-pass step: π_old (and π_ref) by a no-grad forward on the same
    weights (learner.policy_logprobs), then the updates. Under temperature and top_k, with rows that
    cannot move the weights (failures under REINFORCE, an invalid row) never forwarded with grad, and
    the failures forwarded once without grad, for the mismatch mask their tokens count under. A
    row's log-probs change in their last bits with the shape of the micro-batch it is forwarded in,
    so the two-pass side feeds the model the same micro-batches: one row each (budget 1), or, where
    every kept row trains, the kept rows (budget 45)."""
    sets = {"reinforce": ["algo.loss=ipa", "algo.baseline=none", "algo.negative_reward=0.0",
                          "algo.mismatch=chunk_mask"],
            "ppo_tis": ["algo.loss=ppo", "algo.baseline=grpo", "algo.mismatch=token_tis"],
            "kl": ["algo.loss=ipa", "algo.baseline=grpo", "algo.mismatch=chunk_mask",
                   "algo.kl_coef=0.1"]}[case]
    cfg = config.load_config(ROOT / "configs" / "tiny.yaml", sets + [
        f"model.path={tiny_model_dir}", f"model.lora={str(lora).lower()}",
        f"train.micro_batch_tokens={budget}"])
    acfg = config.algo_cfg(cfg)
    sampling = dict(temperature=0.7, top_k=50)
    runs = []
    for two_pass in (False, True):
        torch.manual_seed(0)  # the same LoRA initialisation on both sides
        model = learner.load_model(cfg, "cpu")
        ref_model = learner.load_reference(cfg, "cpu") if acfg.kl_coef else None
        batch = _synthetic_batch(model.config.vocab_size)
        batch.valid[4], batch.reward[4] = False, float("nan")
        if case == "reinforce":  # a success whose only chunk the mismatch mask drops: π_old/μ ≈ e^3 > H
            batch.infer_logprobs[2] -= 10.0 * batch.loss_mask[2]
        adv = algo.compute_advantages(batch, acfg)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        seen, handle = _forwarded_rows(model, batch)
        if two_pass:
            kept = [0, 1, 2, 3, 5] if budget > 1 else None
            batch.old_logprobs = learner.policy_logprobs(model, batch, budget, rows=kept, **sampling)
            if acfg.kl_coef:
                learner.fill_ref_logprobs(model, ref_model, batch, budget, rows=kept, **sampling)
        ms = [learner.rl_step(model, opt, sched, batch, adv, acfg, cfg.train, ref_model=ref_model,
                              keep_old=not two_pass, **sampling) for _ in range(2)]
        handle.remove()
        runs.append((ms, [p.detach().clone() for p in model.parameters()], batch, seen))
    (new, w_new, b_new, seen), (old, w_old, b_old, _) = runs
    kept = [0, 1, 2, 3, 5]
    for a, b in zip(new, old):
        assert (a["loss"], a["grad_norm"]) == (b["loss"], b["grad_norm"])
    assert new[1]["rows_trained"] == old[1]["rows_trained"]
    assert new[0]["grad_norm"] > 0
    if case != "reinforce":  # (there π_old only decides masks: no row is T−)
        assert new[0]["ratio_mean"] == 1.0 != new[1]["ratio_mean"]  # the second update measured against π_old
    assert all(torch.equal(a, b) for a, b in zip(w_new, w_old))
    assert torch.equal(b_new.old_logprobs[kept], b_old.old_logprobs[kept])
    if acfg.kl_coef:
        assert torch.equal(b_new.ref_logprobs[kept], b_old.ref_logprobs[kept])
        assert new[0]["kl_ref"] == 0.0 < new[1]["kl_ref"]  # π_ref over the sampler's support, as π_θ
    first = seen[:len(seen) - new[1]["rows_trained"]]  # the forwards before the first optimizer step
    if case == "reinforce":
        assert sorted(first) == [(0, True), (1, False), (2, True), (3, False), (5, True)]
        # the masked success does not move the weights: not forwarded again
        assert new[1]["rows_trained"] == 2
    elif case == "ppo_tis":
        assert sorted(first) == [(b, True) for b in kept]
    assert 4 not in {b for b, _ in seen}  # the invalid row is never forwarded


def test_pi_old_is_measured_apart_when_dropout_is_on(tiny_model_dir):
    """With lora_dropout a training forward is not π_θ: π_old then comes from a no-grad pass before the
    first update (the same log-probs learner.policy_logprobs gives), not from that update's forward."""
    cfg = config.load_config(ROOT / "configs" / "tiny.yaml", [
        "algo.loss=ppo", "algo.baseline=grpo", "algo.mismatch=none", f"model.path={tiny_model_dir}",
        "model.lora=true", "model.lora_dropout=0.5", "train.micro_batch_tokens=1"])
    acfg = config.algo_cfg(cfg)
    torch.manual_seed(0)
    model = learner.load_model(cfg, "cpu")
    with torch.no_grad():  # an adapter that acts, so that its dropout changes the forward
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    assert learner.dropout_active(model)
    batch = _synthetic_batch(model.config.vocab_size)
    want = learner.policy_logprobs(model, batch, 1)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
    learner.rl_step(model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0), batch,
                    algo.compute_advantages(batch, acfg), acfg, cfg.train, keep_old=True)
    assert torch.equal(batch.old_logprobs, want)
    model.train()
    with torch.no_grad():
        dropped, _ = learner.model_logprobs(model, batch.input_ids[:1, :40], batch.attention_mask[:1, :40])
    assert not torch.equal(dropped[0], want[0, :40])  # a training forward would not have been π_old


@pytest.mark.parametrize("lora", [False, True])
def test_kl_term_is_k3_to_model_path_weights(tiny_model_dir, lora):
    """Bug: algo.kl_coef > 0 loaded as valid, then failed on the first step: no reference log-probs
    were ever computed. π_ref is model.path's weights: a frozen copy, or under LoRA the same model
    with its adapter disabled; the logged kl_ref is k3 against it, by hand."""
    from transformers import AutoModelForCausalLM
    cfg = config.load_config(ROOT / "configs" / "tiny.yaml",
                            ["algo.kl_coef=0.1", "algo.baseline=grpo", "algo.mismatch=none",
                             f"model.path={tiny_model_dir}", f"model.lora={str(lora).lower()}"])
    acfg = config.algo_cfg(cfg)
    model = learner.load_model(cfg, "cpu")
    torch.manual_seed(0)
    with torch.no_grad():  # the policy moves away from model.path's weights (under LoRA: the adapter)
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    batch = _synthetic_batch(model.config.vocab_size)
    ref_model = learner.load_reference(cfg, "cpu")
    assert (ref_model is None) == lora
    learner.fill_ref_logprobs(model, ref_model, batch, cfg.train.micro_batch_tokens)

    def lp_of(m):
        with torch.no_grad():
            return logprobs.token_logprobs(m(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                                             use_cache=False).logits, batch.input_ids)[0]
    want_ref, lp = lp_of(AutoModelForCausalLM.from_pretrained(tiny_model_dir)), lp_of(model)
    mask = learner.trained_positions(batch)
    torch.testing.assert_close(batch.ref_logprobs[mask], want_ref[mask], rtol=1e-5, atol=1e-5)
    tok = batch.loss_mask.bool()
    d = (want_ref - lp)[tok].double()
    kl = float((d.exp() - d - 1).mean())
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
    m = learner.rl_step(model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0), batch,
                        algo.compute_advantages(batch, acfg), acfg, cfg.train)
    assert kl > 1e-4 and m["kl_ref"] == pytest.approx(kl, rel=1e-4)


def test_sft_validation_scores_unseen_oracle_trajectories_and_stops_early(tiny_model_dir, docker_env,
                                                                          tmp_path):
    """SFT on 4 copy tasks, validated on 3 others: val_oracle_prob is the mean chance of sampling
    each unseen oracle trajectory exactly (checked against a plain forward); with
    sft.stop_at_val_prob set between two validations, SFT ends at the first one that reaches it."""
    import rollout
    from policy import ScriptedPolicy
    from generated_tasks import generate_easy_tasks
    from transformers import AutoTokenizer
    tasks = generate_easy_tasks(7, seed=3, kinds=["copy"])
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)

    def sft(stop_at, out):
        cfg = config.load_config(ROOT / "configs" / "tiny.yaml", [
            f"model.path={tiny_model_dir}", "sft.steps=6", "sft.batch_size=4", "sft.lr=1e-2",
            "sft.val_tasks=3", "sft.val_every=2", f"sft.stop_at_val_prob={stop_at}",
            "rollout.tools_in_prompt=true"])  # the prompt these step-by-step figures were chosen on
        torch.manual_seed(0)
        model = learner.load_model(cfg, "cpu")
        out.mkdir()
        log = rundir.RunLog(out, None, tensorboard=False)
        rcfg = config.rollout_cfg(cfg)
        sftmod.warm_start(cfg, model, tok, docker_env, tasks[:4], tasks[4:], rcfg, log)
        log.close()
        return model, [r for r in log.records if r["phase"] == "sft"], rcfg

    model, recs, rcfg = sft(0.0, tmp_path / "a")
    assert [r["step"] for r in recs] == list(range(6))
    probs = [r.get("val_oracle_prob") for r in recs]
    assert [p is not None for p in probs] == [False, True] * 3
    with ScriptedPolicy(tok, "oracle", tools=rcfg.tools) as oracle:  # rendered as SFT renders them
        val = rollout.collect(tasks[4:], oracle, docker_env,
                              dataclasses.replace(rcfg, prefill_prob=0.0, group_redundancy=0),
                              group_size=1, progress=False)
    batch = rollout.make_batch(val, tok.pad_token_id)
    with torch.no_grad():
        lp, _ = logprobs.token_logprobs(model(input_ids=batch.input_ids,
                                              attention_mask=batch.attention_mask).logits,
                                        batch.input_ids, temperature=rcfg.temperature)
    per_traj = (lp * batch.loss_mask).sum(1).double()
    assert probs[5] == pytest.approx(per_traj.exp().mean().item(), rel=1e-3)
    assert recs[5]["val_nll"] == pytest.approx((-per_traj.sum() / batch.loss_mask.sum()).item(), rel=1e-4)
    assert 0 < probs[1] < probs[3], f"SFT on copy tasks should raise the chance of unseen copy demos: {probs}"

    _, stopped, _ = sft((probs[1] + probs[3]) / 2, tmp_path / "b")  # same seed, same data: same numbers
    assert [r["step"] for r in stopped] == [0, 1, 2, 3]
    assert stopped[3]["val_oracle_prob"] == pytest.approx(probs[3], rel=1e-4)


# --- checkpoints ----------------------------------------------------------------------------


def _write_file(d: Path):
    d.mkdir(parents=True)
    (d / "weights.bin").write_bytes(os.urandom(64))


def test_keep_last_keeps_the_sft_only_start(tmp_path):
    """Bug: checkpoint.keep_last: 2 deleted step_000000, the SFT-only start the README's
    bench_learning command points at (and every RL gain is measured against)."""
    root = tmp_path / "ckpt"
    for step in (0, 10, 20, 30):
        rundir.save_checkpoint(root, step, _write_file, {"step": step}, keep_last=2)
    assert sorted(p.name for p in root.glob("step_*")) == ["step_000000", "step_000020", "step_000030"]


def test_checkpoints_are_atomic_and_keep_the_last_k(tmp_path):
    root = tmp_path / "ckpt"
    for step in range(1, 6):
        rundir.save_checkpoint(root, step, _write_file, {"step": step}, keep_last=2)
    assert sorted(p.name for p in root.glob("step_*")) == ["step_000004", "step_000005"]
    assert rundir.latest_checkpoint(root).name == "step_000005"

    def killed_mid_save(d: Path):
        _write_file(d)
        raise KeyboardInterrupt("killed while writing")
    with pytest.raises(KeyboardInterrupt):
        rundir.save_checkpoint(root, 6, killed_mid_save, {"step": 6}, keep_last=2)
    latest = rundir.latest_checkpoint(root)  # still the last complete one
    assert latest.name == "step_000005" and torch.load(latest / "trainer.pt")["step"] == 5
    assert not (root / "step_000006").exists() and list(root.glob(".tmp-*"))
    # the next save (here: another process, as after a restart) sweeps the half-written directory away
    subprocess.run([sys.executable, "-c", "import sys, rundir; from pathlib import Path; "
                    "rundir.save_checkpoint(Path(sys.argv[1]), 7, lambda d: d.mkdir(), {'step': 7}, 2)",
                    str(root)], cwd=ROOT, check=True)
    assert not list(root.glob(".tmp-*"))
    assert rundir.latest_checkpoint(root).name == "step_000007"


# A child process saves the steps it is given (keep_last=1; 2 MiB model files). With a kill mode it
# dies by SIGKILL during the last save: "mid-write" once half of that model file is on disk,
# "before-latest" the instant it would move `latest` (any os.rename/os.replace onto a file of
# that name), i.e. after step_<N>/ got its final name.
_SAVE_CHILD = """
import os, signal, sys, time
from pathlib import Path
import rundir
root, mode, steps = Path(sys.argv[1]), sys.argv[2], [int(s) for s in sys.argv[3:]]

def write_model(d, die=False):
    d.mkdir(parents=True)
    with open(d / "model.bin", "wb") as f:
        f.write(os.urandom(1 << 20))
        f.flush()
        if die:
            print("half written", flush=True)
            time.sleep(600)
        f.write(os.urandom(1 << 20))

def die_before_latest(real):
    def call(src, dst, *a, **k):
        if Path(dst).name == "latest":
            os.kill(os.getpid(), signal.SIGKILL)
        return real(src, dst, *a, **k)
    return call

for step in steps:
    last = step == steps[-1]
    if last and mode == "before-latest":
        os.rename, os.replace = die_before_latest(os.rename), die_before_latest(os.replace)
    rundir.save_checkpoint(root, step, lambda d: write_model(d, last and mode == "mid-write"),
                           {"step": step}, 1)
    print(f"saved {step}", flush=True)
"""


def _save_child(root: Path, mode: str, *steps: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _SAVE_CHILD, str(root), mode, *map(str, steps)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)


def _consistent(ck: Path) -> int:
    """The step of a checkpoint whose pieces agree: its name, trainer.pt, meta.json, a whole model file."""
    step = int(ck.name.split("_")[1])
    assert torch.load(ck / "trainer.pt")["step"] == step
    assert json.loads((ck / "meta.json").read_text())["step"] == step
    assert (ck / "model" / "model.bin").stat().st_size == 2 << 20, f"{ck}: model file cut short"
    return step


@pytest.mark.parametrize("mode", ["mid-write", "before-latest"])
def test_sigkill_during_a_save_leaves_a_consistent_latest(tmp_path, mode):
    """A real SIGKILL (no except/finally runs) while step 2 is saved over step 1 with keep_last=1:
    resuming finds a complete checkpoint whose pieces agree, and the resumed run's next save works.
    Catches: writing straight into step_<N>/ (a kill leaves a half-written step that looks final),
    deleting old checkpoints before `latest` names the new one (keep_last=1: `latest` would name a
    deleted step), moving `latest` before the rename, or a stale temp dir the next save trips on."""
    root = tmp_path / "ckpt"
    child = _save_child(root, mode, 1, 2)
    try:
        assert child.stdout.readline() == "saved 1\n"
        if mode == "mid-write":  # event-driven: the kill lands once half the file is on disk
            assert child.stdout.readline() == "half written\n"
            child.send_signal(signal.SIGKILL)
        assert child.wait(120) == -signal.SIGKILL
    finally:
        child.kill()
    step = _consistent(rundir.latest_checkpoint(root))
    if mode == "mid-write":
        assert step == 1 and not (root / "step_000002").exists()  # step 2 was never complete
    else:  # step 2 was complete and renamed: either one is a consistent point to resume from
        assert step in (1, 2) and _consistent(root / "step_000002") == 2
    resumed = _save_child(root, "none", 2)  # the resumed run saves step 2 again
    assert resumed.wait(120) == 0
    assert rundir.latest_checkpoint(root).name == "step_000002" and _consistent(root / "step_000002") == 2
    assert not list(root.glob(".tmp-*"))


def test_checkpoint_model_loads_in_transformers_and_peft(tiny_model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    for lora in (False, True):
        cfg = config.load_config(ROOT / "configs" / "tiny.yaml",
                                 [f"model.path={tiny_model_dir}", f"model.lora={lora}"])
        model = learner.load_model(cfg, "cpu")
        ckpt = rundir.save_checkpoint(tmp_path / f"lora{lora}", 1,
                                      lambda d: learner.save_model(model, tok, d), {"step": 1}, 1)
        path = ckpt / "model"
        if lora:
            assert (path / "adapter_config.json").exists()
            PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), path)
        else:
            reloaded = AutoModelForCausalLM.from_pretrained(path)
            for (n, a), b in zip(model.state_dict().items(), reloaded.state_dict().values()):
                torch.testing.assert_close(a, b, msg=n)
        AutoTokenizer.from_pretrained(path)
        resumed = learner.load_model(cfg, "cpu", resume=ckpt)
        assert sum(p.numel() for p in resumed.parameters() if p.requires_grad) == \
            sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_lora_update_reaches_the_vllm_engine(tiny_model_dir, tiny_tokenizer, vllm_engine, tmp_path):
    """model.lora: SFT steps (learner.sft_step) on the adapter, train.sync_weights hot-swaps it into the
    session's vLLM CPU engine; then the engine's greedy reply is the trainer's greedy reply with the
    new adapter, which is not the base model's, and its sampled-token log-probs are the trainer's.
    train.py's score-based sync check is off for LoRA on vLLM CPU; this is the proof that the adapter
    lands. Catches a sync whose adapter never reaches the engine (an adapter id vLLM has cached,
    verl#7495; saving the untrained adapter or the base weights)."""
    from chat import ChatFormat
    from engines import Sampling
    from policy import Policy
    cfg = config.load_config(ROOT / "configs" / "tiny.yaml",
                             [f"model.path={tiny_model_dir}", "model.lora=true"])
    stop = ChatFormat(tiny_tokenizer).stop_id
    prompt = tiny_tokenizer.encode("<|im_start|>user\nSay the word<|im_end|>\n<|im_start|>assistant\n")
    ids = torch.tensor([prompt + tiny_tokenizer.encode("banana", add_special_tokens=False) + [stop]])
    loss = torch.zeros(ids.shape)
    loss[0, len(prompt):] = 1
    batch = algo.Batch(input_ids=ids, attention_mask=torch.ones_like(ids), loss_mask=loss,
                       imitation_mask=torch.zeros(ids.shape), chunk_ids=(loss - 1).long(),
                       num_chunks=torch.ones(1, dtype=torch.long), infer_logprobs=torch.zeros(ids.shape),
                       reward=torch.ones(1), valid=torch.ones(1, dtype=torch.bool),
                       group_id=torch.zeros(1, dtype=torch.long),
                       policy_version=torch.zeros(1, dtype=torch.long), finish_reason=["submitted"])
    torch.manual_seed(0)
    model = learner.load_model(cfg, "cpu")
    opt, sched = learner.make_optimizer(model, 1e-2, 0.0, (0.9, 0.999), 0, 20, "constant")
    for _ in range(20):
        learner.sft_step(model, opt, sched, batch, cfg.train)
    model.eval()

    def trainer_greedy():
        with torch.no_grad():
            return model.generate(torch.tensor([prompt]),
                                  attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                  do_sample=False, max_new_tokens=12, eos_token_id=stop,
                                  pad_token_id=tiny_tokenizer.pad_token_id)[0, len(prompt):].tolist()
    with model.disable_adapter():
        base = trainer_greedy()
    tuned = trainer_greedy()
    assert tuned != base, "the updates must change the greedy reply for this test to mean anything"
    greedy = Sampling(temperature=0.0, max_tokens=12, stop_token_ids=(stop,))
    with Policy(vllm_engine, tiny_tokenizer) as policy:
        try:
            assert policy.generate(prompt, greedy).token_ids == base
            train.sync_weights(model, policy, cfg, tmp_path, 1)
            assert policy.version == 1 and policy.generate(prompt, greedy).token_ids == tuned
            c = policy.generate(prompt, Sampling(temperature=1.0, max_tokens=12, seed=3,
                                                 stop_token_ids=(stop,)))
        finally:  # the engine is shared by the whole session: back to the base model
            policy.load_lora(None, 0)
    seq = torch.tensor([prompt + c.token_ids])
    with torch.no_grad():
        lp, _ = logprobs.token_logprobs(model(input_ids=seq).logits, seq)
    gap = (lp[0, len(prompt):] - torch.tensor(c.logprobs)).abs().max().item()
    assert gap < 5e-5, gap  # tests/test_rollout.py's TOL: one stale layer would exceed it


# --- end to end (slow): a short real run, SIGKILLed and resumed ---------------------------

def _rl_tasks(out: Path) -> dict:
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["tasks"] for r in recs if r.get("phase") == "rl"}


def _same_tensors(a, b, where: str):
    """a and b equal bit for bit: tensors, and dicts / lists / tuples / numpy arrays of them."""
    import numpy as np
    if torch.is_tensor(a):
        assert torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, np.ndarray):
        assert np.array_equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _same_tensors(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same_tensors(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def _sharded_state(ck: Path) -> dict:
    """A torchrun checkpoint's dcp/ shards read whole in this one process: {"model": {name: tensor},
    "optimizer": {"state": {name: {...}}, "param_groups": [...]}} (and "sft_optimizer" at step 0)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    whole = ck.parent.parent.parent / f"{ck.parent.parent.name}-{ck.name}-whole.pt"
    dcp_to_torch_save(ck / "dcp", whole)
    return torch.load(whole, weights_only=False)


def _same_checkpoint(a: Path, b: Path, skip_rng=()):
    """Weights, optimizer and scheduler state, RNG states (but `skip_rng`) and refreshed experts of
    two checkpoints, bit for bit: one process's (model/ and trainer.pt) or torchrun's (dcp/ shards
    and trainer.pt)."""
    from safetensors.torch import load_file
    sa, sb = (torch.load(c / "trainer.pt", weights_only=False) for c in (a, b))
    if (a / "dcp").is_dir() or (b / "dcp").is_dir():
        _same_tensors(_sharded_state(a), _sharded_state(b), f"{a.name} dcp")
    else:
        files = sorted(p.name for p in (a / "model").glob("*.safetensors"))  # the model, or the LoRA adapter
        assert files and files == sorted(p.name for p in (b / "model").glob("*.safetensors"))
        for f in files:
            _same_tensors(load_file(a / "model" / f), load_file(b / "model" / f), f"{a.name} {f}")
    for r in skip_rng:
        sa["rng"].pop(r), sb["rng"].pop(r)
    for key in ("step", "optimizer", "scheduler", "rng", "experts", "difficulty"):
        _same_tensors(sa.get(key), sb.get(key), f"{a.name} {key}")


# what a sampled trajectory is, without its wall-clock timings and the test runner's own output
_TRAJ_KEYS = ("task_name", "group_id", "policy_version", "prefill_k", "messages", "reward", "valid", "error",
              "finish_reason", "num_turns", "num_tokens", "num_model_tokens")


def _rows(log: Path) -> list[str]:
    return [json.dumps({k: r.get(k) for k in _TRAJ_KEYS}, sort_keys=True)
            for r in map(json.loads, log.read_text().splitlines())]


# what a metrics record says about the run, without the wall-clock times and host counts
_RECORD_KEYS = ("phase", "step", "reward", "success", "tasks", "episodes", "loss", "grad_norm", "tokens",
                "val_nll", "val_oracle_prob", "rows_trained", "policy_version")


def _records(out: Path) -> list[dict]:
    return [{k: r[k] for k in _RECORD_KEYS if k in r}
            for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())]


def _trajectories(out: Path, version: int) -> list[str]:
    rows = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()
            if line.endswith("}")]  # a line the kill cut short is not a trajectory
    return [json.dumps({k: r.get(k) for k in _TRAJ_KEYS}, sort_keys=True) for r in rows
            if r["policy_version"] == version]


def test_a_batch_without_signal_leaves_the_weights_alone(tiny_model_dir, tmp_path):
    """IPA with R in {0, 1} learns from successes only: an RL step whose episodes all failed leaves
    the weights where SFT left them. Before, its zero-loss AdamW steps moved every weight by the
    momentum SFT's steps had left (sft.keep_moments)."""
    from safetensors.torch import load_file
    overrides = ["model.build_tiny=false", f"model.path={tiny_model_dir}", f"out_dir={tmp_path / 'run'}",
                 "sft.steps=2", "sft.num_tasks=4", "sft.batch_size=4", "algo.negative_reward=0.0",
                 "train.steps=1", "train.tasks_per_step=2", "train.group_size=2", "train.updates_per_step=2",
                 "rollout.max_turns=2", "rollout.max_tokens_per_turn=32", "eval.at_start=false",
                 "eval.num_tasks=1", "eval.samples=1", "checkpoint.every=1", "checkpoint.keep_last=2"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    r = subprocess.run([sys.executable, "train.py", "--config", "configs/tiny.yaml"]
                       + sum((["--set", o] for o in overrides), []), cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    out = tmp_path / "run"
    rl = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
          if json.loads(line)["phase"] == "rl"]
    # the premise: two SFT steps leave the tiny model solving nothing
    assert len(rl) == 1 and rl[0]["episodes"] == 4 and rl[0]["success"] == 0.0
    sft_only, after = (load_file(next((out / "checkpoints" / f"step_{s:06d}" / "model")
                                      .glob("*.safetensors"))) for s in (0, 1))
    assert sft_only.keys() == after.keys()
    for k in sft_only:
        assert torch.equal(sft_only[k], after[k]), f"{k} moved on a batch of failures"
    assert "loss" not in rl[0]  # no optimizer step was logged


def test_a_finished_run_can_drop_its_moments_and_still_continue(tiny_model_dir, tmp_path):
    """checkpoint.final_optimizer: false keeps AdamW's moments out of the last step's checkpoint
    alone (the SFT-only start keeps SFT's, which every branch starts from); a comparison still reads
    the run as finished, and a run continued past its steps starts AdamW afresh and says so."""
    sys.path.insert(0, str(ROOT / "bench"))
    import compare_algos
    out = tmp_path / "run"
    overrides = ["model.build_tiny=false", f"model.path={tiny_model_dir}", f"out_dir={out}", "sft.steps=1",
                 "sft.num_tasks=4", "sft.batch_size=4", "train.steps=2", "train.tasks_per_step=2",
                 "train.group_size=2", "rollout.max_turns=2", "rollout.max_tokens_per_turn=32",
                 "eval.at_start=false", "eval.num_tasks=1", "eval.samples=1", "checkpoint.every=1",
                 "checkpoint.keep_last=3", "checkpoint.final_optimizer=false"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}

    def run(*extra):
        r = subprocess.run([sys.executable, "train.py", "--config", "configs/tiny.yaml"]
                           + sum((["--set", o] for o in overrides), []) + list(extra), cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        return r

    run()
    ck = out / "checkpoints"
    states = {s: torch.load(ck / f"step_{s:06d}" / "trainer.pt", weights_only=False) for s in (0, 1, 2)}
    assert "sft_optimizer" in states[0] and "optimizer" in states[1]
    assert "optimizer" not in states[2] and states[2]["step"] == 2
    size = {s: (ck / f"step_{s:06d}" / "trainer.pt").stat().st_size for s in (1, 2)}
    assert size[2] < size[1] / 2, size
    assert compare_algos.run_action(out, 2) == "summarise"
    r = run("--set", "train.steps=3", "--resume")
    assert "continuing from step 2, whose checkpoint has no AdamW moments" in r.stderr
    assert "optimizer" not in torch.load(ck / "step_000003" / "trainer.pt", weights_only=False)
    rl = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
          if json.loads(line)["phase"] == "rl"]
    assert [m["step"] for m in rl] == [1, 2, 3]


def test_sft_and_rl_take_the_generated_split_their_keys_name(tiny_model_dir, tmp_path):
    """sft.generated_split=rl and train.generated_split=rl: SFT imitates the oracles of the rl
    split's tasks, which share no name, word or number with the train split's
    (tests/test_multistep.py), and the RL steps draw them, of train.generated_kinds' kinds alone,
    one of each a step under train.draw_by_kind (a plain draw of this seed gives a step two of one); a
    config that names a split of tasks loaded from folders, or a kind the tasks lack, is refused
    with the key to change."""
    overrides = ["model.build_tiny=false", f"model.path={tiny_model_dir}", f"out_dir={tmp_path / 'run'}",
                 "sft.steps=1", "sft.num_tasks=4", "sft.batch_size=4", "sft.generated_split=rl",
                 "train.generated_split=rl", "train.generated_kinds=[count,copy]", "train.steps=2",
                 "train.tasks_per_step=2", "train.group_size=1", "train.draw_by_kind=true",
                 "rollout.max_turns=2", "eval.at_start=false", "eval.num_tasks=1"]  # the tiny tokenizer
    # spells the rl split's words in pieces (tiny.build_for_tasks): its commands take the config's 64 tokens
    cfg = config.load_config(ROOT / "configs" / "tiny.yaml", overrides)
    train_split, _ = train.load_task_sets(cfg)
    rl_tasks = train.split_tasks(cfg, "rl", train_split)
    assert len(rl_tasks) == len(train_split) and {t.metadata["split"] for t in rl_tasks} == {"rl"}
    assert train.split_tasks(cfg, "train", train_split) is train_split
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    r = subprocess.run([sys.executable, "train.py", "--config", "configs/tiny.yaml"]
                       + sum((["--set", o] for o in overrides), []), cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in records if m["phase"] == "sft"] == [0]  # on rl oracles that passed
    drawn = [name for m in records if m["phase"] == "rl" for name in m["tasks"]]
    assert len(drawn) == 4 and set(drawn) <= {t.name for t in rl_tasks}, drawn
    steps = [sorted(task_kind(name) for name in m["tasks"]) for m in records if m["phase"] == "rl"]
    assert steps == [["copy", "count"]] * 2, steps
    refused = r"'sft.generated_split' is 'rl'.*data.train_tasks=generated"
    with pytest.raises(config.ConfigError, match=refused):
        config.load_config(ROOT / "configs" / "tiny.yaml", ["data.train_tasks=tasks",
                                                             "sft.generated_split=rl"])
    with pytest.raises(config.ConfigError, match=r"'train.generated_kinds' picks .*train_tasks=generated"):
        config.load_config(ROOT / "configs" / "tiny.yaml", ["data.train_tasks=tasks",
                                                             "train.generated_kinds=[count]"])


@pytest.mark.slow
def test_intermediate_evals_take_eval_samples_mid_and_every_eval_logs_its_interval(tiny_model_dir, tmp_path):
    """The held-out evals between the first and the last run eval.samples_mid episodes a task; the
    first and last, between which the gain is read, keep eval.samples. Each eval record carries
    its 95% interval (evaluate.task_mean_ci) and the episodes it rests on; the summary says them,
    and the run's peak resident memory as the kernel counts it (wait4)."""
    out = tmp_path / "run"
    overrides = ["model.build_tiny=false", f"model.path={tiny_model_dir}", f"out_dir={out}", "engine.kind=hf",
                 "sft.steps=0", "train.steps=3", "train.tasks_per_step=1", "train.group_size=1",
                 "rollout.max_turns=1", "rollout.max_tokens_per_turn=16", "eval.every=1", "eval.num_tasks=3",
                 "eval.samples=2", "eval.samples_mid=1", "checkpoint.every=3", "plot=false"]
    with open(tmp_path / "log", "w") as log:
        proc = subprocess.Popen([sys.executable, "train.py", "--config", "configs/tiny.yaml"]
                                + _sets(overrides), cwd=ROOT, stdout=log, stderr=log)
        timer = threading.Timer(900, proc.kill)  # wait4 itself has no timeout
        timer.start()
        _, status, usage = os.wait4(proc.pid, 0)  # the kernel's own account of the run's memory
        timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0, (tmp_path / "log").read_text()[-3000:]
    evals = [rec for rec in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
             if rec["phase"] == "eval"]
    assert [(e["step"], e["samples"]) for e in evals] == [(0, 2), (1, 1), (2, 1), (3, 2)]
    rows = [json.loads(line) for line in (out / "eval_trajectories.jsonl").read_text().splitlines()]
    assert len(rows) == 3 * (2 + 1 + 1 + 2)
    for e in evals:
        low, high = e["success_ci"]
        assert e["episodes"] == 3 * e["samples"] and 0.0 <= low <= e["success"] <= high <= 1.0
        assert high - low > 0.2  # a handful of episodes: Wilson's interval stays wide, even at 0 or 1
    first, last = evals[0], evals[-1]
    summary = (out / "summary.txt").read_text()
    assert (f"start {first['success']:.1%} [{first['success_ci'][0]:.1%}, {first['success_ci'][1]:.1%}] "
            f"(step 0, 6 episodes) -> end {last['success']:.1%}") in summary, summary
    peak = float(summary.split("peak resident memory: ")[1].split(" GiB")[0])
    assert abs(peak - usage.ru_maxrss / 2 ** 20) < 0.02, (summary, usage.ru_maxrss)


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True])
def test_sigkill_and_resume_continues_the_unbroken_run_bit_for_bit(lora, tiny_model_dir, tmp_path):
    """A real run (SFT + 3 RL steps, vLLM CPU + Docker; all weights, or a LoRA adapter), SIGKILLed
    after its first RL checkpoint and resumed, ends where an unbroken run with the same config
    ends, bit for bit: weights (or adapter), AdamW moments, scheduler, RNG states, and the
    trajectories every step samples (after the resume point: so the restarted engine serves the
    checkpoint's weights or adapter, with the same seeds); before it the two runs agree too. With
    algo.negative_reward=-1 every RL step moves the weights. Catches a resume that restores the
    weights but not the optimizer (moments restart at 0), the scheduler, the RNG states (vLLM's
    start reseeds them), the data position, or the engine's weights / adapter, any of which the old
    check (the tasks each step trained on, a pure function of the step) let through."""
    import shutil
    model = tmp_path / "tiny"
    shutil.copytree(tiny_model_dir, model)
    overrides = ["model.build_tiny=false", f"model.path={model}",
                 "sft.steps=2", "sft.num_tasks=4", "sft.batch_size=4", "sft.val_tasks=2",
                 "train.steps=3", "train.tasks_per_step=2", "train.group_size=2",
                 "rollout.max_turns=3", "rollout.max_tokens_per_turn=64",
                 "eval.num_tasks=2", "eval.samples=1", "eval.every=0", "checkpoint.every=1",
                 "checkpoint.keep_last=3", "algo.negative_reward=-1.0", f"model.lora={lora}"]
    cmd = [sys.executable, "train.py", "--config", "configs/tiny.yaml"] + _sets(overrides)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    whole, out = tmp_path / "whole", tmp_path / "run"
    with open(tmp_path / "whole.log", "w") as wf, open(tmp_path / "first.log", "w") as f:
        unbroken = subprocess.Popen(cmd + ["--set", f"out_dir={whole}"], cwd=ROOT, env=env, stdout=wf,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        proc = subprocess.Popen(cmd + ["--set", f"out_dir={out}"], cwd=ROOT, env=env, stdout=f,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        lock = out / rundir.LOCK
        # the lock file names the writer once it is locked
        while not (lock.exists() and lock.read_text().startswith(f"{proc.pid} ")):
            assert proc.poll() is None, (tmp_path / 'first.log').read_text()[-3000:]
            time.sleep(0.1)
        # a --resume while the run trains is refused, naming the writer (both wrote, before)
        second = subprocess.run(cmd + ["--set", f"out_dir={out}", "--resume"], cwd=ROOT, env=env, timeout=900,
                                capture_output=True, text=True)
        assert second.returncode == 1, second.stderr
        assert f"{out} is being written by process {proc.pid}" in second.stderr, second.stderr
        # the kill must land after checkpoint 1 and before the run ends: a window of two RL steps
        # (rollout, update, sync, checkpoint: seconds each even on 2 busy cores) against a 0.1 s poll
        deadline = time.time() + 900
        while not (out / "checkpoints" / "step_000001").exists():
            assert proc.poll() is None, ("the run ended before its first RL checkpoint:\n"
                                         + (tmp_path / "first.log").read_text()[-3000:])
            assert time.time() < deadline
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    killed_at = sorted(_rl_tasks(out))
    assert killed_at and killed_at[-1] < 3, "the kill came too late to test resuming"
    resumed_from = int(rundir.latest_checkpoint(out / "checkpoints").name.split("_")[1])
    subprocess.run(cmd + ["--set", f"out_dir={out}", "--resume"], cwd=ROOT, env=env, check=True, timeout=900,
                   capture_output=True)
    assert unbroken.wait(900) == 0, (tmp_path / "whole.log").read_text()[-3000:]

    # every step, the kill's run before it too: a step's rollouts, then the state it trained to, so a
    # difference is named where it began (an episode one run lost shows as its row, not as weights)
    for step in range(4):
        if step:
            a = _trajectories(whole, step - 1)  # sampled by the policy of step - 1
            b = _trajectories(out, step - 1)[-len(a):]
            differ = [r[:600] for r in sorted(set(a) ^ set(b))[:2]]
            assert a and sorted(a) == sorted(b), (f"step {step}'s rollouts differ (resumed from "
                                                  f"{resumed_from}): {differ}")
        # torch's global generator is left out: the engine in this process owns it during a step (the
        # transformers engine reseeds it per request, in finish order; vLLM CPU draws from it by its
        # own history), so it differs between two runs although python's and numpy's agree; training
        # draws nothing from it here (no dropout, per-episode sampling seeds), as the equal weights show
        _same_checkpoint(whole / "checkpoints" / f"step_{step:06d}", out / "checkpoints" / f"step_{step:06d}",
                         skip_rng=("torch",))
    from safetensors.torch import load_file
    weights = [load_file(next((out / "checkpoints" / f"step_{s:06d}" / "model").glob("*.safetensors")))
               for s in range(4)]
    for s, (a, b) in enumerate(zip(weights, weights[1:])):
        assert any(not torch.equal(a[k], b[k]) for k in a), f"RL step {s + 1} did not move the weights"
    cfg = config.load_config(ROOT / "configs" / "tiny.yaml", overrides)
    tasks, _ = train.load_task_sets(cfg)
    expected = {s + 1: [t.name for t in train.step_tasks(tasks, s, 2, cfg.seed)] for s in range(3)}
    assert _rl_tasks(out) == expected == _rl_tasks(whole)
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in recs if r["phase"] == "rl"]
    assert all(r["loss"] == r["loss"] and "reward" in r and r["tokens"] > 0 for r in rl)  # finite loss
    assert any(r["phase"] == "sft" for r in recs) and any(r["phase"] == "eval" for r in recs)
    # a complete sync leaves ~1e-6 (fp32); one stale layer would show ~1e-4 and more (test_rollout's TOL);
    # under LoRA too (train.sync_gap scores one sequence at a time there)
    assert all(r["sync_gap_max"] < 5e-5 for r in rl), [r.get("sync_gap_max") for r in rl]
    assert sorted(p.name for p in (out / "checkpoints").glob("step_*")) == ["step_000000", "step_000001",
                                                                         "step_000002", "step_000003"]
    assert (out / "checkpoints" / "latest").read_text().strip() == "step_000003"
    assert (out / "summary.txt").exists() and (out / "trajectories.jsonl").exists()
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # matplotlib is a requirement
    # every log holds each step once after the kill (bug: 64 duplicate trajectory rows, a second eval record)
    keys = [(r["phase"], r["step"], r.get("restart", 0)) for r in recs]
    assert len(set(keys)) == len(keys), keys
    rows = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert len(rows) == 3 * 2 * 2  # steps x tasks_per_step x group_size
    evals = (out / "eval_trajectories.jsonl").read_text().splitlines()
    assert len(evals) == 2 * sum(r["phase"] == "eval" for r in recs)  # eval.num_tasks x eval.samples per eval
    # RL's AdamW continued SFT's moments (sft.keep_moments), across the kill too, at RL's own lr
    opt = torch.load(out / "checkpoints" / "step_000003" / "trainer.pt", weights_only=False)["optimizer"]
    assert {float(s["step"]) for s in opt["state"].values()} == {2.0 + 3.0 * cfg.train.updates_per_step}
    assert [g["lr"] for g in opt["param_groups"]] == [cfg.train.lr]
    # the logs are the unbroken run's, record for record (wall-clock times aside): none lost at the
    # kill, none added by the resume (bug: every resume added an eval record at the step it resumed from)
    assert _records(out) == _records(whole)
    for log in ("trajectories.jsonl", "eval_trajectories.jsonl"):
        assert sorted(_rows(out / log)) == sorted(_rows(whole / log)), log


@pytest.mark.slow
def test_sigkill_during_sft_and_resume_continues_the_unbroken_run_bit_for_bit(tiny_model_dir, tmp_path):
    """A run SIGKILLed during its SFT warm start, after an SFT checkpoint (sft.checkpoint_every), and
    resumed, equals the unbroken run bit for bit: every SFT record once (loss, grad norm, val_nll and
    val_oracle_prob), the early stop at sft.stop_at_val_prob after the same step, the SFT-only start
    (weights, SFT's AdamW moments and schedule, RNG states) and the RL step after it. Both leave no
    SFT checkpoint once step 0 is saved. Bug: SFT saved nothing until it ended, so a kill during it
    lost all of it."""
    import shutil
    model = tmp_path / "tiny"
    shutil.copytree(tiny_model_dir, model)
    overrides = ["model.build_tiny=false", f"model.path={model}", "engine.kind=hf", "sft.steps=8",
                 "sft.checkpoint_every=2", "sft.num_tasks=6", "sft.batch_size=3", "sft.val_tasks=2",
                 "sft.val_every=1", "sft.stop_at_val_prob=1e-48", "train.steps=1", "train.tasks_per_step=2",
                 "train.group_size=2", "rollout.max_turns=2", "rollout.max_tokens_per_turn=64",
                 "eval.num_tasks=0", "checkpoint.every=1", "algo.negative_reward=-1.0", "plot=false",
                 "tensorboard=false"]
    cmd = [sys.executable, "train.py", "--config", "configs/tiny.yaml"] + _sets(overrides)
    whole, out = tmp_path / "whole", tmp_path / "run"
    with open(tmp_path / "whole.log", "w") as wf, open(tmp_path / "first.log", "w") as f:
        unbroken = subprocess.Popen(cmd + ["--set", f"out_dir={whole}"], cwd=ROOT, stdout=wf,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        proc = subprocess.Popen(cmd + ["--set", f"out_dir={out}"], cwd=ROOT, stdout=f,
                                stderr=subprocess.STDOUT, start_new_session=True)
    ckpts = out / "checkpoints"
    # the kill lands after SFT step 2's checkpoint, with SFT steps left before step 0's
    kill_group_when(proc, (ckpts / "sft_000002").exists, tmp_path / "first.log", poll=0.01)
    killed_at = [r["step"] for r in _records(out) if r["phase"] == "sft"]
    assert not (ckpts / "step_000000").exists(), f"the kill came too late to test it: after {killed_at}"
    resumed_from = [p.name for p in rundir.checkpoints(ckpts)]  # the newest intact one
    second = subprocess.run(cmd + ["--set", f"out_dir={out}", "--resume"], cwd=ROOT, capture_output=True,
                            text=True, timeout=900)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-3000:]
    assert unbroken.wait(900) == 0, (tmp_path / "whole.log").read_text()[-3000:]

    sft = [r for r in _records(out) if r["phase"] == "sft"]
    assert [r["step"] for r in sft] == list(range(len(sft))) and all("val_oracle_prob" in r for r in sft)
    # val_oracle_prob climbs ~1e-116 -> 1e-38 over the 8 steps: the stop comes after the kill, before the end
    assert killed_at[-1] < len(sft) - 1 and len(sft) < 8, (killed_at, [r["val_oracle_prob"] for r in sft])
    assert _records(out) == _records(whole), (resumed_from, killed_at)
    for step in (0, 1):  # the engine draws from torch's generator once RL starts (see the test above)
        a, b = whole / "checkpoints" / f"step_{step:06d}", ckpts / f"step_{step:06d}"
        _same_checkpoint(a, b, skip_rng=("torch",) if step else ())
    sa, sb = (torch.load(c / "checkpoints" / "step_000000" / "trainer.pt", weights_only=False)
              for c in (whole, out))
    _same_tensors(sa["sft_optimizer"], sb["sft_optimizer"], "step_000000 sft_optimizer")
    assert {float(s["step"]) for s in sb["sft_optimizer"]["state"].values()} == {float(len(sft))}
    for run in (whole, out):  # superseded by the SFT-only start: no disk held for them
        assert not list((run / "checkpoints").glob("sft_*")), sorted((run / "checkpoints").iterdir())


@pytest.mark.slow
def test_a_run_that_fills_its_disk_stops_in_one_line_and_resumes(tiny_model_dir, tmp_path):
    """A real run (SFT + 2 RL steps) whose out_dir is a 64 MiB tmpfs: the SFT-only checkpoint fits,
    step 1's does not. Bug: raw tracebacks (torch.save's "unexpected pos" never says disk) and
    half-written .tmp dirs. The run stops with one line naming the full disk, step 0 intact; with
    room again (the tmpfs grown) --resume finishes the run."""
    import shutil
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(disk)]
    if subprocess.run(mount, capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root")
    try:
        model = shutil.copytree(tiny_model_dir, tmp_path / "tiny")
        out = disk / "run"
        overrides = ["model.build_tiny=false", f"model.path={model}", f"out_dir={out}", "sft.steps=2",
                     "sft.num_tasks=4", "sft.batch_size=4", "train.steps=2", "train.tasks_per_step=2",
                     "train.group_size=2", "train.updates_per_step=1", "rollout.max_turns=2",
                     "rollout.max_tokens_per_turn=32", "eval.num_tasks=0", "checkpoint.every=1",
                     "checkpoint.keep_last=3", "algo.negative_reward=-1.0", "tensorboard=false", "plot=false"]
        cmd = [sys.executable, "train.py", "--config", "configs/tiny.yaml"] + _sets(overrides)
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        first = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
        said = [ln for ln in first.stderr.splitlines() if "is full" in ln]
        assert first.returncode == 1 and "Traceback" not in first.stderr, first.stderr[-3000:]
        assert len(said) == 1 and said[0].startswith(f"checkpoint step_000001 not saved: the disk holding "
                                                     f"{out / 'checkpoints'} is full"), first.stderr[-3000:]
        assert "step_000000 the newest" in said[0] and "--resume" in said[0]
        ckpts = out / "checkpoints"
        assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_000000"]
        assert rundir.verify_checkpoint(ckpts / "step_000000") is None
        subprocess.run(["mount", "-o", "remount,size=256m", str(disk)], check=True)  # room again
        second = subprocess.run(cmd + ["--resume"], cwd=ROOT, env=env, capture_output=True, text=True,
                                timeout=900)
        assert second.returncode == 0, second.stderr[-3000:]
        assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_000000", "step_000001",
                                                           "step_000002"]
        assert [(r["phase"], r["step"]) for r in _records(out)] == [("sft", 0), ("sft", 1), ("rl", 1),
                                                                    ("rl", 2)]
        assert len(_rows(out / "trajectories.jsonl")) == 2 * 2 * 2
    finally:
        subprocess.run(["umount", "-l", str(disk)])


# --- torchrun (slow): two gloo ranks, on one node or two, DDP and FSDP2 ----------------------

# 3 tasks and 3 SFT rows: uneven shares, so the ranks run different numbers of micro-batches
TORCHRUN_OVERRIDES = ["model.build_tiny=false", "engine.kind=hf", "sft.steps=2", "sft.checkpoint_every=1",
                      "sft.num_tasks=4", "sft.batch_size=3", "sft.val_tasks=2", "train.tasks_per_step=3",
                      "train.group_size=2", "train.micro_batch_tokens=300", "algo.negative_reward=-1.0",
                      "rollout.max_turns=2", "rollout.prefill_prob=1.0", "rollout.refresh_expert=true",
                      "eval.num_tasks=0", "checkpoint.every=1", "checkpoint.keep_last=5", "plot=false",
                      "tensorboard=false"]


def _torchrun(nodes: int, args: list, log: Path, per_node=((), ())) -> list:
    """train.py `args` on 2 gloo ranks: one torchrun of 2 ranks (--standalone), or, as two nodes,
    two torchruns of 1 rank with --nnodes 2 and their --node-rank, meeting at node 0's free
    localhost port (the README's multi-node command). `per_node`: each node's own extra args.
    Returns the launches; each writes <log>.<node>."""
    if nodes == 1:
        launches = [["--standalone", "--nproc-per-node", "2"]]
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        launches = [["--nnodes", "2", "--node-rank", str(k), "--nproc-per-node", "1",
                     "--master-addr", "127.0.0.1", "--master-port", str(port)] for k in range(2)]
    procs = []
    for k, launch in enumerate(launches):
        with open(f"{log}.{k}", "w") as f:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", *launch, "train.py",
                 "--config", "configs/tiny.yaml", *args, *per_node[k]],
                cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=f, stderr=subprocess.STDOUT))
    return procs


def _sets(keys: list) -> list:
    return sum((["--set", k] for k in keys), [])


def _ended(procs: list, log: Path) -> tuple[list, str]:
    """(each launch's exit status, their output) once all have ended."""
    codes = [p.wait(900) for p in procs]
    return codes, "".join(f"--- node {k}\n" + Path(f"{log}.{k}").read_text()[-4000:]
                          for k in range(len(procs)))


def _shard_writers(dcp_dir: Path) -> dict:
    """{top-level key ("model", "optimizer", ...): the shard files holding its bytes}, from DCP's
    .metadata."""
    import pickle
    with open(dcp_dir / ".metadata", "rb") as f:
        meta = pickle.load(f)
    writers = {}
    for index, info in meta.storage_data.items():
        writers.setdefault(index.fqn.split(".")[0], set()).add(info.relative_path)
    return writers


@pytest.mark.slow
@pytest.mark.parametrize("parallel, nodes", [("ddp", 1), ("fsdp", 2)], ids=["ddp-one-node", "fsdp-two-nodes"])
def test_torchrun_two_ranks_move_in_step_and_resume_exactly(parallel, nodes, tiny_model_dir, tmp_path):
    """2 CPU ranks (gloo, transformers engines), on one node or as two nodes of one rank each:
    SFT + 1 RL step, then --resume for a 2nd, against an unbroken 2-step run. Shares are uneven,
    so ranks run different numbers of micro-batches. With algo.negative_reward=-1 every failed
    episode has a gradient, so each RL step moves the weights. Every checkpoint records both ranks'
    fingerprints, equal to the byte (sha256), and its model/ loads in transformers with exactly
    those weights; the resumed run's checkpoints equal the unbroken run's bit for bit (weights,
    optimizer, RNG, experts). Catches: a missed gradient all-reduce / reduce-scatter (the ranks
    drift apart, by less than the (sum, sum²) fingerprint could see), an RL update that never
    reaches the weights, a resume under torchrun that loses the (sharded) optimizer state or the
    RNG states, a --restart that moves the old run aside more than once (every node's rank),
    experts refreshed by each rank from its own share alone (the checkpoint held rank 0's: the
    other ranks' successes were lost at a resume), and ranks that share group ids and so sampling
    seeds."""
    import shutil
    from transformers import AutoModelForCausalLM
    model = tmp_path / "tiny"
    shutil.copytree(tiny_model_dir, model)
    out, whole = tmp_path / "run", tmp_path / "whole"
    overrides = TORCHRUN_OVERRIDES + [f"model.path={model}", f"train.parallel={parallel}"]
    unbroken = _torchrun(nodes, _sets(overrides + ["train.steps=2", f"out_dir={whole}"]),
                         tmp_path / "whole.log")
    out.mkdir()  # an old run, without a checkpoint: --restart moves it aside
    (out / "metrics.jsonl").write_text("{}\n")
    legs = (["--restart", "--set", "train.steps=1"], ["--resume", "--set", "train.steps=2"])
    for leg, extra in enumerate(legs):
        log = tmp_path / f"leg{leg}.log"
        codes, said = _ended(_torchrun(nodes, _sets(overrides + [f"out_dir={out}"]) + extra, log), log)
        assert codes == [0] * nodes, said
    codes, said = _ended(unbroken, tmp_path / "whole.log")
    assert codes == [0] * nodes, said
    assert [(p / "metrics.jsonl").read_text() for p in tmp_path.glob("run.*")] == ["{}\n"]  # moved aside once

    base = distributed.weights_fingerprint(AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32))
    digests = [base[2]]
    for step in (0, 1, 2):
        ck = out / "checkpoints" / f"step_{step:06d}"
        trainer = torch.load(ck / "trainer.pt", weights_only=False)
        fps = trainer["rank_fingerprints"]
        assert len(fps) == 2 and fps[0] == fps[1], fps  # sha256 included: the ranks agree to the byte
        # each rank wrote its own shard of the weights and AdamW state: rank 0 gathered neither
        assert not {"optimizer", "sft_optimizer"} & set(trainer), sorted(trainer)
        writers = _shard_writers(ck / "dcp")
        assert set(writers) >= {"model", "optimizer" if step else "sft_optimizer"}, sorted(writers)
        assert all(files == {"__0_0.distcp", "__1_0.distcp"} for files in writers.values()), writers
        meta = json.loads((ck / "meta.json").read_text())["sha256"]
        assert {"dcp/.metadata", "dcp/__0_0.distcp", "dcp/__1_0.distcp"} <= set(meta), sorted(meta)
        loaded = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
        loaded.load_state_dict(_sharded_state(ck)["model"])
        assert distributed.weights_fingerprint(loaded) == fps[0]
        # the Hugging Face export is each run's last step's alone (leg 0 ended at step 1), the shards' weights
        assert (ck / "model").is_dir() == (step > 0)
        if step:
            exported = AutoModelForCausalLM.from_pretrained(ck / "model", dtype=torch.float32)
            assert distributed.weights_fingerprint(exported) == fps[0]
        digests.append(fps[0][2])
        if step:  # the resumed run is where the unbroken one is, and so is the leg before the kill
            # torch's generator is the engine's (see above)
            _same_checkpoint(whole / "checkpoints" / ck.name, ck, skip_rng=("torch",))
    assert len(set(digests)) == 4, "SFT and each RL step must move the weights"
    # another world size: this one process reads the two ranks' shards into its own model and AdamW
    ck = out / "checkpoints" / "step_000001"
    one = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    opt, _ = learner.make_optimizer(one, 1e-3, 0.0, (0.9, 0.999), 0, 2, "constant")
    distributed.load_shards(ck / "dcp", one, {"optimizer": opt})
    saved = _sharded_state(ck)
    _same_tensors({n: p.detach() for n, p in one.named_parameters()}, {n: saved["model"][n] for n, _ in
                  one.named_parameters()}, "one process's weights")
    _same_tensors({n: opt.state[p] for n, p in one.named_parameters()},
                  {n: saved["optimizer"]["state"][n] for n, _ in one.named_parameters()},
                  "one process's AdamW")
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(r["phase"], r["step"]) for r in recs] == [("sft", 0), ("sft", 1), ("rl", 1), ("rl", 2)]
    assert all(r["grad_norm"] > 0 and r["rows_trained"] > 0 for r in recs[2:])
    cfg = config.load_config(ROOT / "configs" / "tiny.yaml", overrides)
    tasks, _ = train.load_task_sets(cfg)
    assert [r["tasks"] for r in recs[2:]] == [[t.name for t in train.step_tasks(tasks, s, 3, 0)]
                                             for s in (0, 1)]
    assert all(r["episodes"] == 6 and len(r["time/train_ranks"]) == 2 for r in recs[2:])
    # the experts at each checkpoint: the shortest success on each task by any rank so far
    rows = [json.loads(line) for k in range(2)
            for line in (out / f"trajectories.rank{k}.jsonl").read_text().splitlines()]
    for step in (1, 2):
        experts = torch.load(out / "checkpoints" / f"step_{step:06d}" / "trainer.pt",
                             weights_only=False)["experts"]
        solved = {r["task_name"] for r in rows
                  if r["valid"] and (r["reward"] or 0) > 0 and r["policy_version"] < step}
        assert set(experts) == solved, (step, sorted(experts), sorted(solved))
    # else the check above says little
    assert len({r["task_name"] for r in rows if (r["reward"] or 0) > 0}) >= 2
    # a group id names one task across all ranks (bug: every rank numbered its share from the same
    # id, so its sampling seeds, drawn from a stream keyed by that id, were the other ranks' too)
    task_of = {}
    for r in rows:
        named = task_of.setdefault((r["policy_version"], r["group_id"]), r["task_name"])
        assert named == r["task_name"], r["group_id"]


@pytest.mark.slow
def test_nodes_that_see_different_run_dirs_stop_at_once(tiny_model_dir, tmp_path):
    """Bug: with no filesystem shared between the nodes (here: each node given its own out_dir),
    node 1 ran SFT, then its engine looked for the SFT-only checkpoint that rank 0 had written on
    node 0, and failed with a file-not-found deep in transformers; a --resume there would find other
    checkpoints than rank 0's. Both nodes must stop at set-up, each saying once which rank does
    not see rank 0's directory."""
    sets = _sets(TORCHRUN_OVERRIDES + [f"model.path={tiny_model_dir}", "train.steps=1"])
    log = tmp_path / "log"
    codes, said = _ended(_torchrun(2, sets, log, per_node=[["--set", f"out_dir={tmp_path}/a"],
                                                           ["--set", f"out_dir={tmp_path}/b"]]), log)
    assert codes[0] != 0 and codes[1] != 0, said
    for k in range(2):
        node = Path(f"{log}.{k}").read_text()
        assert node.count(f"rank 1 on {socket.gethostname()}: {tmp_path}/b does not hold what rank 0 "
                          f"wrote in {tmp_path}/a") == 1, said
    assert not (tmp_path / "a" / "checkpoints").exists()  # stopped before SFT


def test_the_engines_cpu_kv_cache_is_the_configs_in_fractions_of_a_gib(tiny_model_dir):
    """Bug: engine.cpu_kvcache_gb went to vLLM as VLLM_CPU_KVCACHE_SPACE, whole GiB only and set once
    a process (the first engine's value won), so the SmolLM2 demo could not ask for 0.5 GiB. Now it
    is vLLM's kv_cache_memory_bytes, in a fresh process without the variable (conftest sets it)."""
    code = (f"import config, train\n"
            f"cfg = config.load_config('configs/tiny.yaml', ['engine.cpu_kvcache_gb=0.25', "
            f"'model.path={tiny_model_dir}', 'model.build_tiny=false'])\n"
            "e = train.make_engine(cfg, cfg.model.path, 'cpu')\n"
            "print('KV', e.engine.vllm_config.cache_config.kv_cache_memory_bytes)\n")
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"KV {2 ** 28}" in r.stdout, r.stdout[-2000:]
