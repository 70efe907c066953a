"""The probe's requests: code-generation prompts, and the fresh ~12K-token prefill prompt.

Deterministic from (seed, cell, run, stream): two probes with the same seed send the same
prompts in the same order, so two configurations are measured on the same content (acceptance
depends on what is written). The part that varies comes last, after a shared system prompt, as
in an agent's traffic, so the prefix cache serves what it would serve in production.
"""

from __future__ import annotations

import random
from typing import Any

SYSTEM = (
    "You are a careful senior software engineer working in a large Python and TypeScript "
    "code base. Answer with complete, runnable code only: full modules with type hints, "
    "docstrings and unit tests, no prose outside code comments."
)

TASKS = (
    "Write a Python module implementing an LRU cache with TTL expiry, a thread-safe wrapper "
    "and a decorator, with pytest tests for eviction order and expiry.",
    "Implement a streaming JSON lines parser in Python that tolerates truncated records, with "
    "a command line interface, error reporting by line number and tests.",
    "Write an asyncio HTTP client with retries, exponential backoff with jitter, a circuit "
    "breaker and per-host concurrency limits, plus tests using a fake transport.",
    "Implement a SQL query builder in TypeScript with typed columns, joins, parameter binding "
    "and a test suite covering injection attempts.",
    "Write a Python rate limiter library: token bucket, sliding window and leaky bucket, a "
    "Redis-backed variant with Lua scripts, and benchmarks.",
    "Implement a diff algorithm (Myers) in Python producing unified diffs, with a three-way "
    "merge helper, conflict markers and property-based tests.",
    "Write a small Markdown to HTML converter in Python supporting headings, lists, code "
    "fences, tables and links, with escaping rules and golden-file tests.",
    "Implement a job scheduler in Python with cron expressions, persistent state in SQLite, "
    "retries, a worker pool and an admin command line.",
    "Write a TypeScript React hook library for paginated, cached data fetching with "
    "cancellation, optimistic updates and tests with a mocked fetch.",
    "Implement a configuration loader in Python merging YAML files, environment variables and "
    "command line flags with a typed schema, precise error messages and tests.",
)


def prompt_tag(
    seed: int, concurrency: int, temperature: float | None, run: int, stream: int, request: int
) -> str:
    t = "unset" if temperature is None else f"{temperature:g}"
    return f"s{seed}-n{concurrency}-t{t}-r{run}-i{stream}-q{request}"


def messages(
    seed: int, concurrency: int, temperature: float | None, run: int, stream: int, request: int = 0
) -> list[dict[str, str]]:
    """A code-generation conversation, unique per (seed, cell, run, stream, request)."""
    tag = prompt_tag(seed, concurrency, temperature, run, stream, request)
    rng = random.Random(tag)
    task = TASKS[rng.randrange(len(TASKS))]
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"{task}\n\n(probe request {tag})"},
    ]


def chat_body(
    model: str,
    msgs: list[dict[str, str]],
    *,
    max_tokens: int,
    temperature: float | None,
    ignore_eos: bool,
) -> dict[str, Any]:
    # Continuous usage: each chunk's completion_tokens, to make the client's ITL per token.
    body: dict[str, Any] = {
        "model": model,
        "messages": msgs,
        "stream": True,
        "max_tokens": max_tokens,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if temperature is not None:
        body["temperature"] = temperature
    if ignore_eos:
        body["ignore_eos"] = True  # vLLM extension: the generation lasts max_tokens
    return body


_NAMES = (
    "config",
    "request",
    "buffer",
    "record",
    "session",
    "payload",
    "offset",
    "handler",
    "result",
    "window",
    "cursor",
    "schema",
    "tensor",
    "router",
    "policy",
    "engine",
)
_VERBS = (
    "load",
    "parse",
    "merge",
    "render",
    "update",
    "validate",
    "encode",
    "flush",
    "apply",
    "resolve",
    "collect",
    "schedule",
)


def long_prompt(tokens: int, nonce: str) -> list[dict[str, str]]:
    """A code-review conversation of about `tokens` prompt tokens, unique from its first words.

    The nonce opens the system prompt, so no prefix of it can be in any prefix cache. Sized at
    3.35 characters per token (what the simulated tokenizer makes of this code; a real one is
    in the same range); the probe reports the count the server gives (usage.prompt_tokens).
    """
    rng = random.Random(nonce)
    lines: list[str] = []
    chars = 0
    target = int(tokens * 3.35)
    i = 0
    while chars < target:
        name, verb = rng.choice(_NAMES), rng.choice(_VERBS)
        other = rng.choice(_NAMES)
        block = (
            f"def {verb}_{name}_{i}({name}: dict[str, int], {other}_limit: int = {rng.randint(1, 999)}) -> int:\n"
            f'    """{verb.capitalize()} the {name} against {other} ({i})."""\n'
            f"    total = 0\n"
            f"    for key, value in sorted({name}.items()):\n"
            f"        if value > {other}_limit:\n"
            f"            total += value % {rng.randint(2, 97)}\n"
            f"    return total\n\n"
        )
        lines.append(block)
        chars += len(block)
        i += 1
    code = "".join(lines)
    return [
        {"role": "system", "content": f"Review session {nonce}. {SYSTEM}"},
        {
            "role": "user",
            "content": f"Review this module and list every bug:\n\n```python\n{code}```",
        },
    ]
