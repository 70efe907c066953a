"""Coding-agent sessions as the seeds describe their traffic (pure: no I/O, no clock).

A session starts from its agent kind's system prompt and tool definitions (the same for every
session of that kind: `shared_prefix` tokens, so a new session's first turn finds them in the
prefix cache, as real agents' do; subagents are a kind of their own) and a repository context of
its own, then runs turns: each turn
sends the whole conversation so far (the message array grows, so every turn's prompt extends
the previous one and the prefix cache serves it, as in production), gets ~460 generated tokens,
"runs tools" for a while and appends their output (~4,000 new prompt tokens). A session ends
after its turns or when its context would pass `max_context` (the agent compacts: the next
session is a new prefix). Now and then a turn spawns a subagent: a short session of its own,
whose result the parent waits for before its next turn.

Defaults are the facts' shape (shared/GB10-facts.md): 41 M prompt tokens for 192 K generated is
~210 prompt tokens per generated one, contexts up to ~100 K, ~96 % of prompt tokens cached.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass, field
from typing import Any

from loadtests.sim.textgen import CodeText, derive_seed

APIS = ("chat", "responses", "messages")


@dataclass(frozen=True, slots=True)
class WorkloadParams:
    agents: int = 2
    turns: int = 16  # per session
    # System prompt and tool definitions every session of one agent kind sends first, tokens.
    shared_prefix: int = 20_000
    initial_context: int = 8000  # the session's own repository context, tokens
    new_tokens: int = 4000  # tool output appended per turn, tokens
    gen_tokens: int = 460  # mean generated tokens per turn (log-normal)
    gen_sigma: float = 0.6
    think_s: float = 5.0  # tool execution / thinking between turns, unscaled seconds
    max_context: int = 100_000
    temperatures: tuple[float | None, ...] = (0.7,)  # per agent, round robin; None: unset
    tools: int = 8  # tool definitions in every request
    # "none": the tools shape the prompt but the engine writes free text of the drawn length;
    # "auto" lets it call them (the simulator then answers with a short scripted call).
    tool_choice: str = "none"
    subagent_rate: float = 0.1  # per turn
    subagent_turns: int = 3
    subagent_context: int = 6000
    api_mix: dict[str, float] = field(default_factory=lambda: {"chat": 1.0})
    model: str = "qwen3.8-27b"
    seed: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.agents <= 64:
            raise ValueError("agents must be within 1..64")
        unknown = set(self.api_mix) - set(APIS)
        if unknown or not any(v > 0 for v in self.api_mix.values()):
            raise ValueError(f"api mix: weights over {', '.join(APIS)}, one at least > 0")


def _text(seed: int, tokens: int) -> str:
    """About `tokens` tokens of code-like text (the simulator's tokenizer splits it back)."""
    return "".join(CodeText(seed).next_pieces(max(1, tokens)))


@functools.cache
def _shared_prefix(seed: int, subagent: bool, tokens: int) -> str:
    """The system prompt every session of one agent kind starts with (main agent or subagent)."""
    head = "You are a coding agent working in a repository. Use the tools to read, edit "
    head += "and test code; answer with code.\n"
    if subagent:
        head = "You are a subagent: do the one task you are given and report.\n"
    return head + (_text(derive_seed(seed, subagent, "shared"), tokens) if tokens > 0 else "")


def tool_defs(n: int) -> list[dict[str, Any]]:
    names = [
        "read_file",
        "write_file",
        "edit_file",
        "run_shell",
        "grep",
        "glob",
        "list_dir",
        "run_tests",
        "git_diff",
        "web_fetch",
        "todo_write",
        "task",
    ]
    return [
        {
            "type": "function",
            "function": {
                "name": names[i % len(names)] + ("" if i < len(names) else f"_{i}"),
                "description": f"Tool {i}: {names[i % len(names)].replace('_', ' ')} in the workspace.",
                "parameters": {
                    "type": "object",
                    "properties": {"path": {"type": "string"}, "args": {"type": "string"}},
                    "required": ["path"],
                },
            },
        }
        for i in range(n)
    ]


@dataclass(slots=True)
class Turn:
    """One request of a session: the conversation so far and what to ask for."""

    api: str
    messages: list[dict[str, str]]
    max_tokens: int
    temperature: float | None
    context_tokens: int  # approximate prompt size


class Session:
    """One agent session's conversation, turn after turn."""

    def __init__(
        self, params: WorkloadParams, agent: int, number: int, *, subagent: bool = False
    ) -> None:
        self.params = params
        self.key = (params.seed, agent, number, subagent)
        self.rng = random.Random(derive_seed(*self.key, "session"))
        self.temperature = params.temperatures[agent % len(params.temperatures)]
        apis = [a for a in APIS if params.api_mix.get(a, 0) > 0]
        self.api = self.rng.choices(apis, [params.api_mix[a] for a in apis])[0]
        context = params.subagent_context if subagent else params.initial_context
        self.turns_left = params.subagent_turns if subagent else params.turns
        system = (
            _shared_prefix(params.seed, subagent, params.shared_prefix)
            + "\n\n# Repository context\n"
            + _text(derive_seed(*self.key, "context"), context)
        )
        self.messages: list[dict[str, str]] = [
            {"role": "system", "content": system},
            {
                "role": "user",
                "content": f"Task {agent}.{number}: implement the next item of "
                "the backlog and make the tests pass.",
            },
        ]
        self.context_tokens = params.shared_prefix + context + 40
        self.turn = 0

    @property
    def done(self) -> bool:
        return self.turns_left <= 0

    def next_turn(self) -> Turn:
        p = self.params
        mu = math.log(p.gen_tokens) - p.gen_sigma**2 / 2  # log-normal with mean gen_tokens
        gen = max(8, round(self.rng.lognormvariate(mu, p.gen_sigma)))
        return Turn(self.api, list(self.messages), gen, self.temperature, self.context_tokens)

    def record(self, answer: str, generated: int) -> None:
        """The turn's answer and the tools' output join the conversation."""
        p = self.params
        self.turn += 1
        self.turns_left -= 1
        self.messages.append({"role": "assistant", "content": answer})
        output = _text(derive_seed(*self.key, "tool", self.turn), p.new_tokens)
        self.messages.append({"role": "user", "content": f"Tool output:\n{output}"})
        self.context_tokens += generated + p.new_tokens + 10
        if self.context_tokens + p.new_tokens + p.gen_tokens > p.max_context:
            self.turns_left = 0  # compaction: the next session starts a new prefix

    def spawns_subagent(self) -> bool:
        return self.rng.random() < self.params.subagent_rate


def request_body(turn: Turn, params: WorkloadParams) -> tuple[str, dict[str, Any]]:
    """The endpoint path and JSON body of a turn in its API."""
    tools = tool_defs(params.tools)
    body: dict[str, Any]
    if turn.api == "chat":
        body = {
            "model": params.model,
            "messages": turn.messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": turn.max_tokens,
            "min_tokens": turn.max_tokens,
        }
        if tools:
            body["tools"] = tools
            body["tool_choice"] = params.tool_choice
        path = "/v1/chat/completions"
    elif turn.api == "responses":
        body = {
            "model": params.model,
            "input": turn.messages,
            "stream": True,
            "max_output_tokens": turn.max_tokens,
        }
        if tools:
            body["tools"] = [{"type": "function", **t["function"]} for t in tools]
            body["tool_choice"] = params.tool_choice
        path = "/v1/responses"
    else:
        system = turn.messages[0]["content"]
        body = {
            "model": params.model,
            "system": system,
            "messages": turn.messages[1:],
            "stream": True,
            "max_tokens": turn.max_tokens,
        }
        if tools:
            body["tools"] = [
                {
                    "name": t["function"]["name"],
                    "description": t["function"]["description"],
                    "input_schema": t["function"]["parameters"],
                }
                for t in tools
            ]
            body["tool_choice"] = {"type": params.tool_choice}
        path = "/v1/messages"
    if turn.temperature is not None:
        body["temperature"] = turn.temperature
    return path, body
