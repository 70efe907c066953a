"""The model's markup (`<think>`, `<tool_call>`) and vLLM 0.28.0's parsers of it, as chat deltas.

`render` writes a Turn as Qwen3 writes it, in token pieces: `<think>…</think>\\n\\n`, then for
`qwen3_coder` `<tool_call>\\n<function=NAME>\\n<parameter=K>\\nV\\n</parameter>\\n…</function>\\n
</tool_call>`, for `hermes` `<tool_call>\\n{"name": …, "arguments": {…}}\\n</tool_call>`.

`ChatParser` turns the engine's text, one engine step at a time, into the `delta` objects of
vLLM's chat stream (`DeltaMessage`: content, reasoning, tool_calls, only the fields set), the way
0.28.0's parsers stream them (checked byte for byte against the golden fixtures):
* reasoning (`--reasoning-parser qwen3`): text between `<think>` and `</think>`; a step holding
  only `<think>` yields no chunk; with the Qwen3 engine parser (qwen3 + qwen3_coder) and with the
  reasoning parser alone, the newlines right after `</think>` are not streamed as content, with
  hermes they are (0.33, `keep_newlines`: with the reasoning parser alone they are too);
* qwen3_coder: the name once `<function=NAME>` is complete, the arguments as JSON text one complete
  parameter at a time (string values left open, closed by the next parameter or `</function>`);
* hermes: the name once its string is complete, then the raw `arguments` text as it arrives, the
  wrapper's closing brace excluded; every tool delta also carries `"content": null`.
`parse_full` is the non-streaming extraction. Both are reused by the `/v1/responses` and
`/v1/messages` translations.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

from .scripted import Call, Turn
from .textgen import END_THINK_ID, THINK_ID, split_pieces

Json = dict[str, Any]

THINK, END_THINK = "<think>", "</think>"
TOOL_CALL, END_TOOL_CALL = "<tool_call>", "</tool_call>"
PARSERS = ("qwen3_coder", "hermes")
# Tags that Qwen3's tokenizer (or the fixtures' tokenizer) keeps as one piece.
_TAGS = re.compile(
    r"(<think>|</think>|<tool_call>|</tool_call>|<function=|</function>|"
    r"<parameter=|</parameter>)"
)
_FUNC = re.compile(r"<function=([^>\n]+)>")
_PARAM = re.compile(r"<parameter=([^>\n]+)>\n(.*?)\n</parameter>", re.DOTALL)
_HERMES_NAME = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_HERMES_ARGS = re.compile(r'\s*,\s*"arguments"\s*:\s*')


def tool_call_id() -> str:
    return f"chatcmpl-tool-{secrets.token_hex(8)}"


def _dumps(value: Any) -> str:
    # vLLM's parsers write arguments with json.dumps defaults but keep non-ASCII text as is.
    return json.dumps(value, ensure_ascii=False)


def pieces(text: str) -> list[str]:
    """Token pieces of model output, markup tags whole."""
    out: list[str] = []
    for part in _TAGS.split(text):
        if _TAGS.fullmatch(part):
            out.append(part)
        elif part:
            out.extend(split_pieces(part))
    return out


def _param_text(value: Any) -> str:
    return value if isinstance(value, str) else _dumps(value)


def render_call(call: Call, parser: str) -> str:
    if parser == "hermes":
        body = _dumps({"name": call.name, "arguments": call.arguments})
        return f"{TOOL_CALL}\n{body}\n{END_TOOL_CALL}"
    params = "".join(
        f"<parameter={k}>\n{_param_text(v)}\n</parameter>\n" for k, v in call.arguments.items()
    )
    return f"{TOOL_CALL}\n<function={call.name}>\n{params}</function>\n{END_TOOL_CALL}"


def render(turn: Turn, parser: str | None) -> str:
    """The turn as model output text (no EOS). `content` None means: free text follows."""
    out = ""
    if turn.reasoning is not None:
        out += f"{THINK}{turn.reasoning}{END_THINK}\n\n"
    if turn.calls:
        out += "\n".join(render_call(c, parser or "hermes") for c in turn.calls)
    elif turn.content is not None:
        out += turn.content
    return out


@dataclass(slots=True)
class _Call:
    """One tool call being streamed."""

    index: int
    body_start: int  # offset in the text just after <tool_call>
    id: str = field(default_factory=tool_call_id)
    name: str | None = None
    name_sent: bool = False
    args_sent: str = ""
    params: Json = field(default_factory=dict)
    closed: bool = False  # </tool_call> seen
    end: int = 0  # offset after </tool_call>


def _string_param(schema_types: dict[str, Json], name: str | None, key: str) -> bool:
    props = (schema_types.get(name or "") or {}).get("properties") or {}
    kind = (props.get(key) or {}).get("type", "string")
    return kind == "string" or (isinstance(kind, list) and "string" in kind)


def _convert(value: str, is_string: bool) -> Any:
    if is_string:
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def _coder_args(params: list[tuple[str, Any, bool]], closed: bool) -> str:
    """qwen3_coder's argument JSON text so far: string values stay open until something follows."""
    out = ""
    for i, (key, value, is_string) in enumerate(params):
        if i:
            out += '", ' if params[i - 1][2] else ", "
        else:
            out += "{"
        out += f"{_dumps(key)}: " + (_dumps(value)[:-1] if is_string else _dumps(value))
    if closed:
        out += ('"' if params and params[-1][2] else "") + ("}" if params else "{}")
    return out


class ChatParser:
    """vLLM 0.28.0's reasoning + tool parsing of one chat choice, one engine step at a time."""

    def __init__(
        self,
        *,
        reasoning: bool,
        tool_parser: str | None,
        tools: dict[str, Json] | None = None,
        keep_newlines: bool = False,
        implicit_think: bool = False,
    ) -> None:
        self.reasoning = reasoning
        self.keep_newlines = keep_newlines
        # 0.32 (dialect.py): reasoning from the first token, `<think>` written or not.
        self.implicit_think = reasoning and implicit_think
        self.tool_parser = tool_parser
        self.schemas = tools or {}
        self.text = ""
        self.pos = 0
        self.in_reasoning = reasoning
        # The Qwen3 engine parser and the reasoning parser alone drop the "\n\n" after </think>.
        self.skip_newlines = False
        self.calls: list[_Call] = []
        self.reasoning_tokens = 0
        self._thinking_ids = self.implicit_think

    @property
    def tool_calls_streamed(self) -> bool:
        return bool(self.calls)

    def count_tokens(self, token_ids: list[int]) -> None:
        """Reasoning tokens: those strictly between <think> and </think> (usage details)."""
        for t in token_ids:
            if t == THINK_ID:
                self._thinking_ids = True
            elif t == END_THINK_ID:
                self._thinking_ids = False
            elif self._thinking_ids:
                self.reasoning_tokens += 1

    def feed(self, text: str, token_ids: list[int], final: bool) -> Json | None:
        """The delta for this step's text, or None when vLLM would send no chunk."""
        if self.reasoning:
            self.count_tokens(token_ids)
        if not self.text and text and not text.startswith(THINK) and not self.implicit_think:
            self.in_reasoning = False  # the model did not think (enable_thinking off)
        self.text += text
        content: str | None = None
        reasoning: str | None = None
        tool_deltas: list[Json] = []
        while self.pos < len(self.text):
            if self.in_reasoning:
                reasoning = (reasoning or "") + self._reasoning_part()
                continue
            if self.calls and not self.calls[-1].closed:
                tool_deltas.extend(self._tool_part(final))
                if not self.calls[-1].closed:
                    break
                continue
            content = (content or "") + self._content_part()
        return self._delta(content, reasoning, tool_deltas, final)

    # -- pieces of the text ----------------------------------------------------------------

    def _reasoning_part(self) -> str:
        rest = self.text[self.pos :]
        if rest.startswith(THINK):
            self.pos += len(THINK)
            rest = rest[len(THINK) :]
        end = rest.find(END_THINK)
        if end < 0:
            self.pos = len(self.text)
            return rest
        self.pos += end + len(END_THINK)
        self.in_reasoning = False
        keep = self.tool_parser == "hermes" or (self.keep_newlines and self.tool_parser is None)
        self.skip_newlines = not keep
        return rest[:end]

    def _content_part(self) -> str:
        if self.skip_newlines:
            while self.pos < len(self.text) and self.text[self.pos] == "\n":
                self.pos += 1
            if self.pos < len(self.text):
                self.skip_newlines = False
        rest = self.text[self.pos :]
        start = rest.find(TOOL_CALL) if self.tool_parser else -1
        if start < 0:
            self.pos = len(self.text)
            return rest
        self.pos += start + len(TOOL_CALL)
        self.calls.append(_Call(len(self.calls), self.pos))
        return rest[:start]

    def _tool_part(self, final: bool) -> list[Json]:
        call = self.calls[-1]
        body = self.text[call.body_start :]
        close = body.find(END_TOOL_CALL)
        if close >= 0:
            call.closed = True
            call.end = call.body_start + close + len(END_TOOL_CALL)
            body = body[:close]
        out: list[Json] = []
        was_named = call.name_sent
        if call.name is None:
            m = (_HERMES_NAME if self.tool_parser == "hermes" else _FUNC).match(
                body.lstrip("\n") if self.tool_parser != "hermes" else body
            )
            if m is not None:
                call.name = (
                    json.loads(f'"{m.group(1)}"') if self.tool_parser == "hermes" else m.group(1)
                )
        if call.name is not None and not call.name_sent:
            call.name_sent = True
            out.append(
                {
                    "id": call.id,
                    "type": "function",
                    "index": call.index,
                    "function": {"name": call.name},
                }
            )
        if was_named or call.closed or final:
            args = self._args_so_far(call, body)
            if len(args) > len(call.args_sent):
                delta = args[len(call.args_sent) :]
                call.args_sent = args
                if out:
                    out[0]["function"]["arguments"] = delta
                else:
                    out.append({"index": call.index, "function": {"arguments": delta}})
        self.pos = call.end if call.closed else len(self.text)
        return out

    def _args_so_far(self, call: _Call, body: str) -> str:
        if self.tool_parser == "hermes":
            m = _HERMES_NAME.match(body)
            a = _HERMES_ARGS.match(body, m.end()) if m else None
            if a is None:
                return call.args_sent
            raw = body[a.end() :].rstrip()
            # A trailing brace may be the wrapper's (always, once </tool_call> is seen): held back.
            raw = raw[:-1] if raw.endswith("}") else raw
            return raw if len(raw) > len(call.args_sent) else call.args_sent
        done = "</function>" in body
        params = [
            (m.group(1), _convert(m.group(2), s), s)
            for m in _PARAM.finditer(body)
            for s in [_string_param(self.schemas, call.name, m.group(1))]
        ]
        call.params = {k: v for k, v, _ in params}
        return _coder_args(params, done)

    def _delta(
        self, content: str | None, reasoning: str | None, tools: list[Json], final: bool
    ) -> Json | None:
        delta: Json = {}
        if content:
            delta["content"] = content
        elif tools and self.tool_parser == "hermes":
            delta["content"] = None
        if reasoning:
            delta["reasoning"] = reasoning
        if tools:
            delta["tool_calls"] = tools
        if not delta and final:
            return {"content": ""}
        return delta or None

    # -- non-streaming --------------------------------------------------------------------

    def full(self) -> tuple[str | None, str | None, list[Json]]:
        """content, reasoning and tool_calls of the whole text (the non-streaming message)."""
        return parse_full(
            self.text,
            reasoning=self.reasoning,
            tool_parser=self.tool_parser,
            tools=self.schemas,
            implicit_think=self.implicit_think,
        )


def parse_full(
    text: str,
    *,
    reasoning: bool,
    tool_parser: str | None,
    tools: dict[str, Json] | None = None,
    implicit_think: bool = False,
) -> tuple[str | None, str | None, list[Json]]:
    thought: str | None = None
    if reasoning and (implicit_think or text.startswith(THINK) or END_THINK in text):
        body = text[len(THINK) :] if text.startswith(THINK) else text
        end = body.find(END_THINK)
        if end >= 0:
            thought, text = body[:end], body[end + len(END_THINK) :]
        elif implicit_think:
            return None, body, []  # 0.32: no `</think>`, all of it reasoning, content null
        else:
            thought, text = body, ""
    calls: list[Json] = []
    if tool_parser is not None and TOOL_CALL in text:
        parser = ChatParser(reasoning=False, tool_parser=tool_parser, tools=tools)
        parser.feed(text, [], final=True)
        kept: list[str] = []
        cursor = 0
        for c in parser.calls:
            kept.append(text[cursor : c.body_start - len(TOOL_CALL)])
            cursor = c.end if c.closed else len(text)
            if c.name is not None:
                calls.append(
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.args_sent},
                    }
                )
        kept.append(text[cursor:])
        content: str | None = "".join(kept)
        if calls and not (content or "").strip():
            content = None
        return content, thought, calls
    return text, thought, calls
