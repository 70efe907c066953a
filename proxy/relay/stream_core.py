"""The stream core: one relayed event stream's logic, without I/O.

Both drivers (proxy/relay/push.py, pull.py) feed it what happens (the engine's bytes, its clean
end or its failure, the clock's "silence limit passed" and "ping due") and write what it returns;
what the stream came to (ended by its end event, failed and how, the error event the client gets
last, whether a continuation is wanted) is read from it. One core per engine stream: a
continuation gets a new one over the same filter.

`SilenceLimit` is the stream's deadline for a quiet engine. An engine may send events before its
first output (vLLM's Responses stream sends `response.created` and `response.in_progress` at
once, then nothing until the prefill ends), so until the first output (text, reasoning, a tool
call) the first-byte timeout runs from the moment the engine was asked; after it, the idle
timeout from the last byte. docs/failures.md says why the engine's early events are relayed
rather than held.

The output bound (`output_bound`) cuts an engine that streams past the output tokens the
request allows: bytes derived from the token limit, counted as the engine's reads come, because
a byte count costs one addition per read and bounds what the gateway relays, where a token count
would trust the engine's own usage frames (at the end only, on most APIs) and an event count
would still let each event be a frame limit's worth.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from policies.compiled import OUTPUT_TOKEN_FIELDS
from proxy.record.measure import Measurement
from proxy.relay import sse
from proxy.relay.continuation import stopped
from proxy.relay.ends import (
    MESSAGES_ENDS,
    RESPONSES_ENDS,
    at_end,
    check_end,
    filter_read,
    finish_read,
    gone_outcome,
)
from proxy.relay.errors import sse_error_event
from proxy.relay.keepalive import COMMENT_PING, RELAY_PINGS
from proxy.relay.measure import StreamFilter
from proxy.settings import Settings

if TYPE_CHECKING:
    from proxy.relay.exchange import Exchange


# Bytes an engine's stream may carry per output token it is allowed, plus a head. Generous on
# purpose: a token is one event at most (~300 bytes of envelope on Responses), up to 20 top
# logprobs add ~2 KiB to it, and the Responses and Messages end events repeat the whole text.
OUTPUT_BYTES_PER_TOKEN = 4096
OUTPUT_BYTES_HEAD = 1 << 20


def output_bound(
    body: Mapping[str, Any],
    inject: Mapping[str, Any],
    clamps: tuple[tuple[str, float | None, float | None], ...],
) -> int | None:
    """The engine bytes a stream may carry: from the largest output-token limit sent (the
    client's, or the value the gateway set or clamped it to), else the route's clamp (the
    engine's context length when no clamp is given); None when neither is known."""
    sent = {**body, **inject}
    limits = [v for k in OUTPUT_TOKEN_FIELDS if type(v := sent.get(k)) is int]
    tokens = max(limits) if limits else None
    if tokens is None:
        tokens = next((int(hi) for name, _, hi in clamps if name == "max_tokens" and hi), None)
    return None if tokens is None else OUTPUT_BYTES_HEAD + tokens * OUTPUT_BYTES_PER_TOKEN


class SilenceLimit:
    """When a quiet stream is cut, in loop time; the driver passes its clock readings.

    `asked_ago`: seconds since the engine was asked (the first-byte timeout counts from then).
    """

    __slots__ = ("idle", "first_byte", "first_due")

    def __init__(self, idle: float, first_byte: float, now: float, asked_ago: float) -> None:
        self.idle, self.first_byte = idle, first_byte
        self.first_due = now - max(0.0, asked_ago) + first_byte

    def due(self, last_activity: float, has_output: bool) -> float:
        """The deadline after a byte at `last_activity`; never sooner than the first-byte
        timeout while the engine has not output (never later than the idle timeout after)."""
        idle_due = last_activity + self.idle
        return idle_due if has_output else max(idle_due, self.first_due)

    def message(self, has_output: bool) -> str:
        if has_output:
            return f"upstream sent nothing for {self.idle:g}s"
        return f"upstream sent no output in {max(self.first_byte, self.idle):g}s"


def silence_limit(m: Measurement, settings: Settings, now: float) -> SilenceLimit:
    """A relayed stream's limit, the first-byte timeout counted from when its engine was asked."""
    asked = m.t_engine if m.t_engine is not None else m.t_start
    return SilenceLimit(
        settings.idle_timeout_s, settings.first_byte_timeout_s, now, time.perf_counter() - asked
    )


class StreamCore:
    """One engine stream's state: fed events, it answers with the bytes for the client.

    `ping`: the frame a driver writes when a ping is due and no output has come yet (b"": none).
    `bound`: the engine bytes the stream may carry (`output_bound`; None: unbounded).
    The core only ever returns whole events, so a ping written between two of its outputs falls
    between whole events.
    """

    __slots__ = (
        "filt",
        "ends",
        "responses",
        "messages",
        "limit",
        "ping_frame",
        "bound",
        "taken",
        "past_bound",
        "ended",
        "outcome",
        "error",
        "_splitter",
    )

    def __init__(
        self,
        filt: StreamFilter,
        ends: tuple[bytes, ...],
        max_frame: int | None,
        limit: SilenceLimit,
        ping: bytes = b"",
        bound: int | None = None,
    ) -> None:
        self.filt, self.ends, self.limit, self.ping_frame = filt, ends, limit, ping
        self.bound, self.taken, self.past_bound = bound, 0, False
        self.responses, self.messages = ends is RESPONSES_ENDS, ends is MESSAGES_ENDS
        # A dead engine's partial frame is never sent; nor one past the frame limit.
        self._splitter = sse.FrameSplitter(max_frame)
        self.ended = False  # what went out last is the stream's end event
        self.outcome = "ok"  # ok | upstream_error | timeout: the first failure stays
        self.error = b""  # the error event the client gets last

    # -- inputs ----------------------------------------------------------------------------------

    def feed(self, data: bytes, now: float) -> bytes:
        """An engine read (perf_counter `now`): the whole events the client gets. An event past
        the frame limit, or a read past the output bound, fails the stream (`failed`): the
        driver stops reading the engine."""
        if self.outcome != "ok":
            return b""
        self.taken += len(data)
        if self.bound is not None and self.taken > self.bound:
            self.past_bound = True
            self._fail("upstream_error", 502, f"upstream output passed {self.bound} bytes")
            return b""
        try:
            out = filter_read(self._splitter, self.filt, data, now)
        except sse.FrameTooLarge as exc:
            self._fail("upstream_error", 502, f"upstream {exc}")
            return b""
        if out:
            self.ended = at_end(out, self.ends)
        return out

    def eof(self, now: float) -> bytes:
        """The engine's stream ended cleanly: a last frame held back for a `\\n` that never
        came. Ending before the end event is judged in `result`."""
        if self.outcome != "ok":
            return b""
        out = finish_read(self._splitter, self.filt, now)
        if out:
            self.ended = at_end(out, self.ends)
        return out

    def lost(self, status: int, message: str) -> None:
        """The engine's stream failed (its connection lost, the gateway closing: 503)."""
        self._fail("upstream_error", status, message)

    def silence(self) -> None:
        """The silence limit passed."""
        self._fail("timeout", 504, self.limit.message(self.has_output))

    # -- readings ----------------------------------------------------------------------------------

    @property
    def has_output(self) -> bool:
        return self.filt.m.t_first_token is not None

    @property
    def failed(self) -> bool:
        return self.outcome != "ok"

    @property
    def stopped(self) -> bool:
        """The client's stop string straddled a continuation's splice: the stream is over."""
        return stopped(self.filt)

    def deadline(self, last_activity: float) -> float:
        """When the silence limit passes, after an engine byte at `last_activity`."""
        return self.limit.due(last_activity, self.has_output)

    def ping(self) -> bytes:
        """A ping is due: its frame while no output has come, else nothing."""
        return b"" if self.has_output else self.ping_frame

    def result(self) -> tuple[str, bytes]:
        """The outcome and the error event to end with; a stream that stopped cleanly without
        its end event was cut short all the same, and one that carried the engine's own error
        event failed."""
        m = self.filt.m
        outcome, error = check_end(
            self.outcome, self.error, self.ended, m, self.responses, self.messages
        )
        if not error and m.error is not None:
            outcome = "upstream_error"
        return outcome, error

    def gone(self) -> str:
        """The outcome when the client hung up."""
        return gone_outcome(self.ended, self.outcome)

    def wants_continuation(self, continuable: bool, closing: bool) -> bool:
        """A broken stream may be finished by another engine, once, unless the gateway closes;
        not one that ended with the engine's own error event (the client has read its end), nor
        one cut at the output bound (its engine has already sent more than was asked)."""
        if not continuable or closing or self.past_bound:
            return False
        m = self.filt.m
        outcome, _ = check_end(self.outcome, self.error, self.ended, m, self.responses)
        return outcome != "ok"

    def _fail(self, outcome: str, status: int, message: str) -> None:
        if self.outcome == "ok":  # the first failure is the one the client is told
            self.outcome = outcome
            self.error = sse_error_event(
                status, message, responses=self.responses, messages=self.messages
            )


def open_core(x: Exchange[Any], now: float) -> StreamCore:
    """The core for the exchange's engine stream now being relayed (loop time `now`)."""
    settings, arrival, stream = x.gw.settings, x.arrival, x.stream
    ping = RELAY_PINGS.get(arrival.endpoint, COMMENT_PING) if x.engine.pinger is not None else b""
    limit = silence_limit(stream.filt.m, settings, now)
    clamps = arrival.policy.routes[x.decided.record.route].clamps
    bound = output_bound(x.body, x.decided.decision.inject, clamps)
    return StreamCore(stream.filt, stream.ends, settings.max_sse_frame_bytes, limit, ping, bound)


def ping_every(x: Exchange[Any]) -> float | None:
    """Seconds between pings on the exchange's stream; None: no pings."""
    return x.engine.pinger.every if x.engine.pinger is not None else None
