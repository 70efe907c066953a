"""The simulator's 0.32.0 mode against the real vLLM 0.32.0: the same requests, the same bytes
(the bytes half; test_vllm_sim_families.py is the /metrics half).

The real draft-model engine answers each case. The simulator (one in-process instance, 0.32.0
mode, the engines' flags) answers it too, its engine playing back what the real engine made: a
reference stream of the same prompt, asked with `return_token_ids` and per-chunk usage, gives
the prompt's token ids, each chunk's text, token ids and finish reason, and the speculative
summary (tests/sim/test_golden.py's Playback). The synthetic tokenizer and drafter cannot
reproduce the tiny model's text; everything around it is the simulator's own. Both bodies are
normalised as test_golden does (ids, clocks, the fingerprint's hash, signatures), then compared
frame by frame. ALLOWED lists what may still differ, with how many frames and why: the test fails
when a listed difference disappears or changes, or a new one appears.

vLLM's API server merges the outputs of engine steps it has not sent yet (a loaded machine cuts
the same text differently), so the reference and the case are asked again, up to 5 times, until
the two streams were cut alike; a difference of the simulator's own shows every time.

Embeddings (float and base64) go to the real embedding engine and to a second app of the same
simulator process (its embed profile, the tiny model's 128 dimensions): the vectors cannot be the
tiny model's, so each is reduced to its length in float32 values, and the token counts are masked
(the synthetic tokenizer counts the inputs differently); the rest is compared byte for byte.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from dataclasses import replace
from typing import Any

import httpx
import pytest

from loadtests.harness.vllm import DRAFT_TOKENS, SERVED
from loadtests.sim.engine import Delta
from loadtests.sim.playback import Playback
from loadtests.sim.profiles import BUILTIN_PROFILES
from loadtests.sim.sequences import SpecStats
from loadtests.sim.server import create_app
from loadtests.sim.state import Sim, SimConfig
from tests.engines.vllm.common import CHAT, GREEDY, PROMPT
from tests.engines.vllm.conftest import Engines
from tests.sim.test_golden import normalise

TRIES = 5
_USAGE = {"include_usage": True, "continuous_usage_stats": True}

# reference name -> (path, body): the stream whose engine outputs the simulator plays back.
REFERENCES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", {"messages": CHAT}),
    "completions": ("/v1/completions", {"prompt": PROMPT}),
}

# case -> (reference, path, body). Chat, Responses and Messages render the same prompt.
CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "chat-stream": ("chat", "/v1/chat/completions", {"messages": CHAT, "stream": True}),
    "chat-stream-usage": (
        "chat",
        "/v1/chat/completions",
        {"messages": CHAT, "stream": True, "stream_options": {"include_usage": True}},
    ),
    "chat-stream-continuous-usage": (
        "chat",
        "/v1/chat/completions",
        {"messages": CHAT, "stream": True, "stream_options": _USAGE},
    ),
    "chat": ("chat", "/v1/chat/completions", {"messages": CHAT}),
    "completions": ("completions", "/v1/completions", {"prompt": PROMPT}),
    "completions-stream": ("completions", "/v1/completions", {"prompt": PROMPT, "stream": True}),
    "responses": ("chat", "/v1/responses", {"input": CHAT[0]["content"]}),
    "responses-stream": ("chat", "/v1/responses", {"input": CHAT[0]["content"], "stream": True}),
    "messages": ("chat", "/v1/messages", {"messages": CHAT}),
    "messages-stream": ("chat", "/v1/messages", {"messages": CHAT, "stream": True}),
    # vLLM refuses min_p while it speculates, unless the request is greedy (its min_p is reset
    # to 0 first): a real 0.32.0 answered the greedy one, which the simulator used to refuse.
    "min-p-error": (
        "chat",
        "/v1/chat/completions",
        {"messages": CHAT, "min_p": 0.1, "temperature": 0.7},
    ),
    "min-p-greedy": ("chat", "/v1/chat/completions", {"messages": CHAT, "min_p": 0.1}),
    # Errors: a validation 400 (`loc` dotted), an unknown model (the aliases named; Messages
    # with vLLM's internal type name).
    "bad-max-tokens": ("chat", "/v1/chat/completions", {"messages": CHAT, "max_tokens": "x"}),
    "unknown-model": ("chat", "/v1/chat/completions", {"messages": CHAT, "model": "nope"}),
    "messages-unknown-model": ("chat", "/v1/messages", {"messages": CHAT, "model": "nope"}),
}
ERRORS = {
    "min-p-error": 400,
    "bad-max-tokens": 400,
    "unknown-model": 404,
    "messages-unknown-model": 404,
}

# case -> (frames that differ, why). Frames: SSE events, or 1 for a JSON body.
ALLOWED: dict[str, tuple[int, str]] = {}

EMBED_DIM = 128  # the tiny target's width (scripts/vllm_models.py)

# Ids test_golden's normalisation does not know: Responses' reasoning items (`rs_…`).
_MORE_IDS = [(re.compile(rb"rs_[0-9a-f]{16}"), b"rs_<ID>")]


def _body(path: str, body: dict[str, Any]) -> dict[str, Any]:
    limit = "max_output_tokens" if path == "/v1/responses" else "max_tokens"
    return {"model": SERVED, limit: 48, **GREEDY, **body}


def _reference_body(path: str, body: dict[str, Any]) -> dict[str, Any]:
    return {**_body(path, body), "stream": True, "stream_options": _USAGE, "return_token_ids": True}


def _events(stream: bytes) -> list[dict[str, Any]]:
    return [json.loads(f[6:]) for f in stream.split(b"\n\n") if f.startswith(b"data: {")]


def playback(stream: bytes) -> Playback:
    """The engine outputs of a reference stream (`return_token_ids`, per-chunk usage)."""
    prompt: list[int] = []
    steps: list[list[Delta]] = []
    spec: SpecStats | None = None
    cached = 0
    for event in _events(stream):
        prompt = event.get("prompt_token_ids") or prompt
        for choice in event["choices"]:
            prompt = choice.get("prompt_token_ids") or prompt
            ids = choice.get("token_ids")
            if ids is None:
                continue  # the role chunk
            delta = choice.get("delta", {})
            text = choice.get("text", delta.get("content") or delta.get("reasoning") or "")
            steps.append(
                [
                    Delta(
                        choice["index"],
                        text,
                        list(ids),
                        choice["finish_reason"],
                        choice.get("stop_reason"),
                    )
                ]
            )
        summary = (event.get("metrics") or {}).get("speculative_decoding")
        if summary is not None:
            spec = SpecStats(summary["num_spec_tokens"])
            for accepted, count in enumerate(summary["acceptance_histogram"]):
                for _ in range(count):
                    spec.record(accepted)
        details = (event.get("usage") or {}).get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens") or cached
    return Playback(prompt, steps, cached_tokens=cached, spec=spec)


def frames(body: bytes, path: str, stream: bool) -> list[bytes]:
    kind = ("responses_" if path == "/v1/responses" else "") + ("sse" if stream else "json")
    for pattern, repl in _MORE_IDS:
        body = pattern.sub(repl, body)
    return normalise(body, kind)


def differences(real: bytes, sim: bytes, path: str, stream: bool) -> list[tuple[int, bytes, bytes]]:
    theirs, ours = frames(real, path, stream), frames(sim, path, stream)
    n = max(len(theirs), len(ours))
    pad = [b""] * n
    return [
        (i, a, b)
        for i, (a, b) in enumerate(zip((theirs + pad)[:n], (ours + pad)[:n], strict=True))
        if a != b
    ]


_VECTOR = re.compile(rb'"embedding":(\[[^\]]*\]|"[^"]*")')
_TOKENS = re.compile(rb'"(prompt_tokens|total_tokens)":\d+')


def embedding_frames(body: bytes) -> list[bytes]:
    """test_golden's normalisation, each vector as its length, the token counts masked."""

    def length(m: re.Match[bytes]) -> bytes:
        value = json.loads(m.group(1))
        n = len(value) if isinstance(value, list) else len(base64.b64decode(value)) // 4
        return b'"embedding":<%d values>' % n

    return normalise(_TOKENS.sub(rb'"\1":<N>', _VECTOR.sub(length, body)), "json")


def _config(embed: bool = False) -> SimConfig:
    """The real engines' flags (loadtests/harness/vllm.py), 4 draft tokens, 32,768 positions;
    `embed`: the embedding engine's."""
    if embed:
        return SimConfig(
            profile=replace(BUILTIN_PROFILES["embed"], max_model_len=32768),
            served_model_name=f"{SERVED}-embed",
            time_scale=0.0,
            embed_dim=EMBED_DIM,
            vllm_version="0.32.0",
            enable_prompt_tokens_details=True,
        )
    profile = replace(
        BUILTIN_PROFILES["mtp3"],
        num_spec_tokens=DRAFT_TOKENS,
        max_model_len=32768,
        speculative_config={"method": "draft_model", "num_speculative_tokens": DRAFT_TOKENS},
    )
    return SimConfig(
        profile=profile,
        served_model_name=SERVED,
        time_scale=0.0,
        enable_auto_tool_choice=True,
        tool_call_parser="qwen3_coder",
        reasoning_parser="qwen3",
        vllm_version="0.32.0",
        spec_metrics="summary",
        enable_prompt_tokens_details=True,
    )


async def _simulate(
    sim: Any, app: Any, script: Playback | None, path: str, body: dict[str, Any]
) -> bytes:
    sim.playback = script
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
        resp = await client.post(path, json=body, timeout=10)
    return resp.content


class Simulator:
    """One simulator for the module, its event loop kept between requests."""

    def __init__(self) -> None:
        self.runner = asyncio.Runner()
        self.app, self.sim = create_app(_config())
        self.embed_app, self.embed_sim = create_app(_config(embed=True))
        self.runner.run(self._start())

    async def _start(self) -> None:
        self.sim.engine.start()
        self.embed_sim.engine.start()

    def post(self, script: Playback, path: str, body: dict[str, Any]) -> bytes:
        return self.runner.run(_simulate(self.sim, self.app, script, path, body))

    def embed(self, body: dict[str, Any]) -> bytes:
        return self.runner.run(
            _simulate(self.embed_sim, self.embed_app, None, "/v1/embeddings", body)
        )

    def close(self) -> None:
        async def stop(*sims: Sim) -> None:
            for sim in sims:
                sim.abort_all()
                await sim.engine.stop()

        self.runner.run(stop(self.sim, self.embed_sim))
        self.runner.close()


@pytest.fixture(scope="module")
def simulator() -> Any:
    sim = Simulator()
    yield sim
    sim.close()


@pytest.mark.parametrize("case", list(CASES))
def test_the_simulator_answers_as_vllm_does(vllm: Engines, simulator: Simulator, case: str) -> None:
    ref_name, path, body = CASES[case]
    ref_path, ref_body = REFERENCES[ref_name]
    request, reference = _body(path, body), _reference_body(ref_path, ref_body)
    warm = vllm.draft.post(path, request)  # warm the prefix cache (as test_vllm_bytes.py)
    assert warm.status_code == ERRORS.get(case, 200), warm.text
    for _ in range(TRIES):
        script = playback(vllm.draft.post(ref_path, reference).content)
        real = vllm.draft.post(path, request)
        sim = simulator.post(script, path, request)
        diffs = differences(real.content, sim, path, bool(body.get("stream")))
        if len(diffs) == ALLOWED.get(case, (0, ""))[0]:
            break
    shown = "\n".join(f"[{i}]\n  vllm: {a!r}\n  sim:  {b!r}" for i, a, b in diffs[:4])
    if case not in ALLOWED:
        assert not diffs, f"{case}: {len(diffs)} frames differ from vLLM 0.32.0\n{shown}"
        return
    count, reason = ALLOWED[case]
    assert diffs, f"{case} now matches vLLM: drop it from ALLOWED ({reason})"
    assert len(diffs) == count, f"{case}: {len(diffs)} frames differ, {count} allowed\n{shown}"


@pytest.mark.parametrize("encoding", ["float", "base64"])
def test_the_simulator_embeds_as_vllm_does(
    vllm: Engines, simulator: Simulator, encoding: str
) -> None:
    body = {
        "model": f"{SERVED}-embed",
        "input": ["def f(x):", "return x"],
        "encoding_format": encoding,
    }
    real = vllm.embed.post("/v1/embeddings", body)
    assert real.status_code == 200, real.text
    assert embedding_frames(simulator.embed(body)) == embedding_frames(real.content)
