"""config.py: `base:` files, and every config key read by the code, documented and exercised."""
import dataclasses
import inspect
import re
import subprocess
import sys
import types
import typing
from pathlib import Path

import pytest
import yaml

import algo
import config
import env
import rollout

ROOT = Path(__file__).resolve().parents[1]
CODE = "\n".join(p.read_text() for p in sorted(ROOT.glob("*.py")) + sorted((ROOT / "bench").glob("*.py")))
TESTS = "\n".join(p.read_text() for p in sorted((ROOT / "tests").glob("*.py")))
# names the code gives a section before reading its keys (m = cfg.model; tcfg is learner's cfg.train)
ALIASES = {"model": ["m"], "data": ["d"], "train": ["tcfg"]}


# --- base: ----------------------------------------------------------------------------------

def test_a_config_states_only_what_differs_from_its_base(tmp_path):
    (tmp_path / "a.yaml").write_text("run_name: a\ntrain: {steps: 7, lr: 0.5}\n"
                                     "algo: {loss: ppo, gamma: 1.0}\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.yaml").write_text("base: ../a.yaml\nrun_name: b\ntrain: {lr: 0.25}\n"
                                             "algo: {loss: gspo}\n")
    cfg = config.load_config(tmp_path / "sub" / "b.yaml", ["train.steps=9"])
    assert (cfg.run_name, cfg.train.steps, cfg.train.lr) == ("b", 9, 0.25)
    assert cfg.algo == {"loss": "gspo", "gamma": 1.0}  # mappings merge key by key
    assert "base" not in config.config_to_dict(cfg)


def test_shipped_variants_resolve_over_tiny_yaml():
    tiny = config.load_config(ROOT / "configs" / "tiny.yaml")
    for name in ("tiny-ipa", "tiny-grpo"):
        assert yaml.safe_load((ROOT / "configs" / f"{name}.yaml").read_text())["base"] == "tiny.yaml"
        cfg = config.load_config(ROOT / "configs" / f"{name}.yaml")
        assert cfg.run_name == name and cfg.model == tiny.model and cfg.data == tiny.data


@pytest.mark.parametrize("files, needle", [
    ({"a.yaml": "base: nope.yaml\n"}, "nope.yaml not found (the base: of"),
    ({"a.yaml": "base: b.yaml\n", "b.yaml": "base: a.yaml\n"}, "makes a cycle: a.yaml -> b.yaml -> a.yaml"),
    ({"a.yaml": "base: a.yaml\n"}, "makes a cycle: a.yaml -> a.yaml"),
    ({"a.yaml": "base: [b.yaml]\n"}, "base: expects a config file name"),
])
def test_a_bad_base_is_a_clear_error(tmp_path, files, needle):
    """Bug guard: a missing base file or a base cycle must say which file and what to do, not
    recurse forever or raise FileNotFoundError."""
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(config.ConfigError, match=re.escape(needle)):
        config.load_config(tmp_path / "a.yaml")


def test_rollout_keys_a_run_sets_cannot_be_set_twice():
    """Bug: train.py overwrote rollout.seed and rollout.max_staleness (and ignored rollout.group_size),
    so a value set there did nothing."""
    cfg = config.load_config(ROOT / "configs" / "tiny.yaml", ["seed=3", "train.group_size=5"])
    rcfg = config.rollout_cfg(cfg)
    assert (rcfg.seed, rcfg.group_size, rcfg.max_staleness) == (3, 5, None)
    async_cfg = config.load_config(ROOT / "configs" / "tiny.yaml",
                                   ["train.mode=async", "train.max_staleness=2"])
    assert config.rollout_cfg(async_cfg).max_staleness == 2
    for key, source in config.RUN_SETS.items():
        with pytest.raises(config.ConfigError, match=f"'rollout.{key}' is set from '{source}'"):
            config.load_config(ROOT / "configs" / "tiny.yaml", [f"rollout.{key}=1"])


# --- every key ------------------------------------------------------------------------------

def _keys():
    """(key, dataclass, field name, section) for every leaf key of a run config."""
    out = []

    def walk(cls, prefix, section):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(hints[f.name]):
                walk(hints[f.name], prefix + f.name + ".", f.name)
            elif f.name not in ("rollout", "algo") or cls is not config.Config:
                out.append((prefix + f.name, cls, f.name, section))
    walk(config.Config, "", None)
    walk(rollout.RolloutConfig, "rollout.", "rollout")
    walk(algo.AlgoConfig, "algo.", "algo")
    return [k for k in out if not (k[3] == "rollout" and k[2] in config.RUN_SETS)]


def _read(key, cls, name, section) -> bool:
    if section == "env":  # passed whole: env.Env(**asdict(cfg.env))
        return name in inspect.signature(env.Env).parameters
    if section is None:
        owners = ["cfg"]
    elif section in ("rollout", "algo"):  # read from their own dataclasses
        owners = ["cfg", "rcfg", "ecfg", "acfg"] + (["self"] if section == "rollout" else [])
    else:
        owners = [rf"cfg\.{section}"] + ALIASES.get(section, [])
    return re.search(rf"\b(?:{'|'.join(owners)})\.{name}\b", CODE) is not None


def _documented(cls, name) -> bool:
    lines = inspect.getsource(cls).splitlines()
    i = next(i for i, line in enumerate(lines) if re.match(rf"\s+{name}\s*:", line))
    return "#" in lines[i] or lines[i - 1].strip().startswith("#")


def _in_config_files() -> set:
    keys = set()

    def walk(d, prefix):
        for k, v in d.items():
            if isinstance(v, dict) and k not in ("tiny", "extra", "chat_template_kwargs"):
                walk(v, prefix + k + ".")
            else:
                keys.add(prefix + k)
    for p in (ROOT / "configs").glob("*.yaml"):
        walk(yaml.safe_load(p.read_text()), "")
    return keys


def test_every_config_key_is_read_documented_and_exercised():
    """Bug: engine.sleep was read nowhere, rollout.seed / max_staleness were overwritten, keys had
    no line saying why a user would set them, and 43 of 111 keys appeared in no config file and
    no test. Each key of Config, rollout.RolloutConfig and algo.AlgoConfig must be read by the code
    (as section.key), carry a comment in its dataclass, and be set by a config file or a test."""
    in_files = _in_config_files()
    unread, undocumented, unexercised = [], [], []
    for key, cls, name, section in _keys():
        if not _read(key, cls, name, section):
            unread.append(key)
        if not _documented(cls, name):
            undocumented.append(key)
        if key not in in_files and not re.search(rf"(\b{re.escape(key)}=|\b{name}=|[\"']{name}[\"'])", TESTS):
            unexercised.append(key)
    assert not unread, f"config keys nothing reads: {unread}"
    assert not undocumented, f"config keys without a comment in their dataclass: {undocumented}"
    assert not unexercised, f"config keys no config file or test sets: {unexercised}"


def test_dtype_fast_is_bf16_only_where_the_cpu_computes_it():
    """Bug: the SmolLM2 config's bfloat16 on a CPU without AMX or AVX512-BF16 (an AVX2 EPYC) took
    18x as long an SFT step as fp32. model.dtype fast, the SmolLM2 config's, is bf16 on GPU and on a
    CPU with the units, fp32 on others; an explicit bfloat16 on such a CPU keeps its note."""
    import torch
    import learner
    cfg = config.load_config(ROOT / "configs" / "smollm2-cpu.yaml")
    assert cfg.model.dtype == "fast"
    native = learner.cpu_has_bf16_units(learner._cpu_flags())
    assert learner.compute_dtype(cfg, "cuda") == torch.bfloat16
    assert learner.compute_dtype(cfg, "cpu") == (torch.bfloat16 if native else torch.float32)
    assert learner.cpu_bf16_note(cfg, "cpu") is None
    assert learner.cpu_has_bf16_units({"avx2", "amx_bf16"}) and learner.cpu_has_bf16_units({"avx512_bf16"})
    assert not learner.cpu_has_bf16_units({"avx2", "avx512f", "f16c"})
    explicit = config.load_config(ROOT / "configs" / "smollm2-cpu.yaml", ["model.dtype=bfloat16"])
    assert (learner.cpu_bf16_note(explicit, "cpu") is None) == native


# --- ranges ---------------------------------------------------------------------------------

@pytest.mark.parametrize("override, allowed", [
    ("train.lr=-1", "> 0"), ("sft.lr=-1", "> 0"), ("checkpoint.every=0", ">= 1"),
    ("sft.batch_size=0", ">= 1"), ("train.steps=-1", ">= 0"), ("eval.num_tasks=-1", ">= 0"),
    ("rollout.command_timeout_s=-1", "> 0"), ("train.updates_per_step=0", ">= 1"),
    ("rollout.max_turns=0", ">= 1"), ("train.adam_betas=[0.9,1.0]", "[0, 1)"),
    ("engine.gpu_memory_utilization=0", "(0, 1]"),
    ("rollout.prefill_prob=1.5", "[0, 1]"), ("algo.kl_coef=-0.1", ">= 0"),
])
def test_a_value_out_of_range_is_refused_at_load_naming_key_value_and_range(override, allowed):
    """Bugs: train.lr=-1 passed --dry-run and failed after SFT with a traceback; sft.lr=-1,
    checkpoint.every=0 (ZeroDivisionError) and sft.batch_size=0 crashed; train.steps=-1,
    eval.num_tasks=-1, rollout.command_timeout_s=-1 and train.updates_per_step=0 were accepted
    silently; rollout.max_turns=0 gave a misleading SFT message. Each is refused at load."""
    key, value = override.split("=")
    with pytest.raises(config.ConfigError) as e:
        config.load_config(ROOT / "configs" / "tiny.yaml", [override])
    msg = str(e.value)
    assert msg.startswith(f"config key '{key}' is ") and msg.endswith(f"; allowed: {allowed}"), msg
    assert yaml.safe_load(msg.split(" is ", 1)[1].rsplit("; allowed", 1)[0]) == yaml.safe_load(value), msg


def test_dry_run_refuses_a_value_out_of_range(tmp_path):
    r = subprocess.run([sys.executable, "train.py", "--config", "configs/tiny.yaml", "--dry-run",
                        "--set", "train.lr=-1", "--set", f"out_dir={tmp_path / 'run'}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert (r.returncode == 1
            and "config error: config key 'train.lr' is -1.0; allowed: > 0" in r.stderr), r.stderr
    assert not (tmp_path / "run").exists()


def test_every_numeric_key_with_a_meaningful_range_declares_it():
    """A numeric key without a range is one that accepts any number: seeds alone may (any integer
    draws a stream), and algo.AlgoConfig's own checks cover the rest of algo:. The boundaries pass."""
    unranged = []
    for key, cls, name, section in _keys():
        tp = typing.get_type_hints(cls)[name]
        if typing.get_origin(tp) in (typing.Union, types.UnionType):
            tp = next(a for a in typing.get_args(tp) if a is not type(None))
        if tp not in (int, float) and tp != list[float]:
            continue
        annotated = typing.get_type_hints(cls, include_extras=True)[name]
        if typing.get_origin(annotated) is not typing.Annotated and key not in config.RANGES:
            unranged.append(key)
    assert sorted(unranged) == ["algo.clip_high", "algo.clip_low", "algo.gamma", "algo.max_filtered_share",
                                "algo.mismatch_cap", "algo.mismatch_floor", "algo.negative_reward",
                                "algo.norm_length", "algo.seq_clip_high", "algo.seq_clip_low",
                                "data.eval_seed", "data.generated_seed", "seed"]
    config.load_config(ROOT / "configs" / "tiny.yaml",
                       ["train.steps=0", "eval.num_tasks=0", "checkpoint.every=1", "rollout.top_k=-1",
                        "rollout.prefill_prob=1", "train.grad_clip=0"])


@pytest.mark.parametrize("name", ["../../..", "a/b", ".hidden", "", "runs/../x", "a b", "é"])
def test_run_name_must_be_a_plain_name(name):
    """Bug: run_name could be `../../..`, so runs/<run_name> (and every file a run writes) landed
    outside runs/. Refused with the rule; a plain name loads."""
    rule = r"config key 'run_name' is .*letters, digits, '\.', '_', '-', not starting with '\.'"
    with pytest.raises(config.ConfigError, match=rule):
        config.load_config(ROOT / "configs" / "tiny.yaml", [f"run_name={name}"])
    assert config.load_config(ROOT / "configs" / "tiny.yaml", ["run_name=tiny-4steps_v1.2"]).out_dir == \
        "runs/tiny-4steps_v1.2"
