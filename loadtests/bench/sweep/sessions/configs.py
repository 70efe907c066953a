"""The sessions sweep's configurations and its schedule, in priority order.

Configurations (the sweep package's `Config`: devices, policy, KV budget):
- `straight-documents`, `straight-machine`: the deployed engine (DFlash2 block 7, probabilistic +
  block) straight, no gateway, at the source documents' 36 GiB KV budget or the machine's limit;
- `admit-documents`, `admit-machine`: policies/gb10.yaml cut to that engine, through the gateway,
  with session-aware admission on (`max_wait_s` 600), at each budget;
- `admit-documents-w240`, `admit-documents-wnone`: the same with `max_wait_s` 240 and unlimited
  (only at 12 and 16 agents, where the documents' budget cannot hold every session);
- `gateway-documents`, `gateway-machine`: the control: the same policy through the gateway with
  admission off, so what admission did is told from what the gateway's path does;
- `pair-2dev`: the former policies/gb10-pair.yaml (loadtests/bench/sweep/pair-block5.yaml) on
  two GB10s (block 7 on one, block 5 on the other, a new session placed by load, then sticky);
- `twins-2dev`: policies/gb10-pair.yaml since this sweep: two identical block-7 engines, one per
  GB10, a new session placed by a hash of its key (50/50) and then sticky: what any
  session-affine balancer does.

Stages run in priority order; within a stage every repeat runs every cell, and within a cell
every configuration once, rotated per repeat and cell.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loadtests.bench.sweep.configs import PAIR, POLICIES, PROFILES, Config

SHIPPED_PAIR = POLICIES / "gb10-pair.yaml"  # two identical block-7 engines, since this sweep

GB10 = POLICIES / "gb10.yaml"
D7 = "coder-dflash7"
WAITS = {"": 600, "-w240": 240, "-wnone": None}  # max_wait_s per name suffix


def engine_kv_tokens(budget: str) -> int:
    """The KV tokens the simulator gives the block-7 engine alone on a GB10 at `budget`."""
    from loadtests.sim.colocate import EngineSpec, kv_tokens
    from loadtests.sim.profiles import BUILTIN_PROFILES

    profile = PROFILES[D7]
    [n] = kv_tokens(
        [EngineSpec(D7, 0, profile, None)], {profile: BUILTIN_PROFILES[profile]}, budget
    )
    return n


def admission(
    budget: str, max_wait_s: int | None, *, enabled: bool = True, keepalive_s: float | None = None
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """gb10.yaml with session-aware admission on (its contract: docs/sessions.md), or off
    (the control). The engine's KV tokens are stated: the simulator's cache_config_info leaves
    num_gpu_blocks unset, as vLLM does before it has profiled its memory."""

    def edit(doc: dict[str, Any]) -> dict[str, Any]:
        out = copy.deepcopy(doc)
        out["backends"][D7]["kv_tokens"] = engine_kv_tokens(budget)
        out["backends"][D7].pop("repair", None)  # names an operator file's action: none here
        out.setdefault("admission", {})["sessions"] = {
            "enabled": enabled,
            "max_wait_s": max_wait_s,
            "idle_s": 60,
            "fit_fraction": 0.9,
        }
        out.setdefault("deployment", {})["kv_budget_gib"] = budget
        # The gateway's pings are in its own (wall) seconds: `keepalive_s` already scaled, or
        # none, as these configurations ran before the shipped policy had them.
        route = out["routes"]["coder"]
        route.pop("keepalive_s", None)
        if keepalive_s is not None:
            route["keepalive_s"] = keepalive_s
        return out

    return edit


def all_configs() -> list[Config]:
    out = [
        Config(
            f"straight-{b}",
            f"the deployed engine straight, no gateway, KV budget {b}",
            ((D7,),),
            kv_budget=b,
        )
        for b in ("documents", "machine")
    ]
    for b in ("documents", "machine"):
        for suffix, wait in WAITS.items():
            if suffix and b == "machine":
                continue
            out.append(
                Config(
                    f"admit-{b}{suffix}",
                    f"policies/gb10.yaml through the gateway, session admission on, max_wait_s "
                    f"{'unlimited' if wait is None else wait}, KV budget {b}",
                    ((D7,),),
                    policy=GB10,
                    kv_budget=b,
                    edit=admission(b, wait),
                )
            )
    out += [
        Config(
            f"gateway-{b}",
            f"policies/gb10.yaml through the gateway, session admission off, KV budget {b}",
            ((D7,),),
            policy=GB10,
            kv_budget=b,
            edit=admission(b, 600, enabled=False),
        )
        for b in ("documents", "machine")
    ]
    # Impatient agents (the replay's watchdogs, `IMPATIENT`): straight, and through the gateway
    # with the shipped policy's pings (15 s, scaled to the sweep's time scale 0.05).
    out += [
        Config(
            "impatient-straight-documents",
            "the deployed engine straight, impatient agents, KV budget documents",
            ((D7,),),
            kv_budget="documents",
        ),
        Config(
            "impatient-pings-documents",
            "policies/gb10.yaml through the gateway, pings every 15 s, session admission off, "
            "impatient agents, KV budget documents",
            ((D7,),),
            policy=GB10,
            kv_budget="documents",
            edit=admission("documents", 600, enabled=False, keepalive_s=15 * 0.05),
        ),
    ]
    out += [
        Config(
            "pair-2dev",
            "the former policies/gb10-pair.yaml (loadtests/bench/sweep/pair-block5.yaml) on two "
            "GB10s: block 7 on one, block 5 on the other, sessions placed by load then sticky",
            ((D7,), ("coder-dflash5",)),
            policy=PAIR,
            machines=2,
        ),
        Config(
            "twins-2dev",
            "policies/gb10-pair.yaml: two identical block-7 engines on two GB10s, sessions placed "
            "50/50 by key hash then sticky (a session-affine balancer)",
            ((D7,), (D7 + "b",)),
            policy=SHIPPED_PAIR,
            machines=2,
        ),
    ]
    return out


BY_NAME = {c.name: c for c in all_configs()}
# Whose agents keep the pinned agents' watchdogs and resend (loadtests/replay/watchdogs.py);
# the others' wait, as they did when they ran.
IMPATIENT = frozenset(n for n in BY_NAME if n.startswith("impatient-"))


@dataclass(frozen=True, slots=True)
class Stage:
    name: str
    agents: tuple[int, ...]
    temperatures: tuple[str, ...]
    configs: tuple[str, ...]


STRAIGHT = ("straight-documents", "straight-machine")
ADMIT = ("admit-documents", "admit-machine")
WAIT = ("admit-documents-w240", "admit-documents-wnone")
# The order: (a) the straight budgets at 16 and 8 agents, (b) admission at 16 and 12,
# then the rest; the two-GB10 comparison after (b).
STAGES = (
    Stage("a", (16, 8), ("0.7",), STRAIGHT),
    Stage("b", (16, 12), ("0.7",), (*STRAIGHT, *ADMIT, *WAIT)),
    Stage("pair", (16, 8), ("0.7",), ("pair-2dev", "twins-2dev")),
    Stage("c-low", (4,), ("0.7",), (*STRAIGHT, *ADMIT)),
    Stage("c-one", (1, 2), ("0.7", "unset"), (*STRAIGHT, *ADMIT)),
    Stage("c-8", (8,), ("0.7",), ADMIT),
    # The control: what the gateway's path does with admission off, where it fits and where not.
    Stage("ctl", (8, 16), ("0.7",), ("gateway-machine", "gateway-documents")),
    # Impatient agents where the waits are longest: straight against the gateway's pings.
    Stage(
        "impatient", (16,), ("0.7",), ("impatient-straight-documents", "impatient-pings-documents")
    ),
)


@dataclass(frozen=True, slots=True)
class Run:
    stage: str
    repeat: int
    agents: int
    temperature: str
    config: str

    @property
    def key(self) -> tuple[str, int, str, int]:
        return (self.config, self.agents, self.temperature, self.repeat)


def schedule(
    repeats: int, stages: tuple[Stage, ...] = STAGES, *, only: set[str] | None = None
) -> list[Run]:
    """Every run, in priority order, each (configuration, cell, repeat) once."""
    out: list[Run] = []
    seen: set[tuple[str, int, str, int]] = set()
    for stage in stages:
        if only is not None and stage.name not in only:
            continue
        n = len(stage.configs)
        cells = [(a, t) for a in stage.agents for t in stage.temperatures]
        for r in range(repeats):
            for c, (agents, temp) in enumerate(cells):
                shift = (r + c) % n
                for name in stage.configs[shift:] + stage.configs[:shift]:
                    run = Run(stage.name, r, agents, temp, name)
                    if run.key not in seen:  # a later stage does not repeat an earlier one's
                        seen.add(run.key)
                        out.append(run)
    return out
