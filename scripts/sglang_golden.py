"""Freeze SGLang's own serving bytes into tests/fixtures/sglang-golden/<version>/.

Runs in an SGLang venv (scripts/sglang.sh makes one; SGLang's server does not run on this CPU,
see docs/backends.md), not the project's. SGLang's OpenAI serving classes (`OpenAIServingChat`,
`OpenAIServingCompletion`, `OpenAIServingResponses`, `AnthropicServing`) run as they are, with the engine replaced by a playback of the
outputs each `<name>.input.json` lists (`outputs`: one per engine step, its tokens' text and the
`meta_info` SGLang's tokenizer manager would attach), `time.time` pinned; stream frames are the
strings SGLang yields, bodies `model_dump_json(by_alias=True)` as its HTTP layer writes them.
`metrics.prom` is SGLang's own collectors (scheduler and tokenizer) fed the same two requests,
written by prometheus_client. Usage: python scripts/sglang_golden.py OUT_DIR MODEL_DIR
"""

from __future__ import annotations

import asyncio
import importlib.machinery
import json
import sys
import time
import types
import uuid
from pathlib import Path
from typing import Any

CREATED = 1_780_000_000
PROMPT_TOKENS = 12
# Two tiny answers, one per engine step (the first from the prefill, then one per verify step
# of an EAGLE-style drafter of 3 tokens: each step gives 1 to 4 tokens).
STEPS = [["Hello"], [",", " world"], ["!", " How", " are", " you"], ["?"]]
MODEL = "qwen-tiny"


def _stub_torchvision() -> None:
    """SGLang imports torchvision for its vision models; no CPU build fits this torch, and no
    vision code runs here, so an empty stand-in (after transformers has looked for the real one)."""
    import transformers
    from transformers import AutoProcessor  # noqa: F401  (settles transformers' lazy imports)

    del transformers

    class _Any:
        def __init__(self, *a: Any, **k: Any) -> None: ...
        def __call__(self, *a: Any, **k: Any) -> Any:
            return _Any()

        def __getattr__(self, n: str) -> Any:
            return _Any()

    def attr(n: str) -> Any:
        if n.startswith("__"):
            raise AttributeError(n)
        return _Any()

    for name in ("torchvision", "torchvision.transforms", "torchvision.transforms.functional"):
        m = types.ModuleType(name)
        m.__file__ = __file__
        m.__path__ = []
        m.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        m.__getattr__ = attr  # type: ignore[method-assign]
        sys.modules[name] = m


def _outputs(max_tokens: int, spec: bool) -> list[dict[str, Any]]:
    """The playback: cumulative text and meta_info after each engine step."""
    out: list[dict[str, Any]] = []
    text, tokens, verify, correct = "", 0, 0, 0
    for i, step in enumerate(STEPS):
        text += "".join(step)
        tokens += len(step)
        if i:
            verify += 1
            correct += len(step) - 1
        last = i == len(STEPS) - 1 or tokens >= max_tokens
        meta: dict[str, Any] = {
            "id": "0123456789abcdef0123456789abcdef",
            "prompt_tokens": PROMPT_TOKENS,
            "completion_tokens": tokens,
            "cached_tokens": 0,
            "weight_version": "default",
            "finish_reason": {"type": "length", "length": tokens} if last else None,
        }
        if spec and verify:
            meta.update(
                spec_verify_ct=verify,
                spec_num_correct_drafts=correct,
                spec_num_proposed_drafts=verify * 3,
                spec_accept_rate=correct / (verify * 3),
                spec_accept_length=tokens / verify,
                spec_correct_drafts_histogram=[0, 0, 0, 0],
            )
        out.append({"text": text, "index": 0, "meta_info": meta})
        if last:
            break
    return out


class _Manager:
    """The tokenizer manager's part the serving classes call: the playback."""

    served_model_name = MODEL
    server_args = None

    def __init__(self, outputs: list[dict[str, Any]], stream: bool) -> None:
        self.outputs, self.stream = outputs, stream

    async def generate_request(self, _req: Any, _raw: Any = None) -> Any:
        if self.stream:
            for o in self.outputs:
                yield o
        else:
            yield self.outputs[-1]

    def config_value(self, _name: str) -> None:
        return None


def _serving(cls: type, manager: _Manager) -> Any:
    """A serving object without its model-loading constructor: the attributes it sets."""
    s = object.__new__(cls)
    s.tokenizer_manager = manager
    for name, value in {
        "template_manager": None,
        "tool_call_parser": None,
        "reasoning_parser": None,
        "_reasoning_detector": None,
        "default_sampling_params": {},
        "is_gpt_oss": False,
        "is_gemma4": False,
        "is_minimax_m3": False,
        "chat_encoding_spec": None,
        "supports_inline_system": True,
        "_encoding_adapter": None,
        "_response_parser": None,
        "allowed_custom_labels": None,
    }.items():
        setattr(s, name, value)
    return s


async def _run(endpoint: str, body: dict[str, Any]) -> tuple[str, bytes]:
    from sglang.srt.entrypoints.openai import protocol
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
    from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion

    stream = bool(body.get("stream"))
    spec = bool(body.get("return_spec_tokens_details"))
    manager = _Manager(_outputs(body.get("max_tokens", 16), spec), stream)
    if endpoint == "messages":
        return await _messages(body, manager)
    if endpoint == "responses":
        return await _responses(body, manager)
    if endpoint == "chat":
        req: Any = protocol.ChatCompletionRequest(**body)
        serving = _serving(OpenAIServingChat, manager)
        gen, build = "_generate_chat_stream", "_build_chat_response"
    else:
        req = protocol.CompletionRequest(**body)
        serving = _serving(OpenAIServingCompletion, manager)
        gen, build = "_generate_completion_stream", "_build_completion_response"
    if stream:
        frames = [f async for f in getattr(serving, gen)(None, req, None)]
        return "sse", "".join(frames).encode()
    resp = getattr(serving, build)(req, [manager.outputs[-1]], CREATED)
    return "json", resp.model_dump_json(by_alias=True).encode()


async def _messages(body: dict[str, Any], manager: _Manager) -> tuple[str, bytes]:
    """Anthropic Messages: SGLang's `AnthropicServing` translates the request onto its chat
    serving (a stream asks continuous usage of it) and the answer back; a body is written by
    Starlette's JSONResponse, as its route returns it."""
    from sglang.srt.entrypoints.anthropic.protocol import AnthropicMessagesRequest
    from sglang.srt.entrypoints.anthropic.serving import AnthropicServing
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
    from starlette.responses import JSONResponse

    req = AnthropicMessagesRequest(**body)
    serving = AnthropicServing(_serving(OpenAIServingChat, manager))
    chat = serving._convert_to_chat_completion_request(req)
    if req.stream:
        gen = serving._generate_anthropic_stream(None, chat, req, None)
        return "sse", "".join([f async for f in gen]).encode()
    resp = serving.openai_serving_chat._build_chat_response(chat, [manager.outputs[-1]], CREATED)
    out = serving._convert_response(resp).model_dump(exclude_none=True)
    return "json", bytes(JSONResponse(content=out).body)


async def _responses(body: dict[str, Any], manager: _Manager) -> tuple[str, bytes]:
    """The Responses API: SGLang's `OpenAIServingResponses` (not the harmony path), its stream
    generator's events as its route streams them (no `[DONE]`), a body as FastAPI writes the
    returned model (`jsonable_encoder`, then JSONResponse)."""
    from fastapi.encoders import jsonable_encoder
    from sglang.srt.entrypoints.context import SimpleContext
    from sglang.srt.entrypoints.openai.protocol import RequestResponseMetadata, ResponsesRequest
    from sglang.srt.entrypoints.openai.serving_responses import OpenAIServingResponses
    from starlette.responses import JSONResponse

    req = ResponsesRequest(**body)
    s = _serving(OpenAIServingResponses, manager)
    for name, value in {
        "use_harmony": False,
        "_translates_tools": False,
        "enable_prompt_tokens_details": False,
        "enable_response_store": False,
        "tool_server": None,
        "response_store": {},
        "msg_store": {},
        "background_tasks": {},
    }.items():
        setattr(s, name, value)
    params = req.to_sampling_params(None, {}, stop=req.stop, tool_call_constraint=None)
    meta = RequestResponseMetadata(request_id=req.request_id)
    ctx = SimpleContext()

    async def outputs() -> Any:
        for o in manager.outputs:
            ctx.append_output(o)
            yield o

    if req.stream:
        gen = s.responses_stream_generator_non_harmony(
            req, params, outputs(), MODEL, None, meta, CREATED, require_reasoning=False
        )
        return "sse", "".join([e async for e in gen]).encode()
    resp = await s.responses_full_generator(
        req, params, outputs(), ctx, MODEL, None, meta, CREATED, require_reasoning=False
    )
    return "json", bytes(JSONResponse(content=jsonable_encoder(resp)).body)


SCENARIOS: dict[str, tuple[str, dict[str, Any]]] = {}
for _ep, _base in (
    ("chat", {"messages": [{"role": "user", "content": "hi"}]}),
    ("completions", {"prompt": "hi"}),
):
    _b = {"model": MODEL, "max_tokens": 16, "temperature": 0, **_base}
    SCENARIOS[f"{_ep}_stream_plain"] = (_ep, {**_b, "stream": True})
    SCENARIOS[f"{_ep}_stream_usage"] = (
        _ep,
        {**_b, "stream": True, "stream_options": {"include_usage": True}},
    )
    # What the gateway sends for either of the two above: continuous usage and spec details.
    SCENARIOS[f"{_ep}_stream_asked"] = (
        _ep,
        {
            **_b,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "return_spec_tokens_details": True,
        },
    )
    SCENARIOS[f"{_ep}_full_plain"] = (_ep, _b)
    SCENARIOS[f"{_ep}_full_asked"] = (_ep, {**_b, "return_spec_tokens_details": True})


# Anthropic Messages (SGLang asks its chat serving for continuous usage itself) and Responses:
# neither request has a field for the spec figures.
_m = {
    "model": MODEL,
    "max_tokens": 16,
    "temperature": 0,
    "messages": [{"role": "user", "content": "hi"}],
}
SCENARIOS["messages_stream"] = ("messages", {**_m, "stream": True})
SCENARIOS["messages_full"] = ("messages", _m)
_r = {"model": MODEL, "max_output_tokens": 16, "temperature": 0, "input": "hi"}
SCENARIOS["responses_stream"] = ("responses", {**_r, "stream": True})
SCENARIOS["responses_full"] = ("responses", _r)


def _metrics(server_args: Any) -> bytes:
    """SGLang's collectors after the two answers above (one streamed, one not), and a
    scheduler reading with priority scheduling on: 2 running (priorities 0 and 1), 1 waiting."""
    import prometheus_client
    from sglang.srt.observability import metrics_collector as mc

    labels = {"model_name": MODEL}
    tok = mc.TokenizerMetricsCollector(labels=labels)
    tokens = sum(len(s) for s in STEPS)
    for streaming in (True, False):
        tok.observe_time_to_first_token(labels, 0.05, stream=streaming)
        tok.observe_one_finished_request(
            labels,
            PROMPT_TOKENS,
            tokens,
            4,
            0.2,
            False,
            spec_verify_ct=len(STEPS) - 1,
            is_streaming=streaming,
        )
    # The scheduler's labels as its `init_new` sets them (one rank, priority scheduling on).
    ranks = {"engine_type": "unified", "tp_rank": 0, "pp_rank": 0, "moe_ep_rank": 0}
    sched = mc.SchedulerMetricsCollector(
        labels={**labels, **ranks, "priority": ""}, server_args=server_args
    )
    sched.log_stats(
        mc.SchedulerStats(
            num_running_reqs=mc.QueueCount(total=2, by_priority={0: 1, 1: 1}),
            num_queue_reqs=mc.QueueCount(total=1, by_priority={1: 1}),
            token_usage=0.25,
            spec_accept_length=2.67,
        )
    )
    return prometheus_client.generate_latest(prometheus_client.REGISTRY)


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    _stub_torchvision()
    from sglang.srt import runtime_context
    from sglang.srt.server_args import ServerArgs

    # SGLang's serving defaults, as its tokenizer process publishes them (the path: any model
    # directory with a config; nothing is loaded from it).
    args = ServerArgs(model_path=sys.argv[2], device="cpu")
    runtime_context.publish(args, role="tokenizer")
    time.time = lambda: float(CREATED)  # noqa: E731  (the frames' `created`)
    uuid.uuid4 = lambda: uuid.UUID(int=0x0123456789ABCDEF0123456789ABCDEF)  # message ids
    for name, (endpoint, body) in SCENARIOS.items():
        ext, data = asyncio.run(_run(endpoint, body))
        (out / f"{name}.{ext}").write_bytes(data)
        spec = bool(body.get("return_spec_tokens_details"))
        inputs: dict[str, Any] = {"endpoint": endpoint, "request": body}
        inputs["outputs"] = _outputs(body.get("max_tokens", 16), spec)
        (out / f"{name}.input.json").write_text(json.dumps(inputs, indent=1) + "\n")
    (out / "metrics.prom").write_bytes(_metrics(args))


if __name__ == "__main__":
    main()
