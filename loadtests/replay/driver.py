"""Runs the agents' sessions against a gateway or engines over HTTP(S), bounded in time.

Each agent runs sessions one after another until the deadline; a turn is one streamed request.
Each request names its session as coding agents do (OpenCode's `x-session-id`, a subagent's
parent in `x-parent-session-id`; Claude Code and Codex send their own equivalents), so a gateway
tells the sessions apart: without it they share one fingerprint (the same system prompt).
Times are measured in wall seconds and reported unscaled (divided by the time scale the
simulator runs at; 1.0 against real engines).

The agents are impatient by default (`watchdogs`): each API's agent keeps the clocks of the agent
that speaks it and resends as it does (watchdogs.py); a resend closes the abandoned stream, so
the gateway or engine aborts it. Off, every turn waits (up to httpx's 600 s between bytes).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from .watchdogs import AGENTS, Clock, Watchdogs, retries_status, retry_delay
from .workload import Session, Turn, WorkloadParams, request_body


@dataclass(slots=True)
class TurnResult:
    agent: int
    session: int
    subagent: bool
    api: str
    temperature: float | None
    context_tokens: int
    start_s: float  # since the run started, unscaled
    turn_s: float  # request sent -> last byte, unscaled
    ttft_s: float | None
    decode_tok_s: float | None
    prompt_tokens: int
    cached_tokens: int | None  # when the API's usage says
    completion_tokens: int
    error: str | None = None
    resends: int = 0  # the same request sent again (a watchdog fired, a retried refusal)
    watchdog_fires: int = 0


@dataclass(slots=True)
class _Stream:
    text: list[str]
    first: float | None = None
    prompt: int = 0
    cached: int | None = None
    completion: int = 0
    chunks: int = 0


def _read_event(api: str, data: dict[str, Any], s: _Stream, now: float) -> None:
    """One SSE payload of chat, Responses or Messages: text, first-token time, usage."""
    piece = ""
    if api == "chat":
        for choice in data.get("choices") or []:
            delta = choice.get("delta") or {}
            piece += delta.get("content") or ""
            if delta.get("tool_calls"):
                piece += orjson.dumps(delta["tool_calls"]).decode()
        usage = data.get("usage")
        if usage:
            s.prompt, s.completion = (
                usage.get("prompt_tokens", 0),
                usage.get("completion_tokens", 0),
            )
            details = usage.get("prompt_tokens_details") or {}
            s.cached = details.get("cached_tokens", s.cached)
    elif api == "responses":
        kind = data.get("type", "")
        if kind.endswith(".delta"):
            piece = str(data.get("delta") or "")
        elif kind in ("response.completed", "response.incomplete"):
            usage = (data.get("response") or {}).get("usage") or {}
            s.prompt, s.completion = usage.get("input_tokens", 0), usage.get("output_tokens", 0)
            s.cached = (usage.get("input_tokens_details") or {}).get("cached_tokens")
    else:
        kind = data.get("type", "")
        if kind == "content_block_delta":
            d = data.get("delta") or {}
            piece = str(d.get("text") or d.get("partial_json") or "")
        elif kind == "message_start":
            usage = (data.get("message") or {}).get("usage") or {}
            s.prompt = usage.get("input_tokens", 0) + usage.get("cache_read_input_tokens", 0)
            s.cached = usage.get("cache_read_input_tokens")
        elif kind == "message_delta":
            s.completion = (data.get("usage") or {}).get("output_tokens", s.completion)
    if piece:
        if s.first is None:
            s.first = now
        s.chunks += 1
        s.text.append(piece)


class Driver:
    def __init__(
        self,
        params: WorkloadParams,
        base_url: str,
        *,
        time_scale: float,
        duration_s: float,
        verify: Any = True,
        api_key: str | None = None,
        on_turn: Callable[[TurnResult], None] | None = None,
        session_headers: bool = True,
        watchdogs: bool = True,
    ) -> None:
        self.params = params
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.scale = time_scale
        self.duration_s = duration_s  # wall seconds
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.AsyncClient(
            verify=verify,
            headers=headers,
            timeout=httpx.Timeout(600.0, connect=10.0),
            limits=httpx.Limits(max_connections=4 * params.agents + 4),
        )
        self.results: list[TurnResult] = []
        self.in_flight = 0
        self.on_turn = on_turn
        self.session_headers = session_headers
        self.watchdogs: dict[str, Watchdogs] = AGENTS if watchdogs else {}
        self._t0 = 0.0
        self._deadline = 0.0

    async def run(self) -> list[TurnResult]:
        self._t0 = time.monotonic()
        self._deadline = self._t0 + self.duration_s
        try:
            await asyncio.gather(*(self._agent(a) for a in range(self.params.agents)))
        finally:
            await self.client.aclose()
        return self.results

    def _left(self) -> float:
        return self._deadline - time.monotonic()

    async def _agent(self, agent: int) -> None:
        number = 0
        while self._left() > 0:
            await self._session(Session(self.params, agent, number), agent, number)
            number += 1

    def _headers(self, session: Session, parent: Session | None) -> dict[str, str]:
        if not self.session_headers:
            return {}

        def name(s: Session) -> str:
            return "replay-" + "-".join(str(int(k)) for k in s.key)

        out = {"x-session-id": name(session)}
        if parent is not None:
            out["x-parent-session-id"] = name(parent)
        return out

    async def _session(
        self,
        session: Session,
        agent: int,
        number: int,
        subagent: bool = False,
        parent: Session | None = None,
    ) -> None:
        sub = 0
        headers = self._headers(session, parent)
        while not session.done and self._left() > 0:
            result, answer = await self._turn(session.next_turn(), agent, number, subagent, headers)
            if result.error is not None:
                return  # a failed turn ends its session; the next starts afresh
            session.record(answer, result.completion_tokens)
            if not subagent and session.spawns_subagent():
                sub += 1
                await self._session(
                    Session(self.params, agent, 1000 * (number + 1) + sub, subagent=True),
                    agent,
                    number,
                    subagent=True,
                    parent=session,
                )
            await asyncio.sleep(min(max(0.0, self._left()), self.params.think_s * self.scale))

    async def _turn(
        self, turn: Turn, agent: int, number: int, subagent: bool, headers: dict[str, str]
    ) -> tuple[TurnResult, str]:
        path, body = request_body(turn, self.params)
        content = orjson.dumps(body)
        w = self.watchdogs.get(turn.api)
        t0 = time.monotonic()
        resends = fires = 0
        status_tries = watchdog_tries = 0
        self.in_flight += 1
        try:
            while True:
                s = _Stream([])
                kind, status, retry_after, error = await self._attempt(
                    turn.api, path, content, headers, s, w
                )
                if w is None or kind == "ok" or self._left() <= 0:
                    break
                if kind == "watchdog":
                    fires += 1
                    if watchdog_tries >= w.watchdog_resends:
                        break
                    delay, watchdog_tries = 0.0, watchdog_tries + 1
                elif kind == "status" and not retries_status(w, status):
                    break
                else:  # a retried status or a lost connection
                    if status_tries >= w.status_retries:
                        break
                    # The gateway's retry-after is in its own (wall) seconds.
                    after = None if retry_after is None else retry_after / self.scale
                    delay = retry_delay(w, status_tries, after)
                    status_tries += 1
                resends += 1
                await asyncio.sleep(delay * self.scale)
        finally:
            self.in_flight -= 1
        end = time.monotonic()
        completion = s.completion or s.chunks
        ttft = None if s.first is None else (s.first - t0) / self.scale
        decode = None
        if s.first is not None and end > s.first and completion > 1:
            decode = (completion - 1) / ((end - s.first) / self.scale)
        result = TurnResult(
            agent,
            number,
            subagent,
            turn.api,
            turn.temperature,
            turn.context_tokens,
            (t0 - self._t0) / self.scale,
            (end - t0) / self.scale,
            ttft,
            decode,
            s.prompt,
            s.cached,
            completion,
            error,
            resends,
            fires,
        )
        self.results.append(result)
        if self.on_turn is not None:
            self.on_turn(result)
        return result, "".join(s.text)

    async def _attempt(
        self,
        api: str,
        path: str,
        content: bytes,
        headers: dict[str, str],
        s: _Stream,
        w: Watchdogs | None,
    ) -> tuple[str, int, float | None, str | None]:
        """One send of the turn's request: (outcome, status, retry-after, error); outcome is
        ok, status (a refusal), watchdog (closed by the agent's clock) or lost."""
        loop = asyncio.get_running_loop()
        clock = None if w is None else Clock(w, loop.time(), self.scale)
        try:
            async with asyncio.timeout(None if clock is None else clock.due()) as limit:
                async with self.client.stream(
                    "POST",
                    self.base_url + path,
                    content=content,
                    headers={"content-type": "application/json", **headers},
                ) as resp:
                    if clock is not None:
                        clock.head(loop.time())
                        limit.reschedule(clock.due())
                    if resp.status_code != 200:
                        text = (await resp.aread())[:200]
                        after = _retry_after(resp.headers.get("retry-after"))
                        return (
                            "status",
                            resp.status_code,
                            after,
                            f"HTTP {resp.status_code}: {text!r}",
                        )
                    async for line in resp.aiter_lines():
                        data = None
                        if line.startswith("data: ") and line != "data: [DONE]":
                            data = orjson.loads(line[6:])
                        if clock is not None:
                            clock.line(loop.time(), line, data)
                            limit.reschedule(clock.due())
                        if isinstance(data, dict):
                            _read_event(api, data, s, time.monotonic())
        except TimeoutError:
            assert clock is not None
            which = clock.fired(loop.time())
            return "watchdog", 0, None, f"{w.agent if w else ''} {which} watchdog fired"
        except (httpx.HTTPError, orjson.JSONDecodeError) as err:
            return "lost", 0, None, f"{type(err).__name__}: {err}"
        return "ok", 200, None, None


def _retry_after(value: str | None) -> float | None:
    try:
        return None if value is None else max(0.0, float(value))
    except ValueError:
        return None
