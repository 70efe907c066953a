"""One request on the public path, as one object from its arrival to its last byte.

`PublicApp` (proxy/relay/app.py) fills it as the request is authenticated, read and decided;
proxy/relay/forward.py then opens an engine through its `relay` (push or pull, chosen once,
when the request is opened) and the relay streams `resp` to the client.
"""

from __future__ import annotations

import time
import uuid
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
    from policies.schema import ClientSpec
    from policies.types import Decision, Endpoint
    from proxy.record.request import RequestRecord
    from proxy.relay.asgi import Send
    from proxy.relay.channel import PushChannel
    from proxy.relay.context import Services
    from proxy.relay.fields import Encoded
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


class Exchange(Generic[R]):
    """The request's state, read and written by every step of the path. `__init__` sets what
    is known on arrival; the annotated fields below are set as the request gets that far."""

    __slots__ = (
        "gw",
        "send",
        "_send",
        "t0",
        "policy",
        "headers",
        "request_id",
        "rid",
        "endpoint",
        "path",
        "anthropic",
        "client",
        "body",
        "encoded",
        "affinity",
        "adaptable",
        "model",
        "record",
        "decision",
        "extra",
        "watch",
        "channel",
        "relay",
        "lease",
        "resp",
        "first",
        "filt",
        "ends",
        "rename",
        "cut",
        "continuable",
        "pinger",
        "body_bytes",
        "resident",
    )

    # once authenticated and decided (app.py)
    client: ClientSpec
    body: dict[str, Any]
    encoded: Encoded  # the body's containers as `check_fields` serialised them, for the rewrite
    affinity: bytes | None  # the conversation's opening, for an engine of several (engines.py)
    adaptable: frozenset[str]  # the adaptations that may change the body (adapt.py `candidates`)
    model: str
    record: RequestRecord
    decision: Decision
    extra: Headers  # response headers for the client: request id, defaults applied
    watch: DisconnectWatch
    channel: PushChannel | None  # the client's connection, when the body is pushed to it
    relay: Relay[R]
    pinger: Pinger | None  # keepalive pings while no engine byte came (forward.py)
    # once an engine answered (forward.py)
    filt: StreamFilter
    ends: tuple[bytes, ...]

    def __init__(self, gw: Services, scope: dict[str, Any], send: Send, endpoint: Endpoint) -> None:
        self.gw, self.endpoint = gw, endpoint
        self._send = send
        self.send: Send = self._start  # the response start gets Server-Timing, then `send`
        self.path: str = scope["path"]  # the engine is asked on the same path
        self.anthropic = endpoint == "messages"  # the gateway's own errors in Anthropic's shape
        self.t0 = time.perf_counter()
        self.policy: CompiledPolicy = gw.policy.current  # whatever is applied meanwhile
        self.headers: dict[bytes, bytes] = dict(scope["headers"])
        self.request_id = client_request_id(self.headers.get(b"x-request-id")) or uuid.uuid4().hex
        self.rid: Headers = [(b"x-request-id", self.request_id.encode("latin-1"))]
        self.lease: Lease | None = None  # the engine slot held now
        self.resp: R | None = None  # the engine's answer being relayed now
        self.first = b""  # its first body bytes, read before the response start
        self.rename: tuple[bytes, bytes] | None = None  # served model name -> client's
        self.cut: BodyCut | None = None  # what a body loses on its way (sglang_stream.py)
        self.continuable = False  # a broken stream may be continued (forward.py)
        self.body_bytes = 0  # the request body's size (app.py)
        self.resident: str | None = None  # the engine its session's turn is resident on (hold.py)

    def release_tree(self) -> None:
        """Once decided: every container of the body that `check_fields` serialised is
        replaced in `body` by those bytes (a `memoryview`, written upstream as it is),
        so the parsed conversation is freed before the request first waits, and at most one
        request's tree is alive at a time: a request in flight holds its body's bytes, not its
        objects (a list of empty objects is ~21 times its JSON as objects). `stream_options`
        stays parsed (the usage plan reads and edits it); a continuation parses the rest
        again (`parsed_body`)."""
        body = self.body
        self.affinity = prefix_affinity(body) if self.policy.several_engines else None
        self.adaptable = candidates(body, self.endpoint, self.policy.developer_in_place)
        for name, (value, json) in self.encoded.items():
            if name != "stream_options" and body.get(name) is value:
                body[name] = json
        self.encoded = {}

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
            record = getattr(self, "record", None)
            now = time.perf_counter()
            m = record.m if record is not None else Measurement(self.t0)
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
            error_body(status, message, param=param, type_=type_, anthropic=self.anthropic),
            headers,
        )
