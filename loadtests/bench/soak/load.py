"""Load: workers sending requests back to back, bursts, client disconnects, async helpers."""

from __future__ import annotations

import asyncio
import contextlib
import random
import ssl
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from loadtests.bench.soak.client import Outcome, Requester
from loadtests.harness.rawhttp import Address, Conn

BodyOf = Callable[[int, int], dict[str, Any]]  # (worker, request number) -> body


def chat_body(
    worker: int,
    n: int,
    *,
    rng: random.Random | None = None,
    max_tokens: tuple[int, int] = (50, 400),
    stream_share: float = 0.875,
) -> dict[str, Any]:
    rng = rng or random.Random(worker * 100_003 + n)
    stream = rng.random() < stream_share
    body: dict[str, Any] = {
        "model": "coder",
        "stream": stream,
        "max_tokens": rng.randint(*max_tokens) if stream else 30,
        "messages": [{"role": "user", "content": f"Fix the bug in `src/mod{worker}_{n}.py`."}],
    }
    if stream and rng.random() < 0.5:
        body["stream_options"] = {"include_usage": True}
    return body


class Load:
    """`workers` clients sending requests back to back from a thread of their own, until
    stop(). Worker i uses `keys[i % len(keys)]`."""

    def __init__(
        self,
        target: Address,
        keys: Sequence[str],
        *,
        workers: int = 16,
        body_of: BodyOf = chat_body,
        deadline_s: float = 30.0,
        keep_bodies: bool = False,
    ) -> None:
        self.target, self.keys, self.workers = target, list(keys), workers
        self.body_of, self.deadline_s, self.keep_bodies = body_of, deadline_s, keep_bodies
        self.outcomes: list[Outcome] = []
        self.sent = 0
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self.error: BaseException | None = None

    def start(self) -> Load:
        self._thread = threading.Thread(target=self._run, name="fault-load", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("load thread did not start")
        return self

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported by stop()
            self.error = exc
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._ready.set()
        await asyncio.gather(*(self._worker(i) for i in range(self.workers)))

    async def _worker(self, i: int) -> None:
        assert self._stop is not None
        requester = Requester(self.target)
        key = self.keys[i % len(self.keys)]
        n = 0
        try:
            while not self._stop.is_set():
                body = self.body_of(i, n)
                n += 1
                self.sent += 1
                payload = self.target.request("/v1/chat/completions", orjson.dumps(body), key)
                out = await requester.send(
                    payload,
                    stream=body.get("stream") is True,
                    deadline_s=self.deadline_s,
                    worker=i,
                    keep_body=self.keep_bodies,
                )
                self.outcomes.append(out)
                if out.kind == "refused":
                    await asyncio.sleep(0.2)
        finally:
            await requester.close()

    def stop(self, timeout: float | None = None) -> list[Outcome]:
        """Stop sending; requests in flight finish (each within the deadline)."""
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout if timeout is not None else self.deadline_s + 10)
            if self._thread.is_alive():
                raise RuntimeError("load did not stop in time")
        if self.error is not None:
            raise self.error
        return list(self.outcomes)

    def __enter__(self) -> Load:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(RuntimeError):
            self.stop()


def run_async(coro: Any, timeout: float) -> Any:
    """Run a coroutine to completion in a thread of its own (the caller may block)."""
    result: list[Any] = []
    error: list[BaseException] = []

    def go() -> None:
        try:
            result.append(asyncio.run(asyncio.wait_for(coro, timeout)))
        except BaseException as exc:
            error.append(exc)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(timeout + 5)
    if t.is_alive():
        raise RuntimeError("async job did not finish")
    if error:
        raise error[0]
    return result[0]


class Background:
    """run_async in the background: start now, `result()` later."""

    def __init__(self, coro: Any, timeout: float) -> None:
        self._out: list[Any] = []
        self._err: list[BaseException] = []
        self.timeout = timeout
        self._t = threading.Thread(target=self._go, args=(coro,), daemon=True)
        self._t.start()

    def _go(self, coro: Any) -> None:
        try:
            self._out.append(asyncio.run(asyncio.wait_for(coro, self.timeout)))
        except BaseException as exc:
            self._err.append(exc)

    def result(self) -> Any:
        self._t.join(self.timeout + 5)
        if self._t.is_alive():
            raise RuntimeError("background job did not finish")
        if self._err:
            raise self._err[0]
        return self._out[0]


async def burst(
    target: Address,
    requests: Sequence[tuple[str, dict[str, Any]]],
    *,
    deadline_s: float,
    keep_bodies: bool = True,
) -> list[Outcome]:
    """One request per (key, body), all at once, each on its own connection."""

    async def one(i: int, key: str, body: dict[str, Any]) -> Outcome:
        r = Requester(target)
        try:
            return await r.send(
                target.request("/v1/chat/completions", orjson.dumps(body), key),
                stream=body.get("stream") is True,
                deadline_s=deadline_s,
                worker=i,
                keep_body=keep_bodies,
            )
        finally:
            await r.close()

    return list(await asyncio.gather(*(one(i, k, b) for i, (k, b) in enumerate(requests))))


async def disconnects(
    target: Address,
    key: str,
    n: int,
    *,
    concurrency: int = 32,
    max_tokens: int = 4000,
    timeout_each: float = 20.0,
    on_progress: Callable[[int], None] | None = None,
) -> Counter[str]:
    """`n` streaming requests, each dropped (TCP abort) as soon as its first body bytes arrive,
    so the upstream generation has begun and must be aborted. Returns what each saw before the
    drop: `dropped` (a 200 stream began), or its status / failure."""
    seen: Counter[str] = Counter()
    body = orjson.dumps(
        {
            "model": "coder",
            "stream": True,
            "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "Write a long module."}],
        }
    )
    request = target.request("/v1/chat/completions", body, key)
    todo = iter(range(n))
    done = 0

    async def worker() -> None:
        nonlocal done
        for _ in todo:
            try:
                async with asyncio.timeout(timeout_each):
                    conn = await Conn.open(target)
                    try:
                        reply = await conn.exchange(request, until_body=True)
                    finally:
                        conn.abort()
                seen[
                    "dropped" if reply.status == 200 and reply.body else f"status {reply.status}"
                ] += 1
            except (OSError, TimeoutError, ssl.SSLError) as exc:
                seen[type(exc).__name__] += 1
            done += 1
            if on_progress is not None:
                on_progress(done)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return seen
