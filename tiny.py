"""Build a tiny Qwen3-style model and tokenizer locally, no downloads.

The result is an ordinary Hugging Face model directory: `AutoTokenizer`/`AutoModelForCausalLM`
`.from_pretrained(dir)` and `vllm.LLM(model=dir)` load it as they would a real Qwen3 checkpoint.
It exists so the whole pipeline (rollout with vLLM CPU, training, weight sync, LoRA) can run and
be tested on a laptop CPU in minutes.

    python tiny.py out/tiny                      # build (idempotent) and print its size
    python tiny.py out/tiny --bench              # also time forward+backward of 4 x 512 tokens

Tokenizer: byte-level BPE (the Qwen2/Qwen3 pre-tokenizer regex, no NFC so any byte string
round-trips exactly) trained on a built-in corpus plus any `corpus` you pass, with Qwen's special
tokens. Chat template: Qwen2.5/Qwen3 tool calling (`<tools>` in the system turn, `<tool_call>` JSON
in assistant turns, `<tool_response>` inside user turns), written so that rendering messages[:n]
is always a string prefix of rendering messages[:n+1] (rollout takes observation deltas).
"""
import argparse
import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path

from chat import tool_call_text
from task_folders import oracle_commands
from generated_tasks import generate_tasks

# torch, transformers, tokenizers and jinja2 are imported inside the functions that use them, so that
# `python tiny.py --help` and the corpus helpers start in a fraction of a second.

# Qwen2.5 / Qwen3 special tokens. The tool and think tags are added tokens with special=False,
# exactly as in Qwen's tokenizer.json, so decode(skip_special_tokens=True) keeps them.
PAD_TOKEN, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END]
TAG_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]

# Qwen2's pre-tokenizer regex (transformers' Qwen2Tokenizer.PRETOKENIZE_REGEX).
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# The Qwen2.5 tool-calling template, simplified in one way: every tool message is its own user turn
# (Qwen merges consecutive tool messages into one turn, which breaks the prefix property when a
# second tool message arrives). `arguments` may be a dict or an already-encoded JSON string.
# Its two long lines are Qwen's tool prompt, verbatim (hence the noqa).
CHAT_TEMPLATE = r"""{%- if messages and messages[0].role == 'system' %}
    {%- set system = messages[0].content %}
    {%- set rest = messages[1:] %}
{%- else %}
    {%- set system = 'You are a helpful assistant.' %}
    {%- set rest = messages %}
{%- endif %}
{{- '<|im_start|>system\n' + system }}
{%- if tools %}
    {{- '\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' + (tool | tojson) }}
    {%- endfor %}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' }}
{%- endif %}
{{- '<|im_end|>\n' }}
{%- for message in rest %}
    {%- if message.role == 'assistant' %}
        {{- '<|im_start|>assistant\n' + (message.content or '') }}
        {%- for tool_call in message.tool_calls or [] %}
            {%- set call = tool_call.function if tool_call.function is defined else tool_call %}
            {%- if message.content or not loop.first %}
                {{- '\n' }}
            {%- endif %}
            {{- '<tool_call>\n{"name": "' + call.name + '", "arguments": ' }}
            {%- if call.arguments is string %}
                {{- call.arguments }}
            {%- else %}
                {{- call.arguments | tojson }}
            {%- endif %}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}"""  # noqa: E501

BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command in the task's terminal and return its output.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The bash command to run."}},
            "required": ["command"],
        },
    },
}

# Built-in corpus pieces: shell commands, instruction words, and rendered tool-call conversations,
# so the tokenizer has sensible merges even when no task corpus is given.
SHELL_COMMANDS = [
    "ls -la", "ls", "pwd", "cd /app", "cat README.md", "cat input.txt", "echo hello > out.txt",
    "echo 'hello world' > /app/hello.txt", "printf '%s\\n' a b c > list.txt", "mkdir -p data/out",
    "touch notes.txt", "cp a.txt b.txt", "mv old.txt new.txt", "rm -f tmp.txt", "rm -rf build",
    "chmod +x run.sh", "head -n 5 data.csv", "tail -n 20 log.txt", "wc -l input.txt", "wc -w words.txt",
    "sort names.txt | uniq > unique.txt", "sort -n numbers.txt", "cut -d, -f2 data.csv",
    "tr 'a-z' 'A-Z' < in.txt > out.txt", "grep -n error log.txt", "grep -c ERROR app.log",
    "grep -rl TODO src/", "sed -i 's/foo/bar/g' config.txt", "awk '{print $1}' data.txt",
    "awk -F, '{s+=$2} END {print s}' data.csv", "find . -name '*.py'", "find /app -type f | wc -l",
    "python3 -c 'print(1+2)'", "python3 solve.py", "python3 -m pytest -q", "jq '.name' config.json",
    "jq -r '.items[].id' data.json", "git status", "git log --oneline | head", "git diff",
    "tar -czf backup.tar.gz data/", "tar -xzf archive.tar.gz", "unzip files.zip", "zip -r out.zip out/",
    "diff a.txt b.txt", "patch -p1 < fix.patch", "sqlite3 db.sqlite 'SELECT count(*) FROM users;'",
    "bc <<< '2^10'", "seq 1 10 > numbers.txt", "date +%Y-%m-%d", "whoami", "env | sort",
    "cat > script.sh << 'EOF'\n#!/bin/bash\necho done\nEOF", "for f in *.txt; do echo $f; done",
    "if [ -f out.txt ]; then cat out.txt; fi", "export PATH=$PATH:/usr/local/bin", "make test",
    "du -sh /app", "stat -c %s file.bin", "md5sum file.txt", "sha256sum data.bin", "xxd file.bin | head",
    "ps aux", "kill -9 1234", "basename /app/data/file.txt", "dirname /app/data/file.txt",
    "echo $((3 * 7))", "tree /app", "file data.bin", "ln -s target link", "test -d out && echo yes",
]
INSTRUCTION_TEXT = [
    "Create a file named output.txt in the current directory containing the word hello.",
    "Write the number of lines in input.txt to count.txt.",
    "Count how many times the word error appears in the log file and save the result.",
    "Sort the names in names.txt alphabetically, remove duplicates, and write them to sorted.txt.",
    "Rename every .txt file in the data directory so that it ends with .bak instead.",
    "Replace all occurrences of foo with bar in config.txt.",
    "Make the script run.sh executable and run it.",
    "Extract the second column of data.csv and compute its sum.",
    "Find all Python files under src and list them in files.txt, one per line.",
    "Fix the bug in the program so that the tests pass.",
    "Create a directory called results and copy the report into it.",
    "Convert the text in input.txt to upper case and save it as output.txt.",
    "The file is missing. Check the current directory first, then create it.",
    "Let me look at the files in the directory. I will check the contents of the file.",
    "I need to create the file with the correct content. Now I will verify the result.",
    "The task is complete. The output matches the expected value.",
    "Command not found. The previous command failed with exit code 1. Try again.",
    "No such file or directory. Permission denied. Done.",
]


def render_chat(messages: list[dict], tools: list[dict] | None = None,
                add_generation_prompt: bool = False) -> str:
    """CHAT_TEMPLATE rendered as transformers does it (used to build the corpus before a tokenizer exists)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x: json.dumps(x, ensure_ascii=False)
    return env.from_string(CHAT_TEMPLATE).render(
        messages=messages, tools=tools, add_generation_prompt=add_generation_prompt)


def default_corpus() -> list[str]:
    """Strings the tokenizer is always trained on: shell commands, instructions, rendered tool-call chats."""
    chats = []
    for i, command in enumerate(SHELL_COMMANDS):
        thought = INSTRUCTION_TEXT[(i + 1) % len(INSTRUCTION_TEXT)]
        chats.append(render_chat([
            {"role": "user", "content": INSTRUCTION_TEXT[i % len(INSTRUCTION_TEXT)]},
            {"role": "assistant", "content": thought,
             "tool_calls": [{"type": "function",
                             "function": {"name": "bash", "arguments": {"command": command}}}]},
            {"role": "tool", "content": INSTRUCTION_TEXT[(i + 2) % len(INSTRUCTION_TEXT)]},
            {"role": "assistant", "content": "<think>\nDone.\n</think>\n\n" + INSTRUCTION_TEXT[-1]},
        ], tools=[BASH_TOOL]))
    return SHELL_COMMANDS + INSTRUCTION_TEXT + chats


def train_tokenizer(corpus: list[str], vocab_size: int):
    """Byte-level BPE with Qwen's pre-tokenizer and special tokens, at most `vocab_size` ids in all."""
    from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors,
                            trainers)
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    # No NFC normalizer (Qwen has one): byte-level BPE without it round-trips every string exactly.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(SPECIAL_TOKENS) - len(TAG_TOKENS),
        min_frequency=2,
        special_tokens=[],  # added after training so they get ids at the end, as in Qwen
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Encoding cuts text at added tokens before BPE runs, so train on the same pieces.
    tags = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS + TAG_TOKENS))
    tok.train_from_iterator((piece for text in corpus for piece in tags.split(text)), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        unk_token=None,
        bos_token=None,
        clean_up_tokenization_spaces=False,  # otherwise decode() would eat spaces before punctuation
        model_max_length=1 << 20,
        chat_template=CHAT_TEMPLATE,
    )


def build_tiny_model(
    out_dir,
    corpus: list[str] | None = None,
    seed: int = 0,
    vocab_size: int = 4096,
    hidden_size: int = 256,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int = 64,
    intermediate_size: int = 768,
    max_position_embeddings: int = 4096,
    tie_word_embeddings: bool = False,
) -> Path:
    """Train the tokenizer, init a random Qwen3 model with `seed`, save both to `out_dir`; skip if built."""
    if head_dim not in (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512):
        raise ValueError(f"head_dim={head_dim}: vLLM's CPU attention supports 32, 64, 80, 96, 112, 128, "
                         "...; use 64")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads={num_heads} must be a multiple of num_kv_heads={num_kv_heads}")
    out_dir = Path(out_dir)
    corpus = list(corpus or [])
    if not all(isinstance(s, str) for s in corpus):
        raise TypeError("corpus must be a list of strings (e.g. rendered oracle trajectories)")
    args = dict(seed=seed, vocab_size=vocab_size, hidden_size=hidden_size, num_layers=num_layers,
                num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                intermediate_size=intermediate_size, max_position_embeddings=max_position_embeddings,
                tie_word_embeddings=tie_word_embeddings)
    key = hashlib.sha256()
    key.update(Path(__file__).read_bytes())  # any change to this recipe rebuilds
    key.update(json.dumps(args, sort_keys=True).encode())
    for s in corpus:
        key.update(hashlib.sha256(s.encode()).digest())
    key = key.hexdigest()
    stamp = out_dir / "tiny_build.json"
    if stamp.exists() and json.loads(stamp.read_text()).get("key") == key:
        return out_dir
    if out_dir.exists() and any(out_dir.iterdir()) and not stamp.exists():
        raise FileExistsError(f"{out_dir} exists and was not made by tiny.py; pass an empty or new directory")

    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    tokenizer = train_tokenizer(default_corpus() + corpus, vocab_size)
    config = Qwen3Config(
        vocab_size=len(tokenizer),  # exactly the tokenizer: no sampled id can be undecodable
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        # Untied by default: with tied weights vLLM 0.32 CPU's in-place reload_weights keeps computing
        # logits from the OLD embedding (the lm_head GEMM stays prepacked) unless the caller also sends
        # ("lm_head.weight", embed) -- a sync that silently half-lands. Untied, nothing is special.
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=tokenizer.convert_tokens_to_ids(PAD_TOKEN),
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD_TOKEN),
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).to(torch.float32)
    # Only stop tokens: vLLM reads sampling defaults (temperature, top_p) from here, keep them unset.
    model.generation_config = GenerationConfig(
        eos_token_id=[config.eos_token_id, config.pad_token_id], pad_token_id=config.pad_token_id)

    tmp = out_dir.with_name(f".{out_dir.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    num_params = sum(p.numel() for p in model.parameters())
    (tmp / "tiny_build.json").write_text(json.dumps(
        dict(key=key, args=args, corpus_strings=len(corpus), num_params=num_params), indent=1))
    shutil.rmtree(out_dir, ignore_errors=True)  # only ever our own previous build (checked above)
    try:
        os.replace(tmp, out_dir)  # readers never see a half-written model
    except OSError:  # another process (a parallel test run) finished the same build first
        shutil.rmtree(tmp, ignore_errors=True)
        if not (stamp.exists() and json.loads(stamp.read_text()).get("key") == key):
            raise
    return out_dir


def oracle_corpus(tasks, system_prompt: str, tools) -> list[str]:
    """Rendered oracle conversations of `tasks` (with `tools` in the system turn, as the rollout
    renders them): the tiny tokenizer learns merges for them."""
    tok = train_tokenizer(default_corpus(), 512)  # only for the chat template
    out = []
    for t in tasks:
        msgs = [{"role": "system", "content": system_prompt}, {"role": "user", "content": t.instruction}]
        for c in oracle_commands(t):
            msgs.append({"role": "assistant", "content": tool_call_text("bash", {"command": c})})
            msgs.append({"role": "tool", "content": "[exit code: 0]"})
        msgs.append({"role": "assistant", "content": tool_call_text("submit", {})})
        out.append(tok.apply_chat_template(msgs, tools=tools, tokenize=False))
    return out


def build_for_tasks(out_dir, tasks, system_prompt: str, tools, generated_seed: int | None = None,
                    family: str = "easy", **kwargs) -> Path:
    """build_tiny_model whose tokenizer also learns the oracle conversations of `tasks`, or, with
    `generated_seed`, of the whole generated `family` (both splits): every word is then one token
    wherever it appears (" w", "/w"), as in a real tokenizer; from the train tasks alone " pencil"
    was " pe n c i l"."""
    if generated_seed is not None:
        tasks = [t for split in ("train", "heldout")
                 for t in generate_tasks(family, 512, seed=generated_seed, split=split)]
    return build_tiny_model(out_dir, corpus=oracle_corpus(tasks, system_prompt, tools), **kwargs)


def bench_forward_backward(model_dir, batch: int = 4, seq_len: int = 512,
                           steps: int = 3) -> tuple[float, float]:
    """(tokens per wall second, tokens per CPU second) of a plain fp32 forward+backward.

    The second figure does not depend on what else the shared machine runs; times the thread count
    it estimates what an idle machine would give.
    """
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq_len),
                        generator=torch.Generator().manual_seed(0))
    model(input_ids=ids, labels=ids).loss.backward()  # warm-up
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        model(input_ids=ids, labels=ids).loss.backward()
    tokens = batch * seq_len * steps
    return tokens / (time.perf_counter() - t0), tokens / (time.process_time() - c0)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--corpus",
                    help="optional text file; each paragraph (blank-line separated) is one string")
    ap.add_argument("--bench", action="store_true", help="time forward+backward of 4 x 512 tokens")
    a = ap.parse_args()
    corpus = Path(a.corpus).read_text().split("\n\n") if a.corpus else None
    t0 = time.perf_counter()
    path = build_tiny_model(a.out_dir, corpus=corpus, seed=a.seed)
    info = json.loads((path / "tiny_build.json").read_text())
    print(f"{path}: {info['num_params'] / 1e6:.2f}M params, "
          f"vocab {json.loads((path / 'config.json').read_text())['vocab_size']}"
          f" ({time.perf_counter() - t0:.1f}s)")
    if a.bench:
        import torch

        wall, cpu = bench_forward_backward(path)
        print(f"forward+backward 4x512 fp32: {wall:.0f} tokens/s wall, {cpu:.0f} tokens per CPU-second "
              f"(x{torch.get_num_threads()} threads = {cpu * torch.get_num_threads():.0f} tokens/s "
              "on an idle machine)")
