"""Several engines behind one variant: which URL serves a request.

Load-aware (the gateway's in-flight count plus the engine's scraped queue) with prefix-cache
locality: requests whose conversations share a prefix go to the same engine (rendezvous
hashing), where vLLM's prefix cache already holds it, unless that engine is clearly busier
than the rest (bounded load), because a warm cache does not pay for a long queue.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

PREFIX_BYTES = 4096  # of the first messages: enough to tell conversations apart
LOAD_SLACK = 1.25  # a preferred engine may carry this much more than the average, plus one


@dataclass(slots=True)
class EngineState:
    up: bool = True
    in_flight: int = 0
    running: int | None = None
    waiting: int | None = None
    max_model_len: int | None = None  # its /v1/models' window, read once while up (health.py)

    @property
    def load(self) -> int:
        return self.in_flight + (self.waiting or 0)


class EngineTable:
    def __init__(self) -> None:
        self.states: dict[str, EngineState] = {}

    def state(self, url: str) -> EngineState:
        s = self.states.get(url)
        if s is None:
            s = self.states[url] = EngineState()
        return s

    def pick(self, urls: Sequence[str], affinity: bytes | None) -> str:
        if len(urls) == 1:
            return urls[0]
        candidates = [u for u in urls if self.state(u).up] or list(urls)
        if affinity is not None:
            preferred = max(
                candidates,
                key=lambda u: hashlib.blake2b(affinity + u.encode(), digest_size=8).digest(),
            )
            average = sum(self.state(u).load for u in candidates) / len(candidates)
            if self.state(preferred).load <= average * LOAD_SLACK + 1:
                return preferred
        return min(candidates, key=lambda u: (self.state(u).load, u))


def prefix_affinity(body: Mapping[str, Any]) -> bytes | None:
    """A key for the conversation's opening: the system prompt and first user turn (or the
    start of a completion prompt). Agents resend the whole conversation each turn, so this
    stays the same for one conversation and differs between conversations."""
    messages = body.get("messages")
    if isinstance(messages, list) and messages:
        head = orjson.dumps(messages[:2])[:PREFIX_BYTES]
    elif isinstance(body.get("prompt"), str):
        head = body["prompt"].encode()[:PREFIX_BYTES]
    elif isinstance(body.get("input"), str | list):
        head = orjson.dumps(body["input"])[:PREFIX_BYTES]
    else:
        return None
    return hashlib.blake2b(head, digest_size=16).digest()
