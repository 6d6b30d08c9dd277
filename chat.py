"""The chat format: how an episode's conversation becomes tokens and how a tool call is read back.

The tools (`bash`, `submit`) and their schemas; the tokenizer's chat template seen as token
deltas (`ChatFormat`: the stop token, the tokens of new messages after a finished assistant turn);
the Hermes/Qwen convention for templates without tool support; a tool call's text, its parser, and
the tool message a command's result becomes. Knows no engine, no container, no model.
"""
import json
import re

TOOLS = [
    {"type": "function", "function": {
        "name": "bash",
        "description": "Run a shell command in the task's terminal and return its output and exit code.",
        "parameters": {"type": "object",
                       "properties": {"command": {"type": "string",
                                                  "description": "The bash command to run."}},
                       "required": ["command"]}}},
    {"type": "function", "function": {
        "name": "submit",
        "description": "Declare the task complete. Ends the episode; hidden tests then check the result.",
        "parameters": {"type": "object", "properties": {}}}},
]


class ChatFormat:
    """The tokenizer's chat template seen as token deltas.

    `turn_end_ids` is what the template puts after an assistant message's content (Qwen:
    `<|im_end|>` `\\n`); its first token is the stop token the engine samples, the rest we append
    ourselves. `observation_ids(msgs)` are the tokens of `msgs` plus the next generation prompt,
    as the template renders them after a finished assistant turn."""

    PROBE = "\x00termrl-probe\x00"
    # The base assistant turn carries a think block so Qwen3-style templates (which drop empty
    # think blocks from all but the last turn) render it the same with or without what follows.
    BASE = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
            {"role": "assistant", "content": "<think>\nT\n</think>\n\nA"}]

    def __init__(self, tokenizer, tools=TOOLS, template_kwargs=None):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat_template; use a chat model's tokenizer")
        self.tok, self.tools, self.kw = tokenizer, tools, dict(template_kwargs or {})
        # Many chat templates (SmolLM2's, Llama-2-style ones) ignore `tools=`. Then the schemas and
        # the call format must reach the model some other way: we write the Hermes/Qwen <tools>
        # block into the system message ourselves (tests/test_smollm2.py).
        self.inline_tools = bool(tools) and self._renders_same_without_tools()
        text = self.render(self.BASE[:2] + [{"role": "assistant", "content": self.PROBE}])
        if self.PROBE not in text:
            raise ValueError("the chat template does not render assistant content verbatim; "
                             "cannot find turn ends")
        self.turn_end_ids = self.encode(text.split(self.PROBE, 1)[1])
        if not self.turn_end_ids or self.turn_end_ids[0] not in tokenizer.all_special_ids:
            raise ValueError(f"the chat template's assistant turn must end in a special token, got "
                             f"{text.split(self.PROBE, 1)[1]!r}")
        self.stop_id = self.turn_end_ids[0]
        self._base_ids = self.encode(self.render(self.BASE))

    def _renders_same_without_tools(self) -> bool:
        msgs = self.BASE[:2]
        def text(tools):
            return self.tok.apply_chat_template(msgs, tools=tools, tokenize=False, **self.kw)
        return text(self.tools) == text(None)

    def render(self, messages, add_generation_prompt=False) -> str:
        if self.inline_tools:
            messages = hermes_messages(messages, self.tools)
        return self.tok.apply_chat_template(messages, tools=None if self.inline_tools else self.tools,
                                            tokenize=False, add_generation_prompt=add_generation_prompt,
                                            **self.kw)

    def encode(self, text) -> list:
        return self.tok.encode(text, add_special_tokens=False)

    def decode(self, ids) -> str:
        return self.tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def prompt_ids(self, messages) -> list:
        return self.encode(self.render(messages, add_generation_prompt=True))

    def observation_ids(self, new_messages) -> list:
        full = self.encode(self.render(self.BASE + list(new_messages), add_generation_prompt=True))
        if full[:len(self._base_ids)] != self._base_ids:
            raise ValueError("the chat template is not append-only: rendering more messages changed earlier "
                             "tokens; fix the template (rollout needs prefix-stable rendering)")
        return full[len(self._base_ids):]

    def expert_ids(self, command) -> list:
        """An assistant turn that calls bash(command), as the model would emit it (stop token included)."""
        return self.encode(tool_call_text("bash", {"command": command})) + [self.stop_id]


def hermes_messages(messages, tools) -> list:
    """`messages` as a template without tool support should see them, in the Hermes/Qwen convention
    chat models are tuned on: the tool schemas and the call format appended to the system message
    (one is added when there is none), tool results as user turns inside <tool_response> tags."""
    block = ("\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
             "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
             + "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
             + "\n</tools>\n\nFor each function call, return a json object with function name and "
             "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
             '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')
    out = [{"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"}
           if m["role"] == "tool" else m for m in messages]
    if out and out[0]["role"] == "system":
        out[0] = {**out[0], "content": out[0]["content"] + block}
    else:
        out.insert(0, {"role": "system", "content": block.lstrip("\n")})
    return out


def tool_call_text(name, arguments) -> str:
    return ("<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
            + "\n</tool_call>")


TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
EXAMPLE_CALL = tool_call_text("bash", {"command": "ls"})


def parse_tool_call(text: str):
    """(call {"name", "arguments"}, None) for the first tool call in text, or (None, what is wrong)."""
    blocks = TOOL_CALL_RE.findall(text)
    if not blocks:
        return None, "no <tool_call>...</tool_call> block found"
    try:
        obj = json.loads(blocks[0])
    except json.JSONDecodeError as e:
        return None, f"the tool call is not valid JSON ({e.msg} at position {e.pos})"
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None, 'the tool call must be a JSON object {"name": ..., "arguments": {...}}'
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models double-encode the arguments
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None, '"arguments" must be a JSON object'
    if not isinstance(args, dict):
        return None, '"arguments" must be a JSON object'
    if obj["name"] == "bash":
        if not isinstance(args.get("command"), str) or not args["command"].strip():
            return None, 'bash needs a non-empty string argument "command"'
    elif obj["name"] != "submit":
        return None, f"unknown tool {obj['name']!r}; the tools are bash and submit"
    return {"name": obj["name"], "arguments": args, "extra_calls": len(blocks) - 1}, None


def format_observation(result, extra_calls=0) -> str:
    lines = [result.output.rstrip("\n")] if result.output.strip() else []
    if result.exit_code is not None:
        lines.append(f"[exit code: {result.exit_code}]")
    if extra_calls:
        lines.append(f"[only the first of {extra_calls + 1} tool calls was run; call one tool per reply]")
    return "\n".join(lines)


def tool_message(result, extra_calls=0) -> dict:
    """The tool message a bash command's result (terminal.CommandResult) becomes: `content` is what the
    model sees, `result` the outcome as fields for readers (evaluate.episode_steps), so nobody
    parses the text. Chat templates render `content` alone: the fields add no token
    (tests/test_rollout.py::test_tool_message_fields_add_no_tokens)."""
    return {"role": "tool", "content": format_observation(result, extra_calls),
            "result": {"exit_code": result.exit_code, "timed_out": result.timed_out,
                       "shell_restarted": result.shell_restarted, "truncated": result.truncated}}
