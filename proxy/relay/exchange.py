"""One request on the public path, as one object from its arrival to its last byte, its state
grouped by the phase that writes it:

- `Arrival` (set once, on arrival): the time, the policy, the headers, the request id, the API.
- `Decided` (set once, by proxy/relay/app.py once the body is read and decided): the model, the
  record, the decision, the response headers, what the relay reads of the body's tree.
- `EngineLink` (made by app.py at the hand-off; forward.py and hold.py write it): the relay
  chosen, the client's connection, the engine slot held, the engine's answer, the pings while
  no engine byte came.
- `StreamRelay` | `PlainBody` (set once, when the engine answered): how its answer is relayed.

The body itself (`body`, `encoded`) is the exchange's own: its form changes on the way
(`release_tree`, `drop_body`). proxy/relay/forward.py opens an engine through `engine.relay`
(push or pull, chosen once, when the request is opened) and the relay streams
`engine.resp` to the client.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import orjson

from proxy.backends.engines import prefix_affinity
from proxy.record.measure import Measurement
from proxy.relay.adapt import candidates
from proxy.relay.asgi import respond
from proxy.relay.errors import error_body
from proxy.relay.fields import client_request_id
from proxy.relay.upstream import Payload, UpstreamResponse

if TYPE_CHECKING:
    from policies.compiled import CompiledPolicy
    from policies.types import Decision, Endpoint
    from proxy.record.request import RequestRecord
    from proxy.relay.asgi import Send
    from proxy.relay.body_shape import Encoded
    from proxy.relay.channel import PushChannel
    from proxy.relay.context import Services
    from proxy.relay.keepalive import Pinger
    from proxy.relay.lease import Lease
    from proxy.relay.measure import StreamFilter
    from proxy.relay.sglang_stream import BodyCut
    from proxy.relay.watch import DisconnectWatch

R = TypeVar("R", bound=UpstreamResponse)
Headers = list[tuple[bytes, bytes]]


class StreamOver(Protocol):
    """What forward.py reads of an engine stream's core (proxy/relay/stream_core.py) once the
    relay is done with it."""

    def wants_continuation(self, continuable: bool, closing: bool) -> bool: ...

    def result(self) -> tuple[str, bytes]: ...


@dataclass(frozen=True, slots=True)
class Relay(Generic[R]):
    """One way to relay an engine's answer (proxy/relay/push.py's PUSH, pull.py's PULL)."""

    # (exchange, url, payload, upstream headers, check_status): the response, its first bytes
    open: Callable[[Exchange[R], str, Payload, dict[str, str], bool], Awaitable[tuple[R, bytes]]]
    # one engine's event stream; its core once over, or the outcome when the client left
    sse: Callable[[Exchange[R]], Awaitable[StreamOver | str]]
    body: Callable[[Exchange[R]], Awaitable[str]]  # a plain body; the outcome


@dataclass(frozen=True, slots=True)
class Arrival:
    """What is known when the request arrives, before it is authenticated or read."""

    t0: float  # perf_counter at arrival
    policy: CompiledPolicy  # the policy current then, whatever is applied meanwhile
    headers: dict[bytes, bytes]
    request_id: str
    rid: Headers  # the response's x-request-id header
    endpoint: Endpoint
    path: str  # the engine is asked on the same path
    anthropic: bool  # the gateway's own errors in Anthropic's shape


@dataclass(frozen=True, slots=True)
class Decided:
    """The request as authenticated, read and decided (app.py)."""

    model: str  # the client's name for it
    body_bytes: int  # the request body's size
    record: RequestRecord  # the request's record: every later step writes its fields
    decision: Decision
    extra: Headers  # response headers for the client: request id, defaults applied
    affinity: bytes | None  # the conversation's opening, for an engine of several (engines.py)
    adaptable: frozenset[str]  # the adaptations that may change the body (adapt.py `candidates`)


@dataclass(slots=True)
class EngineLink(Generic[R]):
    """The way to an engine and back, from the hand-off to forward.py on: `relay`, `channel`
    and `watch` are chosen once, when the request is opened (app.py); the rest changes with
    each attempt, a retry or a continuation (forward.py) and the session's admission (hold.py)."""

    relay: Relay[R]
    channel: PushChannel | None  # the client's connection, when the body is pushed to it
    watch: DisconnectWatch
    pinger: Pinger | None = None  # keepalive pings while no engine byte came (forward.py)
    lease: Lease | None = None  # the engine slot held now
    resp: R | None = None  # the engine's answer being relayed now
    first: bytes = b""  # its first body bytes, read before the response start
    resident: str | None = None  # the engine its session's turn is resident on (hold.py)


@dataclass(frozen=True, slots=True)
class StreamRelay:
    """An engine's event stream, as relayed (forward.py `_relay`)."""

    filt: StreamFilter
    ends: tuple[bytes, ...]  # the API's end events
    continuable: bool  # a broken stream may be continued (forward.py)


@dataclass(frozen=True, slots=True)
class PlainBody:
    """A plain (non-streaming) answer, as relayed (forward.py `_relay`)."""

    rename: tuple[bytes, bytes] | None  # served model name -> client's
    cut: BodyCut | None  # what the body loses on its way (sglang_stream.py)


class Exchange(Generic[R]):
    """The request's state, read and written by every step of the path. `__init__` sets what
    is known on arrival; the annotated phases below are set as the request gets that far."""

    __slots__ = (
        "gw",
        "send",
        "_send",
        "arrival",
        "body",
        "encoded",
        "decided",
        "engine",
        "stream",
        "plain",
    )

    body: dict[str, Any]  # set once read (app.py); its containers serialised once decided
    encoded: Encoded  # the body's containers as `check_fields` serialised them, for the rewrite
    decided: Decided  # once decided (app.py)
    engine: EngineLink[R]  # once handed to forward.py (app.py)
    stream: StreamRelay  # once an engine answered with an event stream (forward.py)
    plain: PlainBody  # once an engine answered with a plain body (forward.py)

    def __init__(self, gw: Services, scope: dict[str, Any], send: Send, endpoint: Endpoint) -> None:
        self.gw = gw
        self._send = send
        self.send: Send = self._start  # the response start gets Server-Timing, then `send`
        t0 = time.perf_counter()
        headers: dict[bytes, bytes] = dict(scope["headers"])
        request_id = client_request_id(headers.get(b"x-request-id")) or os.urandom(16).hex()
        self.arrival = Arrival(
            t0,
            gw.policy.current,
            headers,
            request_id,
            [(b"x-request-id", request_id.encode("latin-1"))],
            endpoint,
            scope["path"],
            endpoint == "messages",
        )

    def release_tree(self) -> tuple[bytes | None, frozenset[str]]:
        """Once decided: what the relay reads of the body's tree (its affinity, its adaptable
        rules), then every container of the body that `check_fields` serialised is
        replaced in `body` by those bytes (a `memoryview`, written upstream as it is),
        so the parsed conversation is freed before the request first waits, and at most one
        request's tree is alive at a time: a request in flight holds its body's bytes, not its
        objects (a list of empty objects is ~21 times its JSON as objects). `stream_options`
        stays parsed (the usage plan reads and edits it); a continuation parses the rest
        again (`parsed_body`)."""
        body, arrival = self.body, self.arrival
        policy = arrival.policy
        affinity = prefix_affinity(body) if policy.several_engines else None
        adaptable = candidates(body, arrival.endpoint, policy.developer_in_place)
        for name, (value, json) in self.encoded.items():
            if name != "stream_options" and body.get(name) is value:
                body[name] = json
        self.encoded = {}
        return affinity, adaptable

    def drop_body(self) -> None:
        """The engine answered and no continuation will resend the body: its serialised
        containers go, for as long as the answer streams (what stays is read by the relay:
        `stream`, `stream_options`, `stream_interval`)."""
        self.body = {k: v for k, v in self.body.items() if type(v) is not memoryview}

    def parsed_body(self) -> dict[str, Any]:
        """The body with its containers parsed again (a continuation reads `messages`)."""
        if not any(type(v) is memoryview for v in self.body.values()):
            return self.body
        return {k: orjson.loads(v) if type(v) is memoryview else v for k, v in self.body.items()}

    async def _start(self, message: dict[str, Any]) -> None:
        """Every response's start, whoever sends it: `Server-Timing` with what is known now
        (proxy/record/measure.py's `Measurement.server_timing`); later messages go straight."""
        if message["type"] == "http.response.start":
            self.send = self._send
            decided = getattr(self, "decided", None)
            now = time.perf_counter()
            m = decided.record.m if decided is not None else Measurement(self.arrival.t0)
            timing = m.server_timing(now)
            message = {
                **message,
                "headers": [*message.get("headers", ()), (b"server-timing", timing)],
            }
        await self._send(message)

    async def error(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        type_: str | None = None,
        headers: Headers | None = None,
    ) -> None:
        """Answer with the gateway's own error, in the shape of the request's API."""
        await respond(
            self.send,
            status,
            error_body(status, message, param=param, type_=type_, anthropic=self.arrival.anthropic),
            headers,
        )
