"""State of one simulated server: configuration, engine, metrics, faults, counters, and the
steps every generation request shares (gate, tokenize, prepare, submit, collect)."""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive

from proxy import vllm_wire
from proxy.ops.deploy.versions import PER_REQUEST_SPEC_FLAG
from proxy.vllm_wire import Json

from . import dialect, protocol, wire
from .asgi import FrameSource, SSEResponse, json_response
from .device import Device
from .engine import Engine, EngineCore, EngineRequest, SamplingSpec
from .faults import Faults
from .kv_publisher import KvPublisher
from .metrics import SimMetrics
from .playback import Playback
from .prefix_cache import chain
from .profiles import Profile
from .protocol import ChatRequest, CompletionRequest
from .sequences import Script
from .textgen import derive_seed, split_pieces, token_ids

# Tokenizing a long prompt takes milliseconds; beyond this size it runs in a worker thread so the
# engine loop keeps its step deadlines.
_THREAD_TOKENIZE_CHARS = 32_768
FINISHED_SPEC_KEEP = 1024  # finished requests whose counters /_sim/requests keeps
# The session id the request being handled gives its KV blocks, read as the release reads it
# (server.py sets it per request when the events are published or --faults shows them).
SESSION: contextvars.ContextVar[str | None] = contextvars.ContextVar("session", default=None)


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
    # vLLM's --enable-auto-tool-choice, --tool-call-parser (qwen3_coder | hermes), --reasoning-parser
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    sse_keep_alive_s: float | None = None  # vLLM 0.29's --sse-keep-alive-interval
    vllm_version: str = dialect.DEFAULT
    engine_kind: str = "vllm"  # vllm | sglang: whose chat/completions bytes and /metrics it speaks
    enable_prompt_tokens_details: bool = False
    stream_interval: int = 1  # vLLM's --stream-interval: tokens per chunk (finish: fewer)
    # A model of output merging (Sim.frontend_delay), not a measurement: vLLM's API server is one
    # process that writes every stream's chunks, so it costs this many ms per chunk and open
    # stream; while it lags, engine outputs queue in the collector and merge. 0 turns it off.
    frontend_chunk_ms: float = 0.0
    # The GPU this engine shares with others in the process (device.py), its KV tokens (None:
    # the profile's, the documents' 36 GiB; `specrouter sim` always sets it: colocate.py).
    device: Device | None = None
    kv_cache_tokens: int | None = None
    scheduling_policy: str = "fcfs"  # vLLM's --scheduling-policy (fcfs | priority)
    # vLLM's --kv-events-config (endpoint, replay_endpoint, topic): KV events published
    kv_events: dict[str, Any] | None = None


@dataclass(slots=True)
class Stats:
    requests: int = 0  # generation/embedding requests received (errors included)
    completed: int = 0
    aborted: int = 0  # requests aborted because the client disconnected
    dropped: int = 0  # streams whose connection the die_mid_stream fault dropped
    errors: int = 0  # requests answered with an error status or event


@dataclass(frozen=True, slots=True)
class Result:
    """One finished choice of a non-streaming request."""

    text: str
    token_ids: list[int]
    finish_reason: str
    stop_reason: str | None


@dataclass(slots=True)
class Prepared:
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
        self.metrics = SimMetrics(
            self.model,
            profile.max_model_len,
            profile.num_spec_tokens,
            vllm_version=config.vllm_version,
            block_size=profile.block_size,
        )
        self.core = EngineCore(
            profile,
            self.metrics,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            device=config.device,
            kv_cache_tokens=config.kv_cache_tokens,
            scheduling_policy=config.scheduling_policy,
        )
        self.engine = Engine(self.core, time_scale=config.time_scale)
        self.kv: KvPublisher | None = None
        if config.kv_events is not None and config.kv_events.get("enable_kv_cache_events"):
            ev = config.kv_events
            self.kv = KvPublisher(
                ev["endpoint"],
                ev.get("replay_endpoint"),
                topic=ev.get("topic", ""),
                block_size=profile.block_size,
                session=vllm_wire.tags_sessions(config.vllm_version),
            )
            self.core.cache.listener = self.kv
        self.faults = Faults(self.engine, time_scale=config.time_scale)
        self.stats = Stats()
        self.created = int(time.time())
        self.perm_id = f"modelperm-{secrets.token_hex(8)}"
        spec = orjson.dumps(profile.speculative_config, option=orjson.OPT_SORT_KEYS)
        digest = hashlib.blake2b(profile.name.encode() + spec, digest_size=4).hexdigest()
        self.dialect = dialect.dialect(config.vllm_version)
        self.fingerprint = f"vllm-{config.vllm_version}-{digest}"
        self._live: set[EngineRequest] = set()
        # Test-only truth (`/_sim/requests`, with --faults): the last finished requests' own
        # speculative counters by request id, for benchmarks that check the gateway's estimate.
        self.finished_spec: OrderedDict[str, Json] = OrderedDict()
        self.playback: Playback | None = None  # recorded engine outputs (golden tests only)
        # Test-only truth (`/_sim/traceparents`, with --faults): the W3C `traceparent` each
        # recent request came with, by its `x-request-id` (vLLM parents its spans to it).
        self.traceparents: OrderedDict[str, str] = OrderedDict()
        # Test-only truth (`/_sim/priorities`, with --faults): the `priority` field each recent
        # chat or completion request came with (None: not sent), in arrival order.
        self.priorities: OrderedDict[str, int | None] = OrderedDict()
        # Test-only truth (`/_sim/sessions`, with --faults): the session id each recent
        # generation request's KV blocks would be tagged with, read as the release reads it
        # (proxy/vllm_wire.py `engine_session`; None: untagged), by its `x-request-id`.
        self.sessions: OrderedDict[str, str | None] = OrderedDict()

    def saw_priority(self, request_id: str, priority: int | None) -> None:
        self.priorities[request_id] = priority
        while len(self.priorities) > FINISHED_SPEC_KEEP:
            self.priorities.popitem(last=False)

    def saw_session(self, request_id: str, session: str | None) -> None:
        self.sessions[request_id] = session
        while len(self.sessions) > FINISHED_SPEC_KEEP:
            self.sessions.popitem(last=False)

    def saw_traceparent(self, request_id: str, traceparent: str) -> None:
        self.traceparents[request_id] = traceparent
        while len(self.traceparents) > FINISHED_SPEC_KEEP:
            self.traceparents.popitem(last=False)

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
            body = vllm_wire.error_body(
                "EngineCore encountered an issue. See stack trace (above) for the root cause.",
                "InternalServerError",
                500,
            )
        else:
            body = vllm_wire.error_body("Service Unavailable", "Service Unavailable", 503)
        return json_response(body, status)

    def drop_after(self) -> int | None:
        return self.faults.drop_after() if self.config.faults else None

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model:
            raise protocol.not_found_model(
                model, self.model if self.dialect.model_aliases else None
            )

    def parse(self, model: type[protocol.M], body: bytes) -> protocol.M:
        return protocol.parse(model, body, dotted_loc=self.dialect.dotted_loc)

    def request_id(self, request: Request, body_id: str | None, prefix: str) -> str:
        rid = request.headers.get("x-request-id") or body_id or secrets.token_hex(8)
        return f"{prefix}-{rid}"

    async def tokenize(self, text: str) -> tuple[list[int], list[int]]:
        if len(text) > _THREAD_TOKENIZE_CHARS:
            return await asyncio.to_thread(self._tokenize, text)
        return self._tokenize(text)

    def _tokenize(self, text: str) -> tuple[list[int], list[int]]:
        if self.playback is not None:
            return self.block_hashes(list(self.playback.prompt_token_ids))
        return self.block_hashes(token_ids(split_pieces(text)))

    def block_hashes(self, ids: list[int]) -> tuple[list[int], list[int]]:
        return ids, chain(ids, self.profile.block_size)

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
        script: Script | None = None,
        priority: int = 0,
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
            script=script,
            tail_ids=prompt_ids[len(hashes) * self.profile.block_size :],
            priority=priority,
            session=SESSION.get(),
        )

    def submit(self, req: EngineRequest) -> None:
        self._live.add(req)
        if self.playback is not None:
            self.playback.play(req)
        else:
            self.engine.submit(req)

    def finished(self, req: EngineRequest) -> None:
        self._live.discard(req)
        if not req.aborted:
            self.stats.completed += 1
        if req.sequences and req.n == 1:
            seq = req.sequences[0]
            self.finished_spec[req.request_id] = {
                "num_spec_steps": seq.spec.steps,
                "num_accepted_draft_tokens": seq.spec.accepted,
                "num_generated": seq.num_generated,
            }
            while len(self.finished_spec) > FINISHED_SPEC_KEEP:
                self.finished_spec.popitem(last=False)

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
        """The per-request summary: a 0.29+ flag, so never in 0.28 mode."""
        if (
            self.config.spec_metrics == "none"
            or req.n != 1
            or not self.dialect.has_flag(PER_REQUEST_SPEC_FLAG)
        ):
            return None
        if req.sequences:
            return wire.per_request_metrics(req.sequences[0].spec, full=full)
        played = self.playback.spec if self.playback is not None else None
        return wire.per_request_metrics(played, full=full)

    def frontend_delay(self) -> float:
        """Seconds the modelled API server takes to write one chunk now (frontend_chunk_ms).
        vLLM's real rate of merging is not measured here: whatever this model produces is
        the model's, and is reported as such."""
        ms = self.config.frontend_chunk_ms * len(self._live)
        return ms / 1000.0 * self.config.time_scale

    def chunk_dialect(self) -> dict[str, bool]:
        """The version- and flag-dependent parts of a stream's chunks (wire._Chunks)."""
        d = self.dialect
        return {
            "kv_null": d.kv_transfer_null,
            "weight_versions": d.weight_versions,
            "prompt_details": self.config.enable_prompt_tokens_details,
        }

    def prompt_details(self, req: EngineRequest, *, chat: bool) -> Json | None:
        if not self.config.enable_prompt_tokens_details:
            return None
        return wire.prompt_details(req.cached_tokens, chat=chat, full=True)

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
        script: Script | None = None,
    ) -> Prepared:
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
        if self.config.faults:
            sent = "priority" in req.model_fields_set
            self.saw_priority(request_id, req.priority if sent else None)
        engine_req = self.new_request(
            request_id,
            prompt_key=prompt_key,
            prompt_ids=prompt_ids,
            hashes=hashes,
            sampling=sampling,
            n=n,
            seed=req.seed,
            script=script,
            priority=req.priority,
        )
        engine_req.stream_interval = req.stream_interval or self.config.stream_interval
        opts = req.stream_options
        include_usage = bool(req.stream and opts and opts.include_usage)
        return Prepared(
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

    def spec_conflict_response(self, p: Prepared) -> Response:
        """min_p/logit_bias with speculation: vLLM validates in the engine client's generator,
        so a stream has already started (200) and gets an error event; a plain request a 400."""
        self.stats.errors += 1
        if not p.stream:
            return json_response(
                vllm_wire.error_body(protocol.SPEC_UNSUPPORTED, "BadRequestError", 400), 400
            )

        chat = p.request_id.startswith("chatcmpl-")  # prepare() named it by endpoint

        async def frames() -> FrameSource:
            yield [
                self.error_event(protocol.SPEC_UNSUPPORTED, "BadRequestError", 400, chat=chat),
                vllm_wire.DONE,
            ]

        return SSEResponse(
            frames(), on_disconnect=lambda: None, on_drop=lambda: None, drop_after=self.drop_after
        )

    def error_event(self, message: str, err_type: str, code: int, *, chat: bool) -> bytes:
        """0.33 chat writes the event compact; completions, and 0.28 chat, spaced."""
        spaced = not (chat and self.dialect.compact_chat_error)
        return vllm_wire.error_event(message, err_type, code, spaced=spaced)

    def stream_response(self, req: EngineRequest, frames: FrameSource) -> SSEResponse:
        return SSEResponse(
            frames,
            on_disconnect=lambda: self.client_gone(req),
            on_drop=lambda: self.dropped(req),
            drop_after=self.drop_after,
            keep_alive=self.config.sse_keep_alive_s,
        )
