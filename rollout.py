"""The episode loop: a policy plays terminal tasks, turn by turn, and we keep every token exactly.

One episode: a system prompt describing two tools (`bash`, `submit`) and the task instruction,
rendered with the tokenizer's chat template (chat.py). Each assistant turn is one chunk (reasoning
+ one `<tool_call>` JSON block, the Qwen format), sampled by a policy.Policy or replayed from an
expert; the command runs in the task's container (terminal.py) and its output comes back as a tool
message. The episode ends with one of FINISH_REASONS, then the hidden tests grade the container.

Token bookkeeping is token-in/token-out: sampled ids are appended exactly as the engine produced
them (never re-tokenised) and observations are appended as the chat template's *delta* (render a
fixed base conversation with and without the new messages, take the suffix). Each turn we check
that the tokens still decode to the rendered conversation and count mismatches (metrics
`text_mismatch`, `token_mismatch`): that is where re-tokenising pipelines drift silently.

`collect` plays groups of episodes on threads (redundancy, expert prefixes, staleness);
`make_batch` turns trajectories into algo.Batch, `write_jsonl` into JSONL.

    python rollout.py --model out/tiny --tasks tasks/ --group-size 2 --out rollouts.jsonl
"""
import argparse
import json
import logging
import math
import random
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from algo import Batch
from chat import EXAMPLE_CALL, TOOLS, parse_tool_call, tool_message
from container import InfraError
from engines import Completion, HFEngine, Sampling, ScriptedEngine, VLLMEngine
from grading import settle
from policy import EpisodeCtx, Policy
from task_folders import oracle_commands

FINISH_REASONS = ("submitted", "max_turns", "turn_token_limit", "context_overflow", "command_timeout",
                  "env_error", "episode_timeout", "invalid_tool_calls", "terminal_dead", "container_stopped",
                  "sandbox_lost")
# an episode whose container was lost to the infrastructure (finish "sandbox_lost") runs again from the same
# task this many times at most (env.Env places it on another host; tests/test_hosts.py)
LOST_RETRIES = 3
log = logging.getLogger("termrl.rollout")

SYSTEM_PROMPT = (
    "You are an autonomous agent solving a task in a Linux terminal (bash, no internet access). "
    "Nobody will answer questions; work on your own.\n"
    "In every reply, think briefly, then call exactly one tool:\n"
    "- bash: runs one command in a persistent shell (the working directory and variables carry "
    "over between calls) and returns its output and exit code.\n"
    "- submit: call it when the task is done; the episode ends and hidden tests check the result.")


# --------------------------------------------------------------------------------------------
# Config and the trajectory record
# --------------------------------------------------------------------------------------------

@dataclass
class RolloutConfig:
    max_turns: int = 30                 # assistant turns (sampled + prefilled)
    max_tokens_per_turn: int = 1024     # new tokens in one turn; hitting it ends the episode
    max_context: int = 8192             # all tokens of the trajectory
    temperature: float = 1.0            # sampling temperature (the loss's log-probs use the same)
    top_p: float = 1.0                  # nucleus sampling; < 1 samples from a μ the trainer does not compute
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
    traj.messages = [{"role": "system", "content": cfg.system_prompt},
                     {"role": "user", "content": task.instruction}]
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


def _settle_into(traj, outcome):
    """How the episode ended (grading.settle) into traj: reward and grade record, and where the
    environment had its say, the finish reason, validity and error."""
    traj.reward, traj.valid = outcome.reward, outcome.valid
    if outcome.finish_reason is not None:
        traj.finish_reason = outcome.finish_reason
    if outcome.grade is not None:
        traj.grade = outcome.grade
    if outcome.error is not None:
        traj.error = outcome.error
    if outcome.grade_s is not None:
        traj.timings["grade_s"] = outcome.grade_s


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
            comp = (_assistant_turn(policy, traj, task, turn, expert, sampling, room, budget, seed)
                    if budget > 0 else None)
            if comp is None:
                finish = "context_overflow"
                break
            stopped = (bool(comp.token_ids) and comp.token_ids[-1] == chat.stop_id
                       and comp.finish_reason == "stop")
            content = chat.decode(comp.token_ids[:-1] if stopped else comp.token_ids)
            traj.append(chat.turn_end_ids[1:] if stopped else chat.turn_end_ids)  # close the turn ourselves
            call, err = parse_tool_call(content)
            traj.messages.append({"role": "assistant", "content": content,
                                  **({"tool_call": call} if call else {}),
                                  **({"prefilled": True} if turn < len(expert) else {})})
            turn += 1
            if comp.finish_reason != "stop":  # ends (rLLM#575; test_limits_end_episodes_with_their_reason)
                finish = "turn_token_limit" if budget == cfg.max_tokens_per_turn else "context_overflow"
                break
            if err:  # a tool reply, not a user turn: Qwen3 would strip earlier think blocks (not append-only)
                invalid += 1
                traj.metrics["invalid_turns"] += 1
                traj.unparsed_chunks.append(turn - 1)
                if invalid >= cfg.max_invalid_turns:
                    finish = "invalid_tool_calls"
                    break
                new = [{"role": "tool", "content": f"Error: {err}. Reply with exactly one tool call, "
                                                  f"for example:\n{EXAMPLE_CALL}"}]
            else:
                invalid = 0
                if call["name"] == "submit":
                    finish = "submitted"
                    break
                result = _run_command(term, call["arguments"]["command"], cfg, traj, deadline)
                timeouts = timeouts + 1 if result.timed_out else 0
                if term.dead:  # the agent broke its container (terminal.Terminal.dead): graded as a failure
                    finish = "terminal_dead"
                    break
                if result.timed_out and time.monotonic() >= deadline:
                    finish = "episode_timeout"
                    break
                if timeouts >= cfg.max_command_timeouts:
                    finish = "command_timeout"
                    break
                new = [tool_message(result, call["extra_calls"])]
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
        _settle_into(traj, settle(term))
    except InfraError as e:  # the environment failed, or the agent stopped its container: settle says which
        _settle_into(traj, settle(term, e))
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
    An episode whose container was lost to the infrastructure (finish "sandbox_lost") runs again, same
    task, anchor and seed, up to LOST_RETRIES times: a dead sandbox host costs time, not rows."""
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
                args = (task, policy, env, cfg, k, group_id_start + gi, cancels[gi], rng.randrange(1 << 30),
                        expert)
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
    # tampered episodes are graded 0 (grading.grade)
    m["rollout/tampered"] = sum(bool(t.grade.get("tampered")) for t in trajectories)
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
    T = max(len(t.token_ids) for t in trajectories)

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
    ap = argparse.ArgumentParser(
        description="Roll out a policy on terminal tasks and write trajectories as JSONL.")
    ap.add_argument("--model", required=True,
                    help="model directory (HF format; its tokenizer gives the chat template)")
    ap.add_argument("--tasks", default=None,
                    help="task dir / dir of tasks / task list; default: generated easy tasks")
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
