"""What the sweep compares: each configuration's devices, engines and gateway policy.

A configuration is a set of simulated devices (one `specrouter sim` process each: engines on one
device share its clock and memory, loadtests/sim/device.py), the device model's `overlap`
(0: co-located steps serialise; 0.6: partial overlap, the figure tests/probe/test_probe_pair.py
recovers) and either no gateway (`direct`) or a policy file cut to the engines the configuration
has (loadtests.bench.sweep.policy.restrict: backends on the simulators' URLs, rules naming an
absent variant dropped, the bench client's key).

An engine alone on its device gets the KV budget `specrouter deploy render` gives the deployed
engine (the machine's limit, `specrouter sim --kv-budget machine`; the sweeps published in docs/
before it ran at the documents' 36 GiB, `--kv-budget documents`); co-located engines split the
machine as `deploy render` does (loadtests/sim/colocate.py).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

POLICIES = Path(__file__).resolve().parents[3] / "policies"
THREE = Path(__file__).resolve().parent / "gb10-three.yaml"  # the former default: `gb10@...`
# The block 7 + block 5 pair the sweep measured (policies/gb10-pair.yaml shipped it until the
# sessions sweep found two identical engines ahead: docs/sessions-sweep.md).
PAIR = Path(__file__).resolve().parent / "pair-block5.yaml"
ROUTE = "coder"
SERIAL, PARTIAL = 0.0, 0.6  # the device model's two contention settings
# The policies' coding backends and the simulated profile each runs (policy.profile_for
# matches them on `speculative`; tests/bench/test_sweep.py checks they agree).
PROFILES = {
    "coder-dflash7": "dflash7-prob-block",
    "coder-dflash5": "dflash5-prob-block",
    "coder-mtp3": "mtp3",
    "coder-dflash7b": "dflash7-prob-block",  # a second, identical block-7 engine (the twins)
}


@dataclass(frozen=True, slots=True)
class Config:
    name: str
    what: str  # one line for docs/sweep.md and the table
    devices: tuple[tuple[str, ...], ...]  # backends per device
    overlap: float = SERIAL
    policy: Path | None = None  # None: the first engine straight, no gateway
    machines: int = 1  # GB10s it needs: the verdict compares like with like
    kv_budget: str = "machine"  # `specrouter sim --kv-budget` of an engine alone on a device
    # The policy document as the configuration changes it, before it is cut to the engines
    # (the sessions sweep: admission settings, the identical twin engines).
    edit: Callable[[dict[str, Any]], dict[str, Any]] | None = None

    @property
    def engines(self) -> tuple[str, ...]:
        return tuple(b for dev in self.devices for b in dev)

    @property
    def colocated(self) -> bool:
        return any(len(dev) > 1 for dev in self.devices)


def _both(name: str, what: str, devices: tuple[tuple[str, ...], ...], policy: Path) -> list[Config]:
    return [
        Config(f"{name}@serial", f"{what}; co-located steps serialise", devices, SERIAL, policy),
        Config(
            f"{name}@overlap{PARTIAL:g}",
            f"{what}; co-located steps overlap {PARTIAL:g}",
            devices,
            PARTIAL,
            policy,
        ),
    ]


def all_configs() -> list[Config]:
    d7, d5, mtp = "coder-dflash7", "coder-dflash5", "coder-mtp3"
    return [
        Config(
            "direct",
            "the deployed engine straight, no gateway: DFlash2 block 7 probabilistic + block, "
            "whole machine (a client that sets nothing gets the checkpoint's 1.0)",
            ((d7,),),
        ),
        *(
            Config(
                f"alone-{b.removeprefix('coder-')}",
                f"{b} alone through the gateway (gb10-three.yaml cut to it: 0.7 default, clamps, "
                "health), whole machine",
                ((b,),),
                policy=THREE,
            )
            for b in (d7, d5, mtp)
        ),
        *_both(
            "gb10",
            "gb10-three.yaml (the former default): three engines on one GB10, memory "
            "split as rendered",
            ((d7, d5, mtp),),
            THREE,
        ),
        *_both(
            "pair",
            "the block 7 + block 5 pair (pair-block5.yaml) on one GB10, sessions sticky",
            ((d7, d5),),
            PAIR,
        ),
        Config(
            "gb10-2dev",
            "gb10-three.yaml on two GB10s: block 7 alone on one; block 5 and the MTP "
            "fallback (idle unless a rule sends it traffic) share the other",
            ((d7,), (d5, mtp)),
            policy=THREE,
            machines=2,
        ),
        Config(
            "pair-2dev",
            "the block 7 + block 5 pair (pair-block5.yaml) on two GB10s, one engine each (whole "
            "machine each)",
            ((d7,), (d5,)),
            policy=PAIR,
            machines=2,
        ),
    ]


def by_name(names: list[str] | None) -> list[Config]:
    configs = all_configs()
    if not names:
        return configs
    known = {c.name: c for c in configs}
    missing = [n for n in names if n not in known]
    if missing:
        raise ValueError(
            f"unknown configuration(s) {', '.join(missing)} (one of {', '.join(known)})"
        )
    return [known[n] for n in names]


# The policy's durations of sessions' time (admission waits and residency, the fairness window):
# the gateway reads them on its own clock, the simulator runs `time_scale` times faster.
SCALED: tuple[tuple[str, ...], ...] = (
    ("admission", "queue_timeout_s"),
    ("admission", "sessions", "max_wait_s"),
    ("admission", "sessions", "idle_s"),
    ("admission", "sessions", "place_kept_s"),
    ("admission", "sessions", "stream_wait_s"),
    ("fairness", "window_s"),
)


def scaled(doc: dict[str, Any], time_scale: float) -> dict[str, Any]:
    """`doc` with the SCALED durations of each block it has (stated, or the schema's default)
    on the simulator's clock: a 600 s `max_wait_s` is 30 wall seconds at time scale 0.05."""
    from policies.spec.admission import AdmissionSpec, SessionAdmissionSpec
    from policies.spec.fairness import FairnessSpec

    specs: dict[tuple[str, ...], Any] = {
        ("admission",): AdmissionSpec,
        ("admission", "sessions"): SessionAdmissionSpec,
        ("fairness",): FairnessSpec,
    }
    out = copy.deepcopy(doc)
    for path in SCALED:
        *parents, leaf = path
        block: Any = out
        for name in parents:
            block = block.get(name) if isinstance(block, dict) else None
        if not isinstance(block, dict):
            continue
        value = block.get(leaf, specs[tuple(parents)].model_fields[leaf].default)
        if isinstance(value, int | float):
            block[leaf] = value * time_scale
    return out


def gateway_policy(
    config: Config, urls: dict[str, str], key_sha: str, time_scale: float = 1.0
) -> dict[str, Any]:
    """The configuration's policy on the simulated engines, for the bench client's key, its
    session durations on the simulator's clock (`scaled`)."""
    from loadtests.bench.sweep.policy import restrict

    assert config.policy is not None
    doc = yaml.safe_load(config.policy.read_text())
    if config.edit is not None:
        doc = config.edit(doc)
    doc = scaled(doc, time_scale)
    out = restrict(doc, ROUTE, list(config.engines), urls, key_sha)
    out["clients"][0]["may_pin"] = False  # the agents are ordinary clients
    return out
