"""termrl's run configuration: nested dataclasses with every knob and its default, read from YAML
and `--set a.b=v` overrides. An unknown or mistyped key is an error that names the closest valid one.
A file may start from another (`base: tiny.yaml`, relative to the file) and state only what differs;
mappings merge key by key, anything else replaces.

    cfg = load_config("configs/tiny.yaml", ["train.steps=4"])
    rcfg, acfg = rollout_cfg(cfg), algo_cfg(cfg)   # checked against rollout.RolloutConfig / algo.AlgoConfig
"""
import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from generated_tasks import FAMILIES


class ConfigError(ValueError):
    """A config file or --set override is wrong; the message says which key and how to fix it."""


@dataclass
class ModelConfig:
    path: str = "out/tiny"                 # Hugging Face model directory (or a name in the local HF cache)
    build_tiny: bool = False               # build tiny.py's model into `path` first (no downloads)
    tiny: dict = field(default_factory=dict)  # extra kwargs for tiny.build_tiny_model (hidden_size, ...)
    lora: bool = False                     # train a LoRA adapter (peft) instead of all weights
    lora_rank: int = 16                    # adapter rank: capacity vs memory (and vLLM's max_lora_rank)
    lora_alpha: int = 32                   # adapter scale alpha/rank: the adapter's effective step size
    lora_dropout: float = 0.0              # dropout on the adapter's input (regularises small data)
    lora_target_modules: list[str] = field(default_factory=lambda: [  # the layers that get adapters
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    gradient_checkpointing: bool = False   # recompute activations in backward: less memory, one more forward
    dtype: str = "auto"                    # auto = bf16 on GPU, fp32 on CPU; or float32 / bfloat16


@dataclass
class EngineConfig:
    kind: str = "vllm"                     # vllm | hf (transformers generate; slow, no vLLM needed)
    gpu_memory_utilization: float = 0.5    # colocated with the trainer: leave room for it
    cpu_kvcache_gb: int = 1                # VLLM_CPU_KVCACHE_SPACE on CPU
    max_model_len: int = 4096              # longest sequence the engine serves (>= rollout.max_context)
    enforce_eager: bool = True             # CUDA graphs cost start-up time and memory for little gain here
    sleep: bool = True                     # train.mode sync: free the engine's GPU memory while the trainer steps;
    #                                        false when both fit, to skip the reload each step (no effect on CPU)
    extra: dict = field(default_factory=dict)  # passed to the engine constructor as is


@dataclass
class DataConfig:
    train_tasks: str = "generated"         # "generated" (drawn from generated_family) or a task dir / list file
    eval_tasks: str = "generated"          # same, drawn with eval_split / eval_seed
    num_generated_train: int = 64          # train tasks drawn from the generated family
    num_generated_eval: int = 32           # eval tasks drawn (those repeating a train instruction and oracle are dropped)
    generated_seed: int = 0                # which generated train tasks (another seed, another draw)
    eval_split: str = "heldout"            # generated eval tasks: "heldout" = unseen names and words;
    #                                        "train" = the train vocabulary in new combinations (eval_seed)
    eval_seed: int = 0
    generated_family: str = "easy"         # the generated tasks: easy (one command each, the tiny demo's) |
    #                                        multistep (the value the last command needs is seen only in an earlier output)
    generated_kinds: list = field(default_factory=list)  # kinds of that family to generate (train and eval); [] = all
    strict_tasks: bool = False             # a malformed task in train_tasks / eval_tasks is an error, not skipped


@dataclass
class EnvConfig:
    # the three networks of README "Running official Terminal-Bench tasks": default = the daemon's
    # network where it has one; none; or a docker network name
    build_network: str = "default"         # image builds (Dockerfiles apt-get / pip install)
    agent_network: str = "none"            # the agent's container, for tasks that allow_internet; none = always offline
    #                                        (tests/test_real_tasks.py::test_build_and_grading_reach_the_registry_the_agent_does_not)
    grading_network: str = "default"       # joined once the agent's processes are gone, by tasks whose tests fetch their runner
    multi_reward: str = "mean"             # Harbor reward.json with several keys and no "reward": mean | min | error
    warm: int = 0                          # containers kept started ahead per container config: a reset then skips
    #                                        the container start (bench/bench_env.py: cold vs warm reset)
    hosts: list = field(default_factory=list)  # Docker hosts for the sandboxes, "URL[,capacity=N][,labels=a:b][,tls=DIR]"
    #                                        each (README "Sandboxes on several Docker hosts"); [] = DOCKER_HOST's daemon alone
    hosts_down_wait_s: float = 120.0       # every host silent this long: the run stops (one down host never stops it:
    #                                        tests/test_hosts.py::test_a_stopped_daemon_is_drained_and_the_step_completes_on_the_other)


@dataclass
class SFTConfig:
    steps: int = 0                         # optimizer steps of SFT warm start on oracle trajectories; 0 = none
    num_tasks: int = 64                    # oracle trajectories collected from the train tasks
    batch_size: int = 16                   # trajectories per optimizer step
    lr: float = 1e-3                       # SFT's AdamW peak lr (cosine decay to 10% over sft.steps)
    warmup_steps: int = 5                  # linear warmup steps before that peak
    val_tasks: int = 0                     # oracle trajectories of train tasks SFT never sees (the last ones)
    val_every: int = 10                    # ... scored every this many steps: val_nll and val_oracle_prob
    stop_at_val_prob: float = 0.0          # end SFT early once val_oracle_prob (the chance the policy samples a
    #                                        val oracle trajectory exactly) reaches this; 0 = all sft.steps
    keep_moments: bool = True              # RL's AdamW starts from SFT's moments (its own lr and schedule):
    #                                        a fresh Adam's first steps move every weight by ~lr (sign-like)


@dataclass
class TrainConfig:
    steps: int = 20                        # RL steps (one rollout batch + one update each)
    tasks_per_step: int = 4                # distinct tasks per step ...
    group_size: int = 4                    # ... each rolled out this many times (the GRPO group)
    lr: float = 1e-5                       # RL's AdamW lr
    lr_schedule: str = "constant"          # constant | cosine (after linear warmup)
    warmup_steps: int = 0                  # linear warmup steps before train.lr
    weight_decay: float = 0.0              # AdamW's decoupled weight decay (SFT and RL)
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # AdamW (beta1, beta2), SFT and RL
    grad_clip: float = 1.0                 # max global gradient norm; 0 = no clipping
    micro_batch_tokens: int = 8192         # padded tokens per forward/backward (micro-batches by budget)
    updates_per_step: int = 1              # optimizer steps per rollout batch (>1: a π_old pass first, then
                                           # each step measures its ratios against it, as PPO epochs)
    mode: str = "sync"                     # sync (on-policy) | async (rollouts overlap training)
    max_staleness: int = 1                 # async: drop trajectories > this many versions old
    parallel: str = "ddp"                  # under torchrun: ddp | fsdp
    collective_timeout_min: float = 180.0  # under torchrun: how long a rank waits in a collective before the run
    #                                        stops; it must cover one rank's rollouts finishing after another's and
    #                                        a checkpoint's writes (torch's own default: 10 min NCCL, 30 gloo)
    sync_check: bool = True                # after each sync, compare engine and trainer log-probs
    log_entropy: bool = True               # entropy metric (a softmax over the vocab per token)


@dataclass
class EvalConfig:
    every: int = 5                         # RL steps between evals (0 = only at start and end)
    num_tasks: int = 32                    # held-out tasks per eval (<= data.num_generated_eval)
    temperature: float = 0.0               # 0 = greedy: a stable success figure
    samples: int = 1                       # episodes per task (with temperature > 0: pass@1 over k samples)
    samples_mid: int = 0                   # episodes per task at the evals between the first and the last
    #                                        (0 = samples): a cheaper curve; the gain is read at full resolution
    at_start: bool = True                  # eval before the first RL step: the baseline every gain is measured from


@dataclass
class CheckpointConfig:
    every: int = 5                         # RL steps between checkpoints (and always at the end)
    keep_last: int = 3                     # checkpoints kept besides step 0 (the SFT-only start, always kept:
    #                                        tests/test_train.py::test_keep_last_keeps_the_sft_only_start)


@dataclass
class Config:
    run_name: str = "run"                  # names runs/<run_name> (and the curves)
    out_dir: str = ""                      # default runs/<run_name>
    seed: int = 0                          # torch, Python, data order, tiny model init, episodes and the engine
    device: str = "auto"                   # auto | cpu | cuda
    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    data: DataConfig = field(default_factory=DataConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: dict = field(default_factory=dict)   # -> rollout.RolloutConfig (checked against it)
    algo: dict = field(default_factory=dict)      # -> algo.AlgoConfig (checked against it)
    sft: SFTConfig = field(default_factory=SFTConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    tensorboard: bool = True                # when tensorboard is installed
    verbose: bool = False                   # third-party INFO/WARNING logs (vLLM's start-up, every weight reload):
    #                                         on to debug an engine; errors show either way
    plot: bool = True                       # PNG of curves at the end, when matplotlib is installed


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
                          + " -> ".join(p.name for p in chain + (base_path,)) + "; remove one of these base: keys")
    return deep_merge(read_config_file(base_path, chain), raw)


def load_config(path: str | Path | None, overrides: list[str] = ()) -> Config:
    """YAML file + `--set` overrides -> Config; the rollout/algo sections are checked against their dataclasses."""
    raw = read_config_file(Path(path)) if path else {}
    raw = deep_merge(raw, parse_overrides(list(overrides)))
    cfg = dataclass_from_dict(Config, raw)
    rollout_cfg(cfg), algo_cfg(cfg)  # validate the nested sections now, not at step 1
    for name, val, allowed in [("train.mode", cfg.train.mode, ("sync", "async")),
                               ("train.parallel", cfg.train.parallel, ("ddp", "fsdp")),
                               ("train.lr_schedule", cfg.train.lr_schedule, ("constant", "cosine")),
                               ("engine.kind", cfg.engine.kind, ("vllm", "hf")),
                               ("data.eval_split", cfg.data.eval_split, ("train", "heldout")),
                               ("data.generated_family", cfg.data.generated_family, tuple(FAMILIES)),
                               ("device", cfg.device, ("auto", "cpu", "cuda")),
                               ("model.dtype", cfg.model.dtype, ("auto", "float32", "bfloat16", "float16")),
                               ("env.multi_reward", cfg.env.multi_reward, ("mean", "min", "error"))]:
        if val not in allowed:
            raise ConfigError(f"config key '{name}' is {val!r}; choose one of {', '.join(allowed)}")
    if cfg.data.generated_kinds:
        kinds = FAMILIES[cfg.data.generated_family][1]
        if bad := [k for k in cfg.data.generated_kinds if k not in kinds]:
            raise ConfigError(f"config key 'data.generated_kinds' has unknown kinds {bad} of the "
                              f"{cfg.data.generated_family} family (data.generated_family); choose from {kinds}")
    if cfg.train.group_size < 1 or cfg.train.tasks_per_step < 1:
        raise ConfigError("train.group_size and train.tasks_per_step must be >= 1")
    if not 0.0 <= cfg.sft.stop_at_val_prob < 1.0:
        raise ConfigError(f"sft.stop_at_val_prob must be in [0, 1), got {cfg.sft.stop_at_val_prob}")
    if cfg.sft.stop_at_val_prob and cfg.sft.val_tasks < 1:
        raise ConfigError("sft.stop_at_val_prob needs validation trajectories: set sft.val_tasks >= 1")
    if cfg.sft.val_every < 1:
        raise ConfigError(f"sft.val_every must be >= 1, got {cfg.sft.val_every}")
    if cfg.train.micro_batch_tokens < 1:
        raise ConfigError("train.micro_batch_tokens must be >= 1")
    if cfg.eval.samples < 1 or cfg.eval.samples_mid < 0:
        raise ConfigError(f"eval.samples must be >= 1 and eval.samples_mid >= 0 (0 = eval.samples), got "
                          f"{cfg.eval.samples} and {cfg.eval.samples_mid}")
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
    return dataclasses.replace(rcfg, seed=cfg.seed, group_size=cfg.train.group_size,
                               max_staleness=cfg.train.max_staleness if cfg.train.mode == "async" else None)


def algo_cfg(cfg: Config):
    import algo  # costly (torch), as rollout above
    return dataclass_from_dict(algo.AlgoConfig, cfg.algo, "algo.")


def config_to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)
