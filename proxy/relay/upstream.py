"""The upstream client: one aiohttp session for every backend, with LLM-sized limits.

aiohttp rather than httpx's default transport: on this path httpx costs ~4x the CPU per
relayed chunk and collapses past ~64 concurrent streams (see loadtests/bench/overhead.py).
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import aiohttp
import orjson

# Request headers never forwarded: hop-by-hop ones, and the client's own credentials.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "authorization",
        "accept-encoding",
        "expect",
    }
)
# Engine response headers a client gets; any other is dropped (an engine's set-cookie, its
# server or x-specrouter-* claims never reach clients). Not here: framing (content-length,
# transfer-encoding: the gateway frames the body itself), x-request-id (the gateway's own
# goes out, and the engine's echo is checked against it), cache-control and
# x-accel-buffering (set on event streams by the gateway).
RESPONSE_ALLOW = frozenset(
    {
        "content-type",
        "content-encoding",
        "retry-after",
        "openai-processing-ms",
        "x-ratelimit-limit-requests",
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-requests",
        "x-ratelimit-reset-tokens",
    }
)
# What a 200 may carry to be relayed as success: an HTML page from a proxy in front of the
# engine, say, is a failure of the engine, not an answer.
SUCCESS_TYPES = ("application/json", "text/event-stream")
# A request body as the pieces to write one after the other (proxy/relay/rewrite.py's
# `upstream_pieces`): the containers already serialised go out as views, not copied.
Payload = Sequence[bytes | memoryview]


class UpstreamError(Exception):
    """A backend failed before answering: `kind` is connect, timeout or status. `accepted`: it
    timed out after its response headers, so the engine has the request (not sent again)."""

    def __init__(
        self, kind: str, message: str, status: int | None = None, *, accepted: bool = False
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.accepted = accepted


def describe(exc: BaseException) -> str:
    """An error's kind and cause without the engine's address: client-facing messages name the
    backend (the relay adds its name), never its host, port or URL."""
    os_error = getattr(exc, "os_error", None)  # aiohttp's connector errors wrap the OSError
    cause = os_error if isinstance(os_error, OSError) else exc
    # The errno's own text: asyncio's strerror ("Connect call failed ('10.0.0.7', 8000)") and
    # a resolver's carry the address.
    reason = ""
    if isinstance(cause, ssl.SSLError):  # its errno is the TLS library's, its reason a code
        reason = str(cause.reason or "")
    elif isinstance(cause, OSError) and isinstance(cause.errno, int) and cause.errno > 0:
        reason = os.strerror(cause.errno)
    return f"{type(exc).__name__}: {reason}" if reason else type(exc).__name__


def echo_mismatch(got: Mapping[str, str], sent: Mapping[str, str]) -> UpstreamError | None:
    """An engine that echoes request ids answered another request (a response left over on a
    reused connection): the error to refuse it with; None when the id matches or is absent."""
    echoed, ours = got.get("x-request-id"), sent.get("x-request-id")
    if echoed is None or ours is None or echoed == ours:
        return None
    return UpstreamError("protocol", "engine answered another request (x-request-id differs)")


def not_an_answer(status: int, headers: Mapping[str, str]) -> UpstreamError | None:
    """A 200 whose content-type is neither JSON nor an event stream, or whose body is encoded
    although the gateway asked for `identity`: the error to refuse it with. An encoded answer
    could be neither measured nor checked, and its stream would carry the usage the gateway
    asked for to the client."""
    if status != 200:
        return None
    encoding = headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("identity", ""):
        return UpstreamError(
            "protocol", f"engine answered 200 with content-encoding {encoding[:32]!r}"
        )
    media = headers.get("content-type", "").partition(";")[0].strip().lower()
    if media in SUCCESS_TYPES:
        return None
    return UpstreamError("protocol", f"engine answered 200 with content-type {media[:64]!r}")


def json_answer(status: int, headers: Mapping[str, str]) -> bool:
    """A 200 that says JSON (a non-streaming answer, read whole before its status goes out)."""
    media = headers.get("content-type", "").partition(";")[0].strip().lower()
    return status == 200 and media == "application/json"


def not_json(
    status: int, headers: Mapping[str, str], first: bytes, whole: bool = False
) -> UpstreamError | None:
    """A 200 that says JSON but is not: its whole body when `whole` (read to its end, bounded),
    else its beginning (a body past the bound: an HTML page or a bare word is caught, a broken
    object is not). The error to refuse it with, before its first byte goes out."""
    if not json_answer(status, headers):
        return None
    if whole:
        try:
            orjson.loads(first)
        except orjson.JSONDecodeError:
            return UpstreamError("protocol", "engine answered 200 with a body that is not JSON")
        return None
    start = first.lstrip(b" \t\r\n")[:1]
    if start in (b"{", b"[") or not start:
        return None
    return UpstreamError("protocol", "engine answered 200 with a body that is not JSON")


def head_size(raw_headers: Sequence[tuple[bytes, bytes]]) -> int:
    return sum(len(k) + len(v) + 4 for k, v in raw_headers)


@runtime_checkable
class UpstreamResponse(Protocol):
    """An engine's answer as the request path sees it, whichever relay reads its body: the
    pull relay's `PulledResponse` (aiohttp) or the push relay's `EngineStream`
    (proxy/relay/engine_conn.py). Header names in `headers` are lowercase."""

    @property
    def status(self) -> int: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def raw_headers(self) -> Sequence[tuple[bytes, bytes]]: ...

    async def first_bytes(self) -> bytes:
        """The first body bytes: until they arrive, the request can still go to another
        backend. UpstreamError when there are none."""
        ...

    def whole(self) -> bool:
        """Whether the body bytes read so far are all of it (then a JSON body is checked
        whole before its status goes out)."""
        ...

    def close(self) -> None:
        """Drop the response: an unfinished one closes its connection (vLLM then aborts)."""
        ...

    def finish(self, ok: bool) -> None:
        """The relay is over: a complete, `ok` response keeps its connection for reuse."""
        ...


class PulledResponse:
    """aiohttp's response as an `UpstreamResponse`; the pull relay reads `content` itself."""

    __slots__ = ("_resp", "_first_byte_timeout", "status", "headers", "raw_headers", "content")

    def __init__(self, resp: aiohttp.ClientResponse, first_byte_timeout: float) -> None:
        self._resp = resp
        self._first_byte_timeout = first_byte_timeout
        self.status = resp.status
        self.headers = resp.headers
        self.raw_headers = resp.raw_headers
        self.content = resp.content

    async def first_bytes(self) -> bytes:
        timeout = self._first_byte_timeout
        try:
            async with asyncio.timeout(timeout):
                data = await self.content.readany()
        except TimeoutError as exc:
            raise UpstreamError("timeout", f"no first byte in {timeout:g}s", accepted=True) from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamError("connect", describe(exc)) from exc
        if not data and self.status == 200 and self._resp.content_length != 0:
            raise UpstreamError("connect", "backend closed the response before the first byte")
        return data

    async def read_whole(self, first: bytes, limit: int, idle_timeout: float) -> bytes:
        """`first` and the rest of the body while it stays within `limit` bytes (the caller
        reads `content.at_eof()` to know whether it is whole)."""
        data = bytearray(first)
        try:
            async with asyncio.timeout(idle_timeout) as deadline:
                while len(data) <= limit and not self.content.at_eof():
                    more = await self.content.readany()
                    if not more:
                        break
                    data += more
                    deadline.reschedule(asyncio.get_running_loop().time() + idle_timeout)
        except TimeoutError as exc:
            raise UpstreamError(
                "timeout", f"engine body stalled for {idle_timeout:g}s", accepted=True
            ) from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamError(
                "protocol", f"engine body cut short: {describe(exc)}", accepted=True
            ) from exc
        return bytes(data)

    def whole(self) -> bool:
        return self.content.at_eof()

    def close(self) -> None:
        self._resp.close()

    def finish(self, ok: bool) -> None:
        if self.content.at_eof() and ok:
            self._resp.release()
        else:
            self._resp.close()
        # A read that the client's leaving woke (proxy/relay/watch.py) raised the exception
        # the reader keeps: its traceback holds the relay's frames, and through them this
        # response and the whole request, a cycle that only a full collection frees.
        failure = self.content.exception()
        if failure is not None:
            failure.__traceback__ = None


class Upstream:
    def __init__(
        self, *, connect_timeout: float, first_byte_timeout: float, max_head_bytes: int = 64 * 1024
    ) -> None:
        self._connect_timeout = connect_timeout
        self._first_byte_timeout = first_byte_timeout
        self.max_head_bytes = max_head_bytes
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            # One connection per request: aiohttp keeps bytes an engine sends to an idle
            # kept-alive connection and hands them to the next request on it as its answer
            # (a late response, or a health check's answer, read as a client's). Event streams
            # take the push relay's pool, which closes such a connection instead.
            connector = aiohttp.TCPConnector(
                limit=0, limit_per_host=0, force_close=True, enable_cleanup_closed=True
            )
            # No total timeout: a stream lasts as long as generation does; the relay enforces
            # the first-byte and idle timeouts itself.
            timeout = aiohttp.ClientTimeout(
                total=None, connect=self._connect_timeout, sock_connect=self._connect_timeout
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=timeout,
                auto_decompress=False,
                skip_auto_headers=("User-Agent",),
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> PulledResponse:
        """Send the request and wait for the response headers (the first-byte timeout)."""
        try:
            async with asyncio.timeout(self._first_byte_timeout):
                resp = await self.session.post(
                    url, data=body, headers=headers, allow_redirects=False
                )
        except TimeoutError as exc:
            # aiohttp's own connect timeout (shorter) reports a connection that never opened;
            # this one fires with the request sent: the engine has it, it is not sent again.
            raise UpstreamError(
                "timeout", f"no response in {self._first_byte_timeout:g}s", accepted=True
            ) from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamError("connect", describe(exc)) from exc
        # aiohttp bounds each header line (8 KiB), not their sum.
        refused = echo_mismatch(resp.headers, headers)
        if head_size(resp.raw_headers) > self.max_head_bytes:
            refused = UpstreamError(
                "protocol", f"engine response head larger than {self.max_head_bytes} bytes"
            )
        if refused is not None:
            resp.close()
            raise refused
        return PulledResponse(resp, self._first_byte_timeout)

    async def get(
        self,
        url: str,
        timeout: float,
        headers: dict[str, str] | None = None,
        max_bytes: int = 64 * 1024,
    ) -> tuple[int, bytes]:
        """A short GET, for health checks and metric scrapes (with the engine's key); a body
        past `max_bytes` raises UpstreamError, read no further."""
        async with asyncio.timeout(timeout), self.session.get(url, headers=headers) as resp:
            body = bytearray()
            while chunk := await resp.content.readany():
                body += chunk
                if len(body) > max_bytes:
                    raise UpstreamError("protocol", f"body larger than {max_bytes} bytes")
            return resp.status, bytes(body)
