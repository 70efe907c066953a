"""The simulated vLLM server: a Starlette app in front of one Engine.

Handlers turn requests into EngineRequests and the engine's per-step output into vLLM's bytes.
Streams are written by `SSEResponse`, a small ASGI response that watches for `http.disconnect`
(a client that goes away aborts its sequences, as vLLM does) and can drop the connection without
a proper end (the `die_mid_stream` fault).
"""

from __future__ import annotations

import array
import asyncio
import base64
import hashlib
import random
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from . import protocol, wire
from .engine import Engine, EngineCore, EngineRequest, SamplingSpec
from .faults import FaultError, Faults
from .metrics import SimMetrics
from .profiles import Profile
from .protocol import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    RequestError,
    ResponsesRequest,
)
from .textgen import derive_seed, split_pieces, token_ids

Json = dict[str, Any]
TRANSPORT_KEY = "specrouter.transport"
# Tokenizing a long prompt takes milliseconds; beyond this size it runs in a worker thread so the
# engine loop keeps its step deadlines.
_THREAD_TOKENIZE_CHARS = 32_768


class SimulatedCrash(Exception):
    """Raised to make the ASGI server drop a connection when no transport is at hand."""


@dataclass(frozen=True, slots=True)
class SimConfig:
    profile: Profile
    served_model_name: str
    time_scale: float = 1.0
    seed: int = 0
    spec_metrics: str = "none"  # none | summary
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 8192
    faults: bool = False
    api_key: str | None = None
    embed_dim: int | None = None


@dataclass(slots=True)
class Stats:
    requests: int = 0  # generation/embedding requests received (errors included)
    completed: int = 0
    aborted: int = 0  # requests aborted because the client disconnected
    dropped: int = 0  # streams whose connection the die_mid_stream fault dropped
    errors: int = 0  # requests answered with an error status or event


# -- responses -----------------------------------------------------------------------------------


def json_response(body: Json, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


async def drop_connection(scope: Scope) -> None:
    """Close the TCP connection now, with no (further) response bytes: a crashed server."""
    transport = scope.get(TRANSPORT_KEY)
    if transport is None:
        raise SimulatedCrash("connection dropped by the die_mid_stream fault")
    transport.abort()
    # Let the server see the connection go before the app returns, so it does not complain that
    # the response was never completed.
    for _ in range(3):
        await asyncio.sleep(0)


class DropResponse(Response):
    """A 'response' that closes the connection without sending anything."""

    def __init__(self) -> None:
        super().__init__(status_code=500)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await drop_connection(scope)


FrameSource = AsyncIterator[list[bytes]]


class SSEResponse(Response):
    """Streams SSE frames; aborts the engine request when the client disconnects."""

    media_type = "text/event-stream"

    def __init__(
        self,
        frames: FrameSource,
        *,
        on_disconnect: Callable[[], None],
        on_drop: Callable[[], None],
        drop_after: Callable[[], int | None],
    ) -> None:
        self.frames = frames
        self.on_disconnect = on_disconnect
        self.on_drop = on_drop
        self.drop_after = drop_after
        self.status_code = 200
        self.background = None
        self.init_headers(None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.drop_after() == 0:
            self.on_drop()
            await drop_connection(scope)
            return
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})

        async def watch() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    self.on_disconnect()
                    return

        watcher = asyncio.get_running_loop().create_task(watch())
        sent = 0
        try:
            async for frames in self.frames:
                limit = self.drop_after()
                if limit is not None and sent + len(frames) > limit:
                    # The engine "dies" mid-stream: what was sent stays sent, then the socket goes.
                    head = frames[: max(0, limit - sent)]
                    if head:
                        await send(
                            {
                                "type": "http.response.body",
                                "body": b"".join(head),
                                "more_body": True,
                            }
                        )
                    self.on_drop()
                    await drop_connection(scope)
                    return
                await send(
                    {"type": "http.response.body", "body": b"".join(frames), "more_body": True}
                )
                sent += len(frames)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watcher.cancel()
            aclose = getattr(self.frames, "aclose", None)
            if aclose is not None:
                await aclose()


# -- the application -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Result:
    """One finished choice of a non-streaming request."""

    text: str
    token_ids: list[int]
    finish_reason: str
    stop_reason: str | None


@dataclass(slots=True)
class _Prepared:
    """A validated generation request, ready to submit."""

    engine_req: EngineRequest
    request_id: str
    prompt_tokens: int
    prompt_ids: list[int]
    stream: bool
    include_usage: bool
    continuous_usage: bool
    return_token_ids: bool
    spec_conflict: bool


class Sim:
    """State of one simulated server: engine, metrics, faults, counters."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        profile = config.profile
        self.profile = profile
        self.model = config.served_model_name
        self.embed_dim = config.embed_dim or profile.embed_dim
        self.metrics = SimMetrics(self.model, profile.max_model_len, profile.num_spec_tokens)
        self.core = EngineCore(
            profile,
            self.metrics,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
        )
        self.engine = Engine(self.core, time_scale=config.time_scale)
        self.faults = Faults(self.engine, time_scale=config.time_scale)
        self.stats = Stats()
        self.created = int(time.time())
        self.perm_id = f"modelperm-{secrets.token_hex(8)}"
        spec = orjson.dumps(profile.speculative_config, option=orjson.OPT_SORT_KEYS)
        digest = hashlib.blake2b(profile.name.encode() + spec, digest_size=4).hexdigest()
        self.fingerprint = f"vllm-{wire.VLLM_VERSION}-{digest}"
        self._live: set[EngineRequest] = set()

    # -- lifecycle ---------------------------------------------------------------------------

    def abort_all(self) -> None:
        """Shutdown: end every stream now instead of waiting for it."""
        for req in list(self._live):
            self.engine.abort(req)

    # -- shared checks -----------------------------------------------------------------------

    def gate(self, *, generation: bool = True) -> Response | None:
        """Faults that answer a /v1 request before it is even parsed. Only cold_start refuses
        /v1/models; http_500/http_503 (and their counts) apply to inference requests."""
        if not self.config.faults:
            return None
        status = self.faults.reject_status() if generation else self.faults.starting_status()
        if status is None:
            return None
        self.stats.errors += 1
        if status == 500:
            body = wire.error_body(
                "EngineCore encountered an issue. See stack trace (above) for the root cause.",
                "InternalServerError",
                500,
            )
        else:
            body = wire.error_body("Service Unavailable", "Service Unavailable", 503)
        return json_response(body, status)

    def drop_after(self) -> int | None:
        return self.faults.drop_after() if self.config.faults else None

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model:
            raise protocol.not_found_model(model)

    def request_id(self, request: Request, body_id: str | None, prefix: str) -> str:
        rid = request.headers.get("x-request-id") or body_id or secrets.token_hex(8)
        return f"{prefix}-{rid}"

    async def tokenize(self, text: str) -> tuple[list[int], list[int]]:
        if len(text) > _THREAD_TOKENIZE_CHARS:
            return await asyncio.to_thread(self._tokenize, text)
        return self._tokenize(text)

    def _tokenize(self, text: str) -> tuple[list[int], list[int]]:
        return self.block_hashes(token_ids(split_pieces(text)))

    def block_hashes(self, ids: list[int]) -> tuple[list[int], list[int]]:
        bs = self.profile.block_size
        hashes: list[int] = []
        h = 0
        for i in range(0, len(ids) - bs + 1, bs):
            h = hash((h, tuple(ids[i : i + bs])))
            hashes.append(h)
        return ids, hashes

    def new_request(
        self,
        request_id: str,
        *,
        prompt_key: object,
        prompt_ids: list[int],
        hashes: list[int],
        sampling: SamplingSpec,
        n: int,
        seed: int | None,
    ) -> EngineRequest:
        # Same seed (or none, with the same server --seed) and same prompt: same text.
        key = (
            derive_seed("request", seed, prompt_key)
            if seed is not None
            else derive_seed("server", self.config.seed, prompt_key)
        )
        return EngineRequest(
            request_id,
            prompt_len=len(prompt_ids),
            block_hashes=hashes,
            sampling=sampling,
            n=n,
            key=key,
            arrival=asyncio.get_running_loop().time(),
        )

    def submit(self, req: EngineRequest) -> None:
        self._live.add(req)
        self.engine.submit(req)

    def finished(self, req: EngineRequest) -> None:
        self._live.discard(req)
        if not req.aborted:
            self.stats.completed += 1

    def client_gone(self, req: EngineRequest) -> None:
        if not req.done:
            self.stats.aborted += 1
            self.engine.abort(req)
        self._live.discard(req)

    def dropped(self, req: EngineRequest) -> None:
        if not req.done:
            self.engine.abort(req)
        self.stats.dropped += 1
        self._live.discard(req)

    def spec_metrics(self, req: EngineRequest, *, full: bool) -> Json | None:
        if self.config.spec_metrics == "none" or req.n != 1 or not req.sequences:
            return None
        return wire.per_request_metrics(req.sequences[0].spec, full=full)

    async def collect(self, req: EngineRequest, receive: Receive) -> list[Result] | None:
        """Wait for a non-streaming request to finish; None if the client went away."""

        async def watch() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    self.client_gone(req)
                    return

        watcher = asyncio.get_running_loop().create_task(watch())
        texts: list[list[str]] = [[] for _ in range(req.n)]
        ids: list[list[int]] = [[] for _ in range(req.n)]
        finish: list[str] = ["stop"] * req.n
        stop: list[str | None] = [None] * req.n
        try:
            while deltas := await req.take():
                for d in deltas:
                    texts[d.index].append(d.text)
                    ids[d.index].extend(d.token_ids)
                    if d.finish_reason is not None:
                        finish[d.index] = d.finish_reason
                        stop[d.index] = d.stop_reason
        finally:
            watcher.cancel()
        self.finished(req)
        if req.aborted:
            return None
        return [Result("".join(texts[i]), ids[i], finish[i], stop[i]) for i in range(req.n)]

    # -- generation request preparation ------------------------------------------------------

    async def prepare(
        self,
        request: Request,
        req: ChatRequest | CompletionRequest,
        prefix: str,
        prompt_text: str | None,
        prompt_ids_in: list[int] | None,
    ) -> _Prepared:
        if prompt_text is not None:
            prompt_ids, hashes = await self.tokenize(prompt_text)
            prompt_key: object = prompt_text
        else:
            assert prompt_ids_in is not None
            prompt_ids, hashes = self.block_hashes(prompt_ids_in)
            prompt_key = tuple(prompt_ids_in)
        max_tokens = protocol.resolve_max_tokens(
            req.requested_max_tokens(), len(prompt_ids), self.profile.max_model_len
        )
        n = 1 if req.n is None else req.n
        # No temperature: the checkpoint's generation config default (1.0), as vLLM applies it.
        temperature = 1.0 if req.temperature is None else req.temperature
        protocol.check_sampling(n, temperature, req.top_p, max_tokens)
        sampling = SamplingSpec(
            max_tokens=max_tokens,
            min_tokens=req.min_tokens,
            stop=req.stop_list(),
            include_stop_str=req.include_stop_str_in_output,
            ignore_eos=req.ignore_eos,
            temperature=temperature,
        )
        request_id = self.request_id(request, req.request_id, prefix)
        engine_req = self.new_request(
            request_id,
            prompt_key=prompt_key,
            prompt_ids=prompt_ids,
            hashes=hashes,
            sampling=sampling,
            n=n,
            seed=req.seed,
        )
        opts = req.stream_options
        include_usage = bool(req.stream and opts and opts.include_usage)
        return _Prepared(
            engine_req=engine_req,
            request_id=request_id,
            prompt_tokens=len(prompt_ids),
            prompt_ids=prompt_ids,
            stream=bool(req.stream),
            include_usage=include_usage,
            continuous_usage=include_usage and bool(opts and opts.continuous_usage_stats),
            return_token_ids=bool(req.return_token_ids),
            spec_conflict=self.profile.num_spec_tokens > 0 and protocol.spec_decode_conflict(req),
        )

    def spec_conflict_response(self, p: _Prepared) -> Response:
        """min_p/logit_bias with speculation: vLLM validates in the engine client's generator,
        so a stream has already started (200) and gets an error event; a plain request a 400."""
        self.stats.errors += 1
        if not p.stream:
            return json_response(
                wire.error_body(protocol.SPEC_UNSUPPORTED, "BadRequestError", 400), 400
            )

        async def frames() -> FrameSource:
            yield [
                wire.streaming_error_frame(protocol.SPEC_UNSUPPORTED, "BadRequestError", 400),
                wire.DONE,
            ]

        return SSEResponse(
            frames(), on_disconnect=lambda: None, on_drop=lambda: None, drop_after=self.drop_after
        )

    def stream_response(self, req: EngineRequest, frames: FrameSource) -> SSEResponse:
        return SSEResponse(
            frames,
            on_disconnect=lambda: self.client_gone(req),
            on_drop=lambda: self.dropped(req),
            drop_after=self.drop_after,
        )


def _route(
    handler: Callable[[Sim, Request], Awaitable[Response]], sim: Sim
) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        return await handler(sim, request)

    return endpoint


# -- /v1/chat/completions ------------------------------------------------------------------------


async def _generate(
    sim: Sim,
    request: Request,
    prepare: Callable[[], Awaitable[_Prepared]],
    stream: Callable[[_Prepared, int], FrameSource],
    answer: Callable[[_Prepared, int, list[Result]], dict[str, Any]],
) -> Response:
    """What chat and completions share: gate, validate, submit, then stream or collect."""
    sim.stats.requests += 1
    gated = sim.gate()
    if gated is not None:
        return gated
    try:
        p = await prepare()
    except RequestError as err:
        sim.stats.errors += 1
        return json_response(err.body, err.status)
    if sim.drop_after() is not None and not p.stream:
        return DropResponse()
    if p.spec_conflict:
        return sim.spec_conflict_response(p)
    created = int(time.time())
    sim.submit(p.engine_req)
    if p.stream:
        return sim.stream_response(p.engine_req, stream(p, created))
    results = await sim.collect(p.engine_req, request.receive)
    if results is None:
        return Response(status_code=499)
    if sim.drop_after() is not None:
        return DropResponse()
    return json_response(answer(p, created, results))


async def chat_completions(sim: Sim, request: Request) -> Response:
    async def prepare() -> _Prepared:
        req = protocol.parse(ChatRequest, await request.body())
        sim.check_model(req.model)
        return await sim.prepare(
            request, req, "chatcmpl", protocol.render_chat(req.messages, req.tools), None
        )

    def stream(p: _Prepared, created: int) -> FrameSource:
        chunks = wire.ChatChunks(
            request_id=p.request_id,
            created=created,
            model=sim.model,
            include_usage=p.include_usage,
            continuous_usage=p.continuous_usage,
            fingerprint=sim.fingerprint,
            prompt_tokens=p.prompt_tokens,
            prompt_token_ids=p.prompt_ids,
            return_token_ids=p.return_token_ids,
        )
        return _frames(sim, p, chunks.role, chunks.content, chunks.usage_chunk)

    def answer(p: _Prepared, created: int, results: list[Result]) -> dict[str, Any]:
        choices = [
            (r.text, r.finish_reason, r.stop_reason, r.token_ids if p.return_token_ids else None)
            for r in results
        ]
        return wire.chat_response(
            request_id=p.request_id,
            created=created,
            model=sim.model,
            choices=choices,
            prompt_tokens=p.prompt_tokens,
            completion_tokens=sum(len(r.token_ids) for r in results),
            fingerprint=sim.fingerprint,
            prompt_token_ids=p.prompt_ids if p.return_token_ids else None,
            metrics=sim.spec_metrics(p.engine_req, full=True),
        )

    return await _generate(sim, request, prepare, stream, answer)


async def _frames(
    sim: Sim,
    p: _Prepared,
    role: Callable[[int], bytes] | None,
    content: Callable[..., bytes],
    usage_chunk: Callable[[int, dict[str, Any] | None], bytes],
) -> FrameSource:
    """A chat (with `role`) or completions stream: one list of frames per engine output.

    vLLM sends every choice's role chunk with the first engine output; completions repeat the
    prompt's token ids once per choice, on its first chunk, when asked for them.
    """
    req = p.engine_req
    completion = [0] * req.n
    sent_prompt = [False] * req.n
    first = True
    while True:
        deltas = await req.take()
        if not deltas:
            break
        out: list[bytes] = []
        if first and role is not None:
            out.extend(role(i) for i in range(req.n))
        first = False
        for d in deltas:
            completion[d.index] += len(d.token_ids)
            args = [d.index, d.text, d.token_ids, completion[d.index], d.finish_reason,
                    d.stop_reason]
            if role is None:  # completions
                prompt_ids = None
                if p.return_token_ids and not sent_prompt[d.index]:
                    prompt_ids = p.prompt_ids
                    sent_prompt[d.index] = True
                args.append(prompt_ids)
            out.append(content(*args))
        yield out
    sim.finished(req)
    if req.aborted:
        return
    tail: list[bytes] = []
    if p.include_usage:
        tail.append(usage_chunk(sum(completion), sim.spec_metrics(req, full=False)))
    tail.append(wire.DONE)
    yield tail


# -- /v1/completions -----------------------------------------------------------------------------


async def completions(sim: Sim, request: Request) -> Response:
    async def prepare() -> _Prepared:
        req = protocol.parse(CompletionRequest, await request.body())
        sim.check_model(req.model)
        prompt = req.prompt
        text: str | None = None
        ids: list[int] | None = None
        if isinstance(prompt, str):
            text = prompt
        elif prompt and all(isinstance(x, int) for x in prompt):
            ids = [int(x) for x in prompt]  # type: ignore[arg-type]
        elif len(prompt) == 1:
            only = prompt[0]
            text, ids = (only, None) if isinstance(only, str) else (None, list(only))  # type: ignore[arg-type]
        else:
            raise protocol.bad_request("The simulator serves one prompt per request.", "prompt")
        return await sim.prepare(request, req, "cmpl", text, ids)

    def stream(p: _Prepared, created: int) -> FrameSource:
        chunks = wire.CompletionChunks(
            request_id=p.request_id,
            created=created,
            model=sim.model,
            include_usage=p.include_usage,
            continuous_usage=p.continuous_usage,
            fingerprint=sim.fingerprint,
            prompt_tokens=p.prompt_tokens,
            return_token_ids=p.return_token_ids,
        )
        return _frames(sim, p, None, chunks.content, chunks.usage_chunk)

    def answer(p: _Prepared, created: int, results: list[Result]) -> dict[str, Any]:
        choices: list[tuple[str, str, str | None, list[int] | None, list[int] | None]] = [
            (r.text, r.finish_reason, r.stop_reason, r.token_ids, p.prompt_ids)
            if p.return_token_ids
            else (r.text, r.finish_reason, r.stop_reason, None, None)
            for r in results
        ]
        return wire.completion_response(
            request_id=p.request_id,
            created=created,
            model=sim.model,
            choices=choices,
            prompt_tokens=p.prompt_tokens,
            completion_tokens=sum(len(r.token_ids) for r in results),
            fingerprint=sim.fingerprint,
            metrics=sim.spec_metrics(p.engine_req, full=True),
        )

    return await _generate(sim, request, prepare, stream, answer)


# -- /v1/responses -------------------------------------------------------------------------------


async def responses(sim: Sim, request: Request) -> Response:
    sim.stats.requests += 1
    gated = sim.gate()
    if gated is not None:
        return gated
    try:
        req = protocol.parse(ResponsesRequest, await request.body())
        sim.check_model(req.model)
        messages = protocol.render_responses_input(req)
        prompt_ids, hashes = await sim.tokenize(protocol.render_chat(messages, None))
        max_tokens = protocol.resolve_max_tokens(
            req.max_output_tokens, len(prompt_ids), sim.profile.max_model_len
        )
        temperature = 1.0 if req.temperature is None else req.temperature
        protocol.check_sampling(1, temperature, req.top_p, max_tokens)
    except RequestError as err:
        sim.stats.errors += 1
        return json_response(err.body, err.status)
    if sim.drop_after() is not None and not req.stream:
        return DropResponse()
    rid = request.headers.get("x-request-id") or secrets.token_hex(8)
    ereq = sim.new_request(
        f"resp_{rid}",
        prompt_key=("responses", [m.model_dump() for m in messages]).__repr__(),
        prompt_ids=prompt_ids,
        hashes=hashes,
        sampling=SamplingSpec(max_tokens=max_tokens, temperature=temperature),
        n=1,
        seed=req.seed,
    )
    events = wire.ResponsesEvents(
        response_id=f"resp_{rid}",
        item_id=f"msg_{secrets.token_hex(8)}",
        created=int(time.time()),
        model=sim.model,
        temperature=temperature,
        max_output_tokens=req.max_output_tokens,
        instructions=req.instructions,
    )
    sim.submit(ereq)
    if req.stream:
        return sim.stream_response(ereq, _responses_frames(sim, ereq, events))
    results = await sim.collect(ereq, request.receive)
    if results is None:
        return Response(status_code=499)
    if sim.drop_after() is not None:
        return DropResponse()
    (result,) = results
    text = result.text
    usage = events.usage(len(prompt_ids), len(result.token_ids), ereq.cached_tokens)
    incomplete = result.finish_reason == "length"
    body = events.response(
        "incomplete" if incomplete else "completed",
        [events.message(text, "incomplete" if incomplete else "completed")],
        usage,
        incomplete=incomplete,
    )
    return json_response(body)


async def _responses_frames(sim: Sim, req: EngineRequest, ev: wire.ResponsesEvents) -> FrameSource:
    in_progress = ev.response("in_progress", [], None)
    yield [
        ev.event("response.created", {"response": in_progress}),
        ev.event("response.in_progress", {"response": in_progress}),
    ]
    first = True
    parts: list[str] = []
    ntok = 0
    finish = "stop"
    while True:
        deltas = await req.take()
        if not deltas:
            break
        out: list[bytes] = []
        if first:
            out.append(
                ev.event(
                    "response.output_item.added",
                    {"item": ev.message(None, "in_progress"), "output_index": 0},
                )
            )
            out.append(
                ev.event(
                    "response.content_part.added",
                    {
                        "content_index": 0,
                        "item_id": ev.item_id,
                        "output_index": 0,
                        "part": ev.part(""),
                    },
                )
            )
            first = False
        for d in deltas:
            ntok += len(d.token_ids)
            finish = d.finish_reason or finish
            if d.text:
                parts.append(d.text)
                out.append(ev.text_delta(d.text))
        if out:
            yield out
    sim.finished(req)
    if req.aborted:
        return
    text = "".join(parts)
    status = "incomplete" if finish == "length" else "completed"
    item = ev.message(text, status)
    usage = ev.usage(req.prompt_len, ntok, req.cached_tokens)
    yield [
        ev.event(
            "response.output_text.done",
            {
                "content_index": 0,
                "item_id": ev.item_id,
                "logprobs": [],
                "output_index": 0,
                "text": text,
            },
        ),
        ev.event(
            "response.content_part.done",
            {"content_index": 0, "item_id": ev.item_id, "output_index": 0, "part": ev.part(text)},
        ),
        ev.event("response.output_item.done", {"item": item, "output_index": 0}),
        ev.event(
            # vLLM ends every stream with response.completed; a truncated answer shows as
            # status "incomplete" inside it.
            "response.completed",
            {"response": ev.response(status, [item], usage, incomplete=status == "incomplete")},
        ),
    ]


# -- /v1/embeddings ------------------------------------------------------------------------------


def _embed(seed_parts: object, dim: int, out_dim: int) -> array.array[float]:
    """A unit vector drawn from a hash of the input; truncated first (Matryoshka-style)."""
    rng = random.Random(derive_seed("embed", dim, seed_parts))
    vec = [rng.gauss(0.0, 1.0) for _ in range(dim)][:out_dim]
    norm = sum(x * x for x in vec) ** 0.5 or 1.0
    return array.array("f", [x / norm for x in vec])


def _embed_all(
    inputs: list[str | list[int]], dim: int, out_dim: int, fmt: str
) -> list[list[float] | str]:
    data: list[list[float] | str] = []
    for x in inputs:
        vec = _embed(x if isinstance(x, str) else tuple(x), dim, out_dim)
        data.append(base64.b64encode(vec.tobytes()).decode() if fmt == "base64" else vec.tolist())
    return data


async def embeddings(sim: Sim, request: Request) -> Response:
    sim.stats.requests += 1
    gated = sim.gate()
    if gated is not None:
        return gated
    try:
        req = protocol.parse(EmbeddingRequest, await request.body())
        sim.check_model(req.model)
        raw = req.input
        inputs: list[str | list[int]]
        if isinstance(raw, str):
            inputs = [raw]
        elif raw and all(isinstance(x, int) for x in raw):
            inputs = [[int(x) for x in raw]]  # type: ignore[arg-type]
        else:
            inputs = [x if isinstance(x, str) else [int(t) for t in x] for x in raw]  # type: ignore[union-attr]
        if not inputs:
            raise protocol.bad_request("Input must not be empty.", "input")
        dim = sim.embed_dim
        out_dim = dim if req.dimensions is None else req.dimensions
        if not 1 <= out_dim <= dim:
            raise protocol.bad_request(
                f"dimensions must be between 1 and {dim}, got {out_dim}.", "dimensions"
            )
        if req.encoding_format not in ("float", "base64"):
            raise protocol.bad_request(
                f"encoding_format {req.encoding_format!r} is not supported by the simulator.",
                "encoding_format",
            )
        # The embedding model appends an end-of-text token to every input.
        counts = [(len(split_pieces(x)) if isinstance(x, str) else len(x)) + 1 for x in inputs]
        for c in counts:
            if c > sim.profile.max_model_len:
                raise protocol.bad_request(
                    f"This model's maximum context length is {sim.profile.max_model_len} tokens. "
                    f"However, your request has {c} input tokens. Please reduce the length of the "
                    "input messages.",
                    "input_tokens",
                )
    except RequestError as err:
        sim.stats.errors += 1
        return json_response(err.body, err.status)
    if sim.drop_after() is not None:
        return DropResponse()
    await sim.engine.wait_unpaused()  # the `hang` fault holds embeddings too
    total = sum(counts)
    delay = (
        sim.profile.step_seconds(1) + total / sim.profile.embed_tokens_per_s
    ) * sim.config.time_scale
    await asyncio.sleep(delay)
    fmt = req.encoding_format
    if len(inputs) > 8:  # ~0.3 ms per vector: a big batch goes to a thread, not the loop
        data = await asyncio.to_thread(_embed_all, inputs, dim, out_dim, fmt)
    else:
        data = _embed_all(inputs, dim, out_dim, fmt)
    sim.stats.completed += 1
    sim.metrics.prompt_tokens.inc(total)
    body = wire.embedding_response(
        request_id=f"embd-{secrets.token_hex(8)}",
        created=int(time.time()),
        model=sim.model,
        data=data,
        prompt_tokens=total,
    )
    return json_response(body)


# -- small endpoints -----------------------------------------------------------------------------


async def health(sim: Sim, request: Request) -> Response:
    ok = not sim.engine.dead and (not sim.config.faults or sim.faults.health_ok())
    return Response(status_code=200 if ok else 503)


async def version(sim: Sim, request: Request) -> Response:
    c = sim.config
    return json_response(
        {
            "version": wire.VLLM_VERSION,
            "specrouter_sim": {
                "profile": sim.profile.name,
                "time_scale": c.time_scale,
                "seed": c.seed,
                "speculative_config": sim.profile.speculative_config,
                "served_model_name": sim.model,
                "max_num_seqs": c.max_num_seqs,
                "num_spec_tokens": sim.profile.num_spec_tokens,
                "per_request_spec_decode_metrics": c.spec_metrics,
            },
        }
    )


async def models(sim: Sim, request: Request) -> Response:
    gated = sim.gate(generation=False)
    if gated is not None:
        return gated
    return json_response(
        wire.model_list(
            model=sim.model,
            root=sim.profile.model_path,
            max_model_len=sim.profile.max_model_len,
            created=sim.created,
            perm_id=sim.perm_id,
        )
    )


async def metrics(sim: Sim, request: Request) -> Response:
    body, content_type = sim.metrics.exposition(request.headers.get("accept", ""))
    return Response(body, headers={"content-type": content_type})


async def load(sim: Sim, request: Request) -> Response:
    return json_response({"server_load": 0})


async def sim_stats(sim: Sim, request: Request) -> Response:
    s = sim.stats
    return json_response(
        {
            "requests": s.requests,
            "completed": s.completed,
            "aborted": s.aborted,
            "dropped": s.dropped,
            "errors": s.errors,
            "running": len(sim.core.running),
            "waiting": len(sim.core.waiting),
            "active_faults": sim.faults.active(),
            "steps": sim.core.steps,
            "profile": sim.profile.name,
            "time_scale": sim.config.time_scale,
        }
    )


async def sim_faults(sim: Sim, request: Request) -> Response:
    if request.method == "DELETE":
        sim.faults.clear()
    elif request.method == "POST":
        try:
            data = orjson.loads(await request.body())
            if not isinstance(data, dict) or not isinstance(data.get("mode"), str):
                raise FaultError('body must be {"mode": MODE, ...params}')
            mode = data.pop("mode")
            sim.faults.set(mode, data)
        except (FaultError, orjson.JSONDecodeError) as err:
            return json_response(wire.error_body(str(err), "BadRequestError", 400), 400)
    return json_response({"active_faults": sim.faults.active()})


# -- app assembly --------------------------------------------------------------------------------


class _Edge:
    """Outermost ASGI layer: remembers the connection's transport (simulated crashes close it)
    and checks the API key like vLLM's middleware (only /v1, /v2, /inference, /cohere paths)."""

    def __init__(self, app: ASGIApp, api_key: str | None) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode() if api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            # uvicorn's `send` is a bound method of the request cycle, which holds the transport.
            transport = getattr(getattr(send, "__self__", None), "transport", None)
            if transport is not None:
                scope[TRANSPORT_KEY] = transport
            if (
                self.expected is not None
                and scope["method"] != "OPTIONS"
                and scope["path"].startswith(("/v1", "/v2", "/inference", "/cohere"))
                and dict(scope["headers"]).get(b"authorization") != self.expected
            ):
                await json_response({"error": "Unauthorized"}, 401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    from http import HTTPStatus

    phrase = HTTPStatus(exc.status_code).phrase
    return json_response(wire.error_body(str(exc.detail), phrase, exc.status_code), exc.status_code)


def create_app(config: SimConfig) -> tuple[ASGIApp, Sim]:
    sim = Sim(config)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        sim.engine.start()
        try:
            yield
        finally:
            sim.abort_all()
            await sim.engine.stop()

    def r(
        path: str, handler: Callable[[Sim, Request], Awaitable[Response]], methods: list[str]
    ) -> Route:
        return Route(path, _route(handler, sim), methods=methods)

    routes = [
        r("/health", health, ["GET"]),
        r("/ping", health, ["GET", "POST"]),
        r("/version", version, ["GET"]),
        r("/metrics", metrics, ["GET"]),
        r("/load", load, ["GET"]),
        r("/v1/models", models, ["GET"]),
    ]
    if config.profile.kind == "embed":
        routes.append(r("/v1/embeddings", embeddings, ["POST"]))
    else:
        routes += [
            r("/v1/chat/completions", chat_completions, ["POST"]),
            r("/v1/completions", completions, ["POST"]),
            r("/v1/responses", responses, ["POST"]),
        ]
    if config.faults:
        routes += [
            r("/_sim/faults", sim_faults, ["GET", "POST", "DELETE"]),
            r("/_sim/stats", sim_stats, ["GET"]),
        ]
    app = Starlette(
        routes=routes, lifespan=lifespan, exception_handlers={HTTPException: _http_error}
    )
    return _Edge(app, config.api_key), sim
