"""Agent sessions whose prefixes together exceed the engine's KV: straight to the engine, and
through the gateway with session-aware admission (docs/sessions-real-vllm.md).

    results = compare(workload, engine_ctx, gateway_policy_for, certs=certs)
    results["straight"].hit_rate, results["admission"].prefilled_per_turn

A fixed amount of work, so that the modes compare: every session (one per agent, started
together) runs its turns with the replay's driver (each turn streams the whole conversation so
far; the answer and some tool output are appended), with think time between turns, until all
are done. The text is made of the tiny model's training words, which both tokenizers count
alike, so the real engine and the simulator see the same prompts in tokens and run the same
KV. Hits and prefilled tokens are the engine's own counters (`vllm:prefix_cache_*`,
`vllm:prompt_tokens*`), read before and after each mode; the engine's prefix cache is emptied
before each (a fresh simulator, or vLLM's `/reset_prefix_cache`).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import random
import ssl
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from loadtests.harness.gateway import CLIENT_KEY, GatewayServer
from loadtests.replay.driver import Driver, TurnResult
from loadtests.replay.workload import Turn, WorkloadParams
from proxy import auth
from proxy.certs import CertFiles
from proxy.observe.stats import quantile
from proxy.vllm_wire import Family, counter_sample

MODEL = "tiny"
WAIT_MODE = "admission-wait-"  # + max_wait_s, unscaled
ROOT = Path(__file__).resolve().parents[2]
# The engine's counters read for each mode, by what they are called here.
COUNTERS = {
    "queries": counter_sample(Family.PREFIX_CACHE_QUERIES),
    "hits": counter_sample(Family.PREFIX_CACHE_HITS),
    "prompt": counter_sample(Family.PROMPT_TOKENS),
    "cached": counter_sample(Family.PROMPT_TOKENS_CACHED),
    "preemptions": counter_sample(Family.PREEMPTIONS),
}


def _vocabulary() -> tuple[list[str], list[str]]:
    """The words and symbols the tiny model's tokenizer was trained on (scripts/vllm_models.py):
    each is one token there and one in the simulator's tokenizer."""
    spec = importlib.util.spec_from_file_location("vllm_models", ROOT / "scripts/vllm_models.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module._WORDS), list(module._SYMBOLS)


WORDS, SYMBOLS = _vocabulary()


def text(rng: random.Random, tokens: int) -> str:
    """About `tokens` tokens of code-like lines, the same count in both tokenizers, ~4 bytes a
    token (what the gateway assumes of a prompt it has not seen counted)."""
    lines: list[str] = []
    n = 0
    while n < tokens:
        k = rng.randint(3, 12)
        lines.append(
            " ".join(
                rng.choice(WORDS) if rng.random() < 0.7 else rng.choice(SYMBOLS) for _ in range(k)
            )
        )
        n += k + 1
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class KvWorkload:
    """Sizes in tokens (the same in the tiny model's tokenizer and the simulator's: `text`)."""

    sessions: int = 4
    turns: int = 4
    context: int = 1300  # each session's own prefix (its repository context)
    new_tokens: int = 130  # tool output appended after each turn
    gen_tokens: int = 16  # generated per turn, exactly (min_tokens = max_tokens)
    think_s: float = 0.5  # between a session's turns, unscaled
    seed: int = 0

    @property
    def turn_tokens(self) -> int:
        """What one turn adds to a session's prefix: the answer, the tool output, the chat
        template's few tokens around them."""
        return self.gen_tokens + self.new_tokens + 16

    def params(self) -> WorkloadParams:
        """The replay's parameters, for its driver (think time, agents, the request's shape)."""
        return WorkloadParams(
            agents=self.sessions,
            turns=self.turns,
            gen_tokens=self.gen_tokens,
            think_s=self.think_s,
            temperatures=(0.0,),  # greedy: the same answers, so the same prompts, in each mode
            tools=0,
            subagent_rate=0.0,
            model=MODEL,
            seed=self.seed,
        )


class KvSession:
    """One session of the workload, with the replay's Session's interface (its driver's): the
    system prompt holds the session's own context; each turn appends the answer and a tool
    output."""

    def __init__(self, workload: KvWorkload, number: int) -> None:
        self.workload = workload
        self.key = (workload.seed, 0, number, False)  # as the replay's: names it (x-session-id)
        self.rng = random.Random(f"{workload.seed}:{number}")
        head = "You are a coding agent working in a repository.\n# Repository context\n"
        self.messages = [
            {"role": "system", "content": head + text(self.rng, workload.context)},
            {"role": "user", "content": f"Task {number}: make the tests pass."},
        ]
        self.turns_left = workload.turns

    @property
    def done(self) -> bool:
        return self.turns_left <= 0

    def next_turn(self) -> Turn:
        gen = self.workload.gen_tokens
        return Turn("chat", list(self.messages), gen, 0.0, 0)

    def record(self, answer: str, generated: int) -> None:
        self.turns_left -= 1
        output = text(self.rng, self.workload.new_tokens)
        self.messages.append({"role": "assistant", "content": answer})
        self.messages.append({"role": "user", "content": f"Tool output:\n{output}"})

    def spawns_subagent(self) -> bool:
        return False


class _FixedDriver(Driver):
    """The replay's driver, but one session per agent, run to its end (the deadline a cap)."""

    def __init__(self, workload: KvWorkload, target: str, **kw: Any) -> None:
        super().__init__(workload.params(), target, **kw)
        self.workload = workload

    async def _agent(self, agent: int) -> None:
        session: Any = KvSession(self.workload, agent)
        await self._session(session, agent, 0)


@dataclass(slots=True)
class ModeResult:
    mode: str
    turns: int
    errors: int
    wall_s: float  # unscaled
    queries: float
    hits: float
    prompt: float
    cached: float
    preemptions: float
    turn_s_max: float
    ttft_s_p50: float

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0

    @property
    def prefilled_per_turn(self) -> float:
        return (self.prompt - self.cached) / self.turns if self.turns else 0.0

    def row(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "hit_rate": self.hit_rate,
            "prefilled_per_turn": self.prefilled_per_turn,
        }


def counters(engine_url: str) -> dict[str, float]:
    """COUNTERS from one engine's /metrics, summed over their labels."""
    page = httpx.get(f"{engine_url}/metrics", timeout=10).text
    wanted = {sample: name for name, sample in COUNTERS.items()}
    out = dict.fromkeys(COUNTERS, 0.0)
    for family in text_string_to_metric_families(page):
        for s in family.samples:
            if s.name in wanted:
                out[wanted[s.name]] += s.value
    return out


def run_mode(
    mode: str,
    workload: KvWorkload,
    target: str,
    engine_url: str,
    *,
    verify: Any = True,
    api_key: str | None = None,
    time_scale: float = 1.0,
    cap_s: float = 300.0,
) -> ModeResult:
    """The workload once against `target` (the engine or a gateway), counted on the engine."""
    before = counters(engine_url)
    driver = _FixedDriver(
        workload,
        target,
        time_scale=time_scale,
        duration_s=cap_s,
        verify=verify,
        api_key=api_key,
    )
    t0 = time.monotonic()
    turns: list[TurnResult] = asyncio.run(driver.run())
    wall = (time.monotonic() - t0) / time_scale
    after = counters(engine_url)
    ok = [t for t in turns if t.error is None]
    d = {k: after[k] - before[k] for k in COUNTERS}
    ttfts = sorted(t.ttft_s for t in ok if t.ttft_s is not None)
    return ModeResult(
        mode,
        len(ok),
        len(turns) - len(ok),
        wall,
        d["queries"],
        d["hits"],
        d["prompt"],
        d["cached"],
        d["preemptions"],
        max((t.turn_s for t in ok), default=0.0),
        quantile(ttfts, 0.5) or 0.0,
    )


def admission_settings(workload: KvWorkload, time_scale: float = 1.0) -> dict[str, Any]:
    """The policy's `admission.sessions` for this workload: a session idle for twice its think
    time and half a second has ended (the workload has no other end a gateway could see; at the
    simulator's time scale, scaled); no forced turnover; `turn_tokens` what a turn adds."""
    return {
        "enabled": True,
        "max_wait_s": None,
        "idle_s": round((2 * workload.think_s + 0.5) * time_scale, 3),
        "fit_fraction": 0.9,
        "turn_tokens": workload.turn_tokens,
    }


def gateway_policy(
    engine_url: str,
    *,
    kv_tokens: int,
    max_num_seqs: int,
    admission: dict[str, Any] | None,
) -> dict[str, Any]:
    """One vLLM backend behind one route, sticky sessions, and `admission.sessions` (None:
    without admission)."""
    doc: dict[str, Any] = {
        "schema": 1,
        "backends": {
            "small-kv": {
                "url": engine_url,
                "kind": "vllm",
                "served_model_name": MODEL,
                "max_concurrency": max_num_seqs,  # the engine's --max-num-seqs
                "kv_tokens": kv_tokens,
                "startup_s": 0,
            }
        },
        "routes": {"agents": {"models": [MODEL], "variants": ["small-kv"], "defaults": {}}},
        "clients": [{"name": "agent", "key_sha256": auth.hash_key(CLIENT_KEY)}],
    }
    if admission is not None:
        doc["admission"] = {"sessions": admission}
    return doc


def compare(
    workload: KvWorkload,
    engine: Callable[[], AbstractContextManager[str]],
    *,
    certs: CertFiles | None,
    policy: Callable[[str], dict[str, Any]],
    time_scale: float = 1.0,
    modes: tuple[str, ...] = ("straight", "admission"),
) -> dict[str, ModeResult]:
    """Each mode on a fresh engine cache: `engine()` yields the engine's URL (emptied), and
    `policy(url)` is the gateway's policy for the "admission" mode ("gateway": the same without
    `admission`; "admission-wait-S": with `max_wait_s` S, unscaled)."""
    out: dict[str, ModeResult] = {}
    for mode in modes:
        with engine() as url:
            if mode == "straight":
                out[mode] = run_mode(mode, workload, url, url, time_scale=time_scale)
                continue
            doc = policy(url)
            if mode == "gateway":
                doc.pop("admission", None)
            elif mode.startswith(WAIT_MODE):
                wait = float(mode.removeprefix(WAIT_MODE)) * time_scale
                doc["admission"]["sessions"]["max_wait_s"] = wait
            with _gateway(doc, certs) as (base, verify):
                out[mode] = run_mode(
                    mode,
                    workload,
                    base,
                    url,
                    verify=verify,
                    api_key=CLIENT_KEY,
                    time_scale=time_scale,
                )
    return out


@contextlib.contextmanager
def _gateway(doc: dict[str, Any], certs: CertFiles | None) -> Iterator[tuple[str, Any]]:
    with GatewayServer(doc, certs=certs) as gw:
        yield gw.base, ssl.create_default_context(cafile=str(gw.certs.ca_cert))
