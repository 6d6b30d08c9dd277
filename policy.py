"""The policy the episodes talk to: one engine behind a generation-loop thread, and its weight versions.

Many episode threads call `Policy.generate` at once; the loop thread adds every pending request
to the engine (engines.py) and steps it, so their turns share batches and container time overlaps
generation. A weight update (update_weights, load_lora) aborts the requests in flight and adds
them again on the new weights, under a new version that every completion carries;
`wait_for_version` gates asynchronous rollouts on it. `sync_check` compares the engine's
log-probs with the trainer's after a sync. `ScriptedPolicy` is a Policy over a ScriptedEngine.
"""
import queue
import sys
import threading
import time
import traceback
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from chat import TOOLS, ChatFormat
from engines import Completion, ScriptedEngine


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
        except Exception as e:  # noqa: BLE001 -- a broken engine may not abort; the futures failed already
            print(f"rollout: aborting {len(rids)} failed requests raised {type(e).__name__}: {e}",
                  file=sys.stderr)

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
                    print(f"rollout: {err}; failing its {len(self._futures)} requests\n"
                          f"{traceback.format_exc()}", file=sys.stderr, flush=True)
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
