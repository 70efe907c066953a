"""The soak's client side: one request's outcome as the client saw it, and its classification."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import orjson

from loadtests.harness.rawhttp import Address, Conn, Reply
from proxy.vllm_wire import DATA, DONE, DONE_PAYLOAD, ERROR_FRAME_PREFIX

LOST = frozenset({"cut", "hung", "bad", "refused"})
ERRORS = frozenset({"error_event", "http_error"})


@dataclass(slots=True)
class Outcome:
    """One request as the client saw it. Times are time.monotonic()."""

    kind: str  # ok, error_event, http_error, cut, hung, bad, refused
    status: int
    backend: str  # x-specrouter-variant ("" when no backend answered)
    t0: float
    t1: float
    worker: int = -1
    stream: bool = True
    detail: str = ""
    t_first: float | None = None
    retry_after: str | None = None
    body: bytes | None = None

    @property
    def lost(self) -> bool:
        return self.kind in LOST

    @property
    def errored(self) -> bool:
        return self.kind in ERRORS


def classify_reply(reply: Reply | None, stream: bool) -> tuple[str, str]:
    """(kind, detail) of a response as received."""
    if reply is None or not reply.head:
        return "cut", "no response"
    body = bytes(reply.body)
    if not reply.complete:
        return "cut", f"{reply.status}: connection ended mid-body after {len(body)} bytes"
    if reply.status >= 400:
        try:
            err = orjson.loads(body)["error"]
            message = err["message"]
            if not isinstance(message, str) or not message:
                raise KeyError("message")
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            return "bad", f"{reply.status} without an OpenAI error body: {exc}: {body[:120]!r}"
        return "http_error", f"{reply.status} {message[:160]}"
    if reply.status != 200:
        return "bad", f"status {reply.status}"
    if reply.headers.get("content-type", "").startswith("text/event-stream"):
        if not body.endswith(DONE):
            return "cut", f"stream ended without [DONE]: {body[-120:]!r}"
        if body.count(DATA + DONE_PAYLOAD) != 1:
            return "bad", "[DONE] more than once"
        idx = body.find(ERROR_FRAME_PREFIX)
        if idx >= 0:
            end = body.find(b"\n\n", idx)
            try:
                message = str(orjson.loads(body[idx + 6 : end])["error"]["message"])
            except (orjson.JSONDecodeError, KeyError, TypeError):
                return "bad", f"malformed error event {body[idx:end][:160]!r}"
            if body[end + 2 :] != DONE:
                return "bad", "data after the error event"
            return "error_event", message[:160]
        return "ok", ""
    if stream:
        return "bad", f"a stream answered {reply.headers.get('content-type')}"
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return "cut", f"truncated JSON body ({len(body)} bytes)"
    if not isinstance(data, dict) or "choices" not in data:
        return "bad", f"200 without choices: {body[:120]!r}"
    return "ok", ""


class Requester:
    """Sends requests on a kept-alive connection, reconnecting when it ends."""

    def __init__(self, target: Address) -> None:
        self.target = target
        self.conn: Conn | None = None

    async def send(
        self,
        request: bytes,
        *,
        stream: bool,
        deadline_s: float,
        worker: int = -1,
        keep_body: bool = False,
    ) -> Outcome:
        t0 = time.monotonic()
        reply: Reply | None = None
        try:
            async with asyncio.timeout(deadline_s):
                for attempt in range(2):
                    if self.conn is None or not self.conn.keep:
                        if self.conn is not None:
                            await self.conn.close()
                        try:
                            self.conn = await Conn.open(self.target)
                        except OSError as exc:
                            self.conn = None
                            return Outcome(
                                "refused",
                                0,
                                "",
                                t0,
                                time.monotonic(),
                                worker,
                                stream,
                                f"{type(exc).__name__}: {exc}",
                            )
                    reused = self.conn.used > 0
                    try:
                        reply = await self.conn.exchange(request)
                    except (OSError, ssl.SSLError) as exc:
                        self.conn.keep = False
                        reply = None
                        if reused and attempt == 0:
                            continue  # a kept-alive connection the server had just closed
                        return Outcome(
                            "cut",
                            0,
                            "",
                            t0,
                            time.monotonic(),
                            worker,
                            stream,
                            f"{type(exc).__name__}: {exc}",
                        )
                    if reused and attempt == 0 and not reply.head and not reply.body:
                        continue  # closed by the server between two requests: not an answer
                    break
        except TimeoutError:
            if self.conn is not None:
                self.conn.abort()
                self.conn = None
            return Outcome(
                "hung",
                reply.status if reply else 0,
                (reply.headers.get("x-specrouter-variant", "") if reply else ""),
                t0,
                time.monotonic(),
                worker,
                stream,
                f"no end in {deadline_s:g}s",
            )
        t1 = time.monotonic()
        kind, detail = classify_reply(reply, stream)
        assert reply is not None
        if not reply.complete and self.conn is not None:
            self.conn.keep = False
        return Outcome(
            kind,
            reply.status,
            reply.headers.get("x-specrouter-variant", ""),
            t0,
            t1,
            worker,
            stream,
            detail,
            reply.t_first,
            reply.headers.get("retry-after"),
            bytes(reply.body) if keep_body else None,
        )

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()
            self.conn = None


def iter_outcomes(
    outcomes: Iterable[Outcome], *, backend: str | None = None, kinds: Iterable[str] | None = None
) -> Iterator[Outcome]:
    wanted = None if kinds is None else set(kinds)
    for o in outcomes:
        if (backend is None or o.backend == backend) and (wanted is None or o.kind in wanted):
            yield o
