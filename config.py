"""termrl's run configuration: nested dataclasses with every knob and its default, read from YAML
and `--set a.b=v` overrides. An unknown or mistyped key is an error that names the closest valid one,
a number outside its range (`Annotated[float, "> 0"]` beside the key; RANGES for rollout:/algo:)
one that names the range.
A file may start from another (`base: tiny.yaml`, relative to the file) and state only what differs;
mappings merge key by key, anything else replaces.

    cfg = load_config("configs/tiny.yaml", ["train.steps=4"])
    rcfg, acfg = rollout_cfg(cfg), algo_cfg(cfg)   # checked against rollout.RolloutConfig / algo.AlgoConfig
"""
import dataclasses
import difflib
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import yaml

from generated_tasks import FAMILIES


class ConfigError(ValueError):
    """A config file or --set override is wrong; the message says which key and how to fix it."""


@dataclass
class ModelConfig:
    path: str = "out/tiny"                          # Hugging Face model dir (or a name in the local HF cache)
    build_tiny: bool = False                        # build tiny.py's model into `path` first (no downloads)
    fetch: str = ""                                 # command that makes `path` (e.g. a conversion script):
    #                                                 a missing path's error names it, not a hub download
    tiny: dict = field(default_factory=dict)        # kwargs for tiny.build_tiny_model (hidden_size, ...)
    lora: bool = False                              # train a LoRA adapter (peft) instead of all weights
    lora_rank: Annotated[int, ">= 1"] = 16          # adapter rank: capacity vs memory (vLLM's max_lora_rank)
    lora_alpha: Annotated[int, ">= 1"] = 32         # scale alpha/rank: the adapter's effective step size
    lora_dropout: Annotated[float, "[0, 1)"] = 0.0  # dropout on the adapter's input (regularises small data)
    lora_target_modules: list[str] = field(default_factory=lambda: [  # the layers that get adapters
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    gradient_checkpointing: bool = False            # recompute activations: less memory, one more forward
    # auto = bf16 on GPU, fp32 on CPU; fast = bf16 on GPU and on CPUs with AMX / AVX512-BF16, fp32 on
    # others (where bf16 is emulated); or float32 / bfloat16 / float16
    dtype: str = "auto"


@dataclass
class EngineConfig:
    kind: str = "vllm"                                        # vllm | hf (transformers: slow, needs no vLLM)
    gpu_memory_utilization: Annotated[float, "(0, 1]"] = 0.5  # colocated with the trainer: leave room for it
    cpu_kvcache_gb: Annotated[float, "> 0"] = 1.0             # the KV cache on CPU; VLLM_CPU_KVCACHE_SPACE
    #                                                           (whole GiB), when set, overrides it
    max_model_len: Annotated[int, ">= 1"] = 4096              # the longest sequence (>= rollout.max_context)
    enforce_eager: bool = True                                # CUDA graphs cost start-up, memory; little gain
    sleep: bool = True                                        # train.mode sync: free the engine's GPU memory
    #                                                           while the trainer steps; false when both fit,
    #                                                           to skip each step's reload (no effect on CPU)
    extra: dict = field(default_factory=dict)                 # passed to the engine constructor as is


@dataclass
class DataConfig:
    train_tasks: str = "generated"                       # "generated" (drawn from generated_family)
    #                                                      or a task dir / list file
    eval_tasks: str = "generated"                        # same, drawn with eval_split / eval_seed
    num_generated_train: Annotated[int, ">= 1"] = 64     # train tasks drawn from the generated family
    num_generated_eval: Annotated[int, ">= 0"] = 32      # eval tasks drawn (those repeating a train
    #                                                      instruction and oracle are dropped)
    generated_seed: int = 0                              # the train tasks' draw (another seed, other tasks)
    eval_split: str = "heldout"                          # generated eval: "heldout" = unseen names and words;
    #                                                      "train" = the train words recombined (eval_seed)
    eval_seed: int = 0
    generated_family: str = "easy"                       # easy (one command each; the tiny demo) | multistep
    #                                                      (the last command needs a value only seen earlier)
    generated_kinds: list = field(default_factory=list)  # kinds of that family to use (train, eval); [] = all
    strict_tasks: bool = False                           # a malformed task is an error, not skipped


@dataclass
class EnvConfig:
    # the three networks of README "Running official Terminal-Bench tasks": default = the daemon's
    # network where it has one; none; or a docker network name
    build_network: str = "default"                      # image builds (Dockerfiles apt-get / pip install)
    # offline: tests/test_real_tasks.py::test_build_and_grading_reach_the_registry_the_agent_does_not
    agent_network: str = "none"                         # agent of allow_internet tasks; none = always offline
    grading_network: str = "default"                    # after the agent is gone, for tests fetching a runner
    multi_reward: str = "mean"                          # Harbor reward.json with several keys and no
    #                                                     "reward": mean | min | error
    warm: Annotated[int, ">= 0"] = 0                    # containers kept started ahead per container config,
    #                                                     so a reset skips the start (see bench/bench_env.py)
    hosts: list = field(default_factory=list)           # sandbox Docker hosts ([] = DOCKER_HOST's daemon):
    #                                                     "URL[,capacity=N][,labels=a:b][,tls=DIR]" each
    #                                                     (README "Sandboxes on several Docker hosts")
    # tests/test_hosts.py::test_a_stopped_daemon_is_drained_and_the_step_completes_on_the_other
    hosts_down_wait_s: Annotated[float, "> 0"] = 120.0  # every host silent this long: the run stops
    #                                                     (one down host never stops it: the test above)


@dataclass
class SFTConfig:
    steps: Annotated[int, ">= 0"] = 0                   # SFT optimizer steps on oracle trajectories; 0 = none
    num_tasks: Annotated[int, ">= 1"] = 64              # oracle trajectories collected from the train tasks
    batch_size: Annotated[int, ">= 1"] = 16             # trajectories per optimizer step
    lr: Annotated[float, "> 0"] = 1e-3                  # AdamW peak lr (cosine decay to 10% over sft.steps)
    warmup_steps: Annotated[int, ">= 0"] = 5            # linear warmup steps before that peak
    val_tasks: Annotated[int, ">= 0"] = 0               # held-out oracle trajectories (the last train tasks)
    val_every: Annotated[int, ">= 1"] = 10              # ... scored this often: val_nll and val_oracle_prob
    stop_at_val_prob: Annotated[float, "[0, 1)"] = 0.0  # end SFT early once val_oracle_prob (the chance the
    #                                                     policy samples a val oracle trajectory exactly)
    #                                                     reaches this; 0 = all sft.steps
    generated_split: str = "train"                      # generated split of the oracle trajectories: train
    #                                                     | rl (the tasks RL draws under train.generated_split
    #                                                     rl: the control that shows them to SFT instead)
    keep_moments: bool = True                           # RL's AdamW takes SFT's moments (own lr, schedule):
    #                                                     a fresh Adam first moves each weight ~lr (sign-like)
    checkpoint_every: Annotated[int, ">= 0"] = 10       # an SFT checkpoint every this many steps, so a
    #                                                     killed SFT resumes there; 0 = only at its end


@dataclass
class TrainConfig:
    steps: Annotated[int, ">= 0"] = 20                       # RL steps (one rollout batch + one update each)
    tasks_per_step: Annotated[int, ">= 1"] = 4               # distinct tasks per step ...
    group_size: Annotated[int, ">= 1"] = 4                   # ... each rolled out this often (the GRPO group)
    lr: Annotated[float, "> 0"] = 1e-5                       # RL's AdamW lr
    lr_schedule: str = "constant"                            # constant | cosine (after linear warmup)
    warmup_steps: Annotated[int, ">= 0"] = 0                 # linear warmup steps before train.lr
    weight_decay: Annotated[float, ">= 0"] = 0.0             # AdamW's decoupled weight decay (SFT and RL)
    # AdamW (beta1, beta2), SFT and RL
    adam_betas: Annotated[list[float], "[0, 1)"] = field(default_factory=lambda: [0.9, 0.999])
    grad_clip: Annotated[float, ">= 0"] = 1.0                # max global gradient norm; 0 = no clipping
    micro_batch_tokens: Annotated[int, ">= 1"] = 8192        # padded tokens per forward/backward micro-batch
    updates_per_step: Annotated[int, ">= 1"] = 1             # optimizer steps per rollout batch (a later one
    #                                                          measures its ratios against π_old: PPO epochs)
    mode: str = "sync"                                       # sync (on-policy) | async (overlaps training)
    max_staleness: Annotated[int, ">= 0"] = 1                # async: drop rollouts > this many versions old
    parallel: str = "ddp"                                    # under torchrun: ddp | fsdp
    collective_timeout_min: Annotated[float, "> 0"] = 180.0  # under torchrun: a rank's wait in a collective
    #                                                          before the run stops; it must cover one rank's
    #                                                          rollouts ending after another's, checkpoint
    #                                                          writes (torch's default: 10 min NCCL, 30 gloo)
    generated_split: str = "train"                           # generated split RL draws from: train (the tasks
    #                                                          SFT imitates) | rl (own names, words, numbers,
    #                                                          never SFT's nor held out: a verifier alone;
    #                                                          tests/test_multistep.py::test_splits_share_*,
    #                                                          test_train.py::test_sft_and_rl_take_*)
    generated_kinds: list = field(default_factory=list)      # the kinds RL draws of that split; [] = all of
    #                                                          data.generated_kinds: rollouts spent where the
    #                                                          policy still fails, held-out keeps every kind
    #                                                          (test_train.py::test_sft_and_rl_take_*)
    draw_by_kind: bool = False                               # RL's draw takes the tasks' kinds in turn, so
    #                                                          each is met every len(kinds) tasks: a kind a
    #                                                          plain draw leaves out for many steps can
    #                                                          drift unseen, and successes-only reward
    #                                                          cannot repair a kind once it fails whole
    #                                                          (test_difficulty.py::test_a_draw_by_kind_*,
    #                                                          test_train.py::test_a_batch_without_signal_*)
    filter_window: Annotated[int, ">= 0"] = 0                # online difficulty filtering (difficulty.py): a
    #                                                          task whose latest this many episodes were all
    #                                                          solved or all failed sits out, so rollouts go
    #                                                          to groups with signal (DAPO, prime-rl); 0 = off
    filter_sit_out: Annotated[int, ">= 1"] = 4               # ... RL steps it sits out, then is tried again
    curate_k: Annotated[int, ">= 0"] = 0                     # before RL step 1 the start policy plays this
    #                                                          many episodes of each task tried, and RL draws
    #                                                          only those it both solved and failed
    #                                                          (difficulty.moderate): a near-deterministic
    #                                                          start makes few groups with a contrast
    #                                                          elsewhere; 0 = off
    curate_tasks: Annotated[int, ">= 0"] = 0                 # ... how many of RL's tasks it tries, in their
    #                                                          seeded draw order (0 = all): its cost
    sync_check: bool = True                                  # per sync: compare engine and trainer log-probs
    log_entropy: bool = True                                 # entropy metric (a vocab softmax per token)
    head_block_logits: Annotated[int, ">= 0"] = 0            # logits per output-head block (caps its memory);
    #                                                          0 = by device: 1/16 free GPU memory, CPU 2^26
    pack_rows: bool = False                                  # a micro-batch's rows as one unpadded sequence
    #                                                          (GPU: flash-attention varlen, else flex)


@dataclass
class EvalConfig:
    every: Annotated[int, ">= 0"] = 5            # RL steps between evals (0 = only at start and end)
    num_tasks: Annotated[int, ">= 0"] = 32       # held-out tasks per eval (<= data.num_generated_eval)
    temperature: Annotated[float, ">= 0"] = 0.0  # 0 = greedy: a stable success figure
    samples: Annotated[int, ">= 1"] = 1          # episodes per task (temperature > 0: pass@1 over k samples)
    samples_mid: Annotated[int, ">= 0"] = 0      # episodes per task at evals between the first and last
    #                                              (0 = samples): a cheaper curve, the gain at full resolution
    at_start: bool = True                        # eval before the first RL step: the baseline of every gain


@dataclass
class CheckpointConfig:
    every: Annotated[int, ">= 1"] = 5      # RL steps between checkpoints (and always at the end)
    keep_last: Annotated[int, ">= 0"] = 3  # checkpoints kept besides step 0 (the SFT-only start, always kept:
    #                                        tests/test_train.py::test_keep_last_keeps_the_sft_only_start)
    # false: the last step's checkpoint keeps the weights and the run's state, not AdamW's moments
    # (two thirds of a full fine-tune's checkpoint), for programs of many runs that end where they
    # stop; a run continued past train.steps then starts AdamW afresh
    # (tests/test_train.py::test_a_finished_run_can_drop_its_moments_and_still_continue)
    final_optimizer: bool = True


@dataclass
class Config:
    run_name: str = "run"                        # names runs/<run_name> (and the curves)
    out_dir: str = ""                            # default runs/<run_name>
    seed: int = 0                                # torch, Python, data order, tiny init, episodes, the engine
    device: str = "auto"                         # auto | cpu | cuda
    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    data: DataConfig = field(default_factory=DataConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: dict = field(default_factory=dict)  # -> rollout.RolloutConfig (checked against it)
    algo: dict = field(default_factory=dict)     # -> algo.AlgoConfig (checked against it)
    sft: SFTConfig = field(default_factory=SFTConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    tensorboard: bool = True                     # when tensorboard is installed
    verbose: bool = False                        # third-party INFO/WARNING logs (vLLM's start-up, reloads):
    #                                              on to debug an engine; errors show either way
    plot: bool = True                            # PNG of curves at the end, when matplotlib is installed


def _all_keys(cls, prefix="") -> list[str]:
    out = []
    for f in dataclasses.fields(cls):
        t = typing.get_type_hints(cls)[f.name]
        out.append(prefix + f.name)
        if dataclasses.is_dataclass(t):
            out += _all_keys(t, prefix + f.name + ".")
    return out


def _coerce(value, tp, key):
    """Check/convert one leaf value to its annotated type; error names the key and the type."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is not type(None):
                return _coerce(value, a, key)
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key '{key}' expects a list, got {value!r}")
        return [_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)] if args else list(value)
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"config key '{key}' expects a mapping, got {value!r}")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "1e-5" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
    else:
        return value
    raise ConfigError(f"config key '{key}' expects {getattr(tp, '__name__', tp)}, got {value!r} "
                      f"({type(value).__name__})")


# the allowed values of the rollout: and algo: keys, whose dataclasses live in rollout.py and algo.py
# (algo.AlgoConfig checks gamma, the clip bounds, mismatch_cap / floor, norm_length itself)
RANGES = {
    "rollout.max_turns":               ">= 1",
    "rollout.max_tokens_per_turn":     ">= 1",
    "rollout.max_context":             ">= 1",
    "rollout.temperature":             ">= 0",
    "rollout.top_p":                   "(0, 1]",
    "rollout.top_k":                   ">= -1",
    "rollout.command_timeout_s":       "> 0",
    "rollout.max_command_timeouts":    ">= 1",
    "rollout.max_invalid_turns":       ">= 1",
    "rollout.episode_timeout_s":       "> 0",
    "rollout.group_redundancy":        ">= 0",
    "rollout.num_workers":             ">= 1",
    "rollout.prefill_prob":            "[0, 1]",
    "algo.std_eps":                    ">= 0",
    "algo.kl_coef":                    ">= 0",
    "algo.entropy_coef":               ">= 0",
    "algo.rl_coef":                    ">= 0",
    "algo.imitation_coef":             ">= 0",
    "algo.max_negative_tokens":        ">= 1",
}


def _allows(spec: str, x: float) -> bool:
    """Whether x lies in spec: "> 0", ">= 1", or an interval "[0, 1)" ([ ] closed, ( ) open)."""
    if m := re.fullmatch(r"(>=|>)\s*(\S+)", spec):
        return x >= float(m[2]) if m[1] == ">=" else x > float(m[2])
    lo_b, lo, hi, hi_b = re.fullmatch(r"([\[(])\s*(\S+),\s*(\S+)\s*([\])])", spec).groups()
    return ((x >= float(lo) if lo_b == "[" else x > float(lo))
            and (x <= float(hi) if hi_b == "]" else x < float(hi)))


def check_range(key: str, value, spec: str):
    """A ConfigError naming key, value and allowed range when value (each item of a list) is outside
    it; None (where a key allows it) is always in range."""
    for x in value if isinstance(value, list) else [value]:
        if x is not None and not _allows(spec, x):
            raise ConfigError(f"config key '{key}' is {value!r}; allowed: {spec}")


def check_ranges(obj, prefix: str = ""):
    """check_range on every key of dataclass obj (nested ones too) declared with a range."""
    hints = typing.get_type_hints(type(obj), include_extras=True)
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            check_ranges(value, prefix + f.name + ".")
        elif typing.get_origin(hints[f.name]) is Annotated:
            check_range(prefix + f.name, value, hints[f.name].__metadata__[0])


def _unknown(key: str, valid: list[str], all_valid: list[str]) -> ConfigError:
    close = difflib.get_close_matches(key, all_valid, n=1, cutoff=0.5)
    hint = f"; did you mean '{close[0]}'?" if close else f"; valid keys here: {', '.join(valid)}"
    return ConfigError(f"unknown config key '{key}'{hint}")


def dataclass_from_dict(cls, d: dict, prefix: str = "", all_valid: list[str] | None = None):
    """Build `cls` from a nested dict; unknown keys and wrong types raise ConfigError."""
    if d is None:
        d = {}
    if not isinstance(d, dict):
        raise ConfigError(f"config key '{prefix.rstrip('.') or '<root>'}' expects a mapping, got {d!r}")
    all_valid = all_valid or [prefix + k for k in _all_keys(cls)]
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for k, v in d.items():
        if k not in names:
            raise _unknown(prefix + str(k), names, all_valid)
        tp = hints[k]
        if dataclasses.is_dataclass(tp):
            kwargs[k] = dataclass_from_dict(tp, v, prefix + k + ".", all_valid)
        else:
            kwargs[k] = _coerce(v, tp, prefix + k)
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as e:  # the section's own checks (e.g. AlgoConfig.__post_init__)
        raise ConfigError(str(e)) from None


def parse_overrides(pairs: list[str]) -> dict:
    """`a.b=v` strings -> nested dict; values parsed as YAML (3 -> int, true -> bool, [1,2] -> list)."""
    out: dict = {}
    for p in pairs:
        if "=" not in p:
            raise ConfigError(f"--set {p!r}: expected key=value, e.g. --set train.lr=1e-5")
        key, raw = p.split("=", 1)
        node = out
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {p!r}: '{part}' is set twice, once as a value")
        node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else ""
    return out


def deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def read_config_file(path: Path, chain: tuple = ()) -> dict:
    """One YAML config file as a dict, merged over the file its `base:` key names (and so on)."""
    if not path.exists():
        raise ConfigError(f"config file {path} not found" + (f" (the base: of {chain[-1]})" if chain else
                                                             " (see configs/ for examples)"))
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections, got {type(raw).__name__}")
    base = raw.pop("base", None)
    if base is None:
        return raw
    if not isinstance(base, str) or not base:
        raise ConfigError(f"{path}: base: expects a config file name relative to {path.parent}, got {base!r}")
    chain = chain + (path.resolve(),)
    base_path = (path.parent / base).resolve()
    if base_path in chain:
        raise ConfigError(f"{path}: base: {base} makes a cycle: "
                          + " -> ".join(p.name for p in chain + (base_path,))
                          + "; remove one of these base: keys")
    return deep_merge(read_config_file(base_path, chain), raw)


def load_config(path: str | Path | None, overrides: list[str] = ()) -> Config:
    """YAML file + `--set` overrides -> Config; rollout/algo sections checked against their dataclasses."""
    raw = read_config_file(Path(path)) if path else {}
    raw = deep_merge(raw, parse_overrides(list(overrides)))
    cfg = dataclass_from_dict(Config, raw)
    check_ranges(cfg)
    rollout_cfg(cfg), algo_cfg(cfg)  # validate the nested sections now, not at step 1
    for name, val, allowed in [("train.mode", cfg.train.mode, ("sync", "async")),
                               ("train.parallel", cfg.train.parallel, ("ddp", "fsdp")),
                               ("train.lr_schedule", cfg.train.lr_schedule, ("constant", "cosine")),
                               ("engine.kind", cfg.engine.kind, ("vllm", "hf")),
                               ("data.eval_split", cfg.data.eval_split, ("train", "heldout")),
                               ("sft.generated_split", cfg.sft.generated_split, ("train", "rl")),
                               ("train.generated_split", cfg.train.generated_split, ("train", "rl")),
                               ("data.generated_family", cfg.data.generated_family, tuple(FAMILIES)),
                               ("device", cfg.device, ("auto", "cpu", "cuda")),
                               ("model.dtype", cfg.model.dtype,
                                ("auto", "fast", "float32", "bfloat16", "float16")),
                               ("env.multi_reward", cfg.env.multi_reward, ("mean", "min", "error"))]:
        if val not in allowed:
            raise ConfigError(f"config key '{name}' is {val!r}; choose one of {', '.join(allowed)}")
    if cfg.data.generated_kinds:
        kinds = FAMILIES[cfg.data.generated_family][1]
        if bad := [k for k in cfg.data.generated_kinds if k not in kinds]:
            raise ConfigError(f"config key 'data.generated_kinds' has unknown kinds {bad} of the "
                              f"{cfg.data.generated_family} family (data.generated_family); "
                              f"choose from {kinds}")
    if cfg.train.generated_kinds:
        known = cfg.data.generated_kinds or FAMILIES[cfg.data.generated_family][1]
        if bad := [k for k in cfg.train.generated_kinds if k not in known]:
            raise ConfigError(f"config key 'train.generated_kinds' has kinds {bad} that the run's generated "
                              f"tasks do not hold (data.generated_family, data.generated_kinds); "
                              f"choose from {known}")
        if cfg.data.train_tasks != "generated":
            raise ConfigError(f"config key 'train.generated_kinds' picks kinds of the generated tasks, but "
                              f"data.train_tasks is {cfg.data.train_tasks!r}; set data.train_tasks=generated "
                              f"or train.generated_kinds=[]")
    for key, split in [("sft.generated_split", cfg.sft.generated_split),
                       ("train.generated_split", cfg.train.generated_split)]:
        if split != "train" and cfg.data.train_tasks != "generated":
            raise ConfigError(f"config key '{key}' is {split!r}, a split of the generated tasks, but "
                              f"data.train_tasks is {cfg.data.train_tasks!r}; set data.train_tasks=generated "
                              f"or {key}=train")
    if cfg.train.curate_k == 1:
        raise ConfigError("train.curate_k is 1: one episode a task cannot be both solved and failed; "
                          "set 2 or more (8, a group's size, finds a 15% task mixed 73% of the time), or 0")
    if cfg.sft.stop_at_val_prob and cfg.sft.val_tasks < 1:
        raise ConfigError("sft.stop_at_val_prob needs validation trajectories: set sft.val_tasks >= 1")
    if not re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9._-]*", cfg.run_name):  # it names a folder under runs/
        raise ConfigError(f"config key 'run_name' is {cfg.run_name!r}; a run name is letters, digits, "
                          "'.', '_', '-', not starting with '.' (it names runs/<run_name>; set out_dir "
                          "for another place)")
    if not cfg.out_dir:
        cfg.out_dir = f"runs/{cfg.run_name}"
    return cfg


# rollout.RolloutConfig keys a run sets from its own keys, so that one value drives both
RUN_SETS = {"seed": "seed", "group_size": "train.group_size", "max_staleness": "train.max_staleness"}


def rollout_cfg(cfg: Config):
    """rollout.RolloutConfig from the `rollout:` section, with the keys of RUN_SETS taken from the run."""
    import rollout  # costly (torch): a config that is only read needs no rollout
    if clash := [k for k in RUN_SETS if k in cfg.rollout]:
        raise ConfigError(f"config key 'rollout.{clash[0]}' is set from '{RUN_SETS[clash[0]]}' in a run; "
                          f"set that instead")
    rcfg = dataclass_from_dict(rollout.RolloutConfig, cfg.rollout, "rollout.")
    for f in dataclasses.fields(rcfg):
        if spec := RANGES.get(f"rollout.{f.name}"):
            check_range(f"rollout.{f.name}", getattr(rcfg, f.name), spec)
    return dataclasses.replace(rcfg, seed=cfg.seed, group_size=cfg.train.group_size,
                               max_staleness=cfg.train.max_staleness if cfg.train.mode == "async" else None)


def algo_cfg(cfg: Config):
    import algo  # costly (torch), as rollout above
    acfg = dataclass_from_dict(algo.AlgoConfig, cfg.algo, "algo.")
    for f in dataclasses.fields(acfg):
        if spec := RANGES.get(f"algo.{f.name}"):
            check_range(f"algo.{f.name}", getattr(acfg, f.name), spec)
    return acfg


def config_to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)
