"""Backend profiles: what a simulated GB10 engine does per step, by speculative configuration.

Every number here is derived from `shared/GB10-facts.md` (temperature 0.7, the probe's N concurrent
long code streams). The derivation is the same for every row:

* acceptance (tokens per target step, T) at one stream comes from the facts column; the
  per-position shape is the probe's (MTP: 75/57/44 %, DFlash2 greedy: 75/52/36/28/22/15/12 %)
  rescaled so that 1 + sum(marginals) = T. The facts give per-position figures and per-block
  totals from different runs that do not agree exactly; the totals win because they are what the
  throughput table was measured with.
* step time at N streams = N x T(N) / (aggregate decode tokens/s at N). So a table row reproduces
  the measured throughput by construction, and `loadtests/probe/calibrate.py` checks that the running
  server (batching, prefill, timers, HTTP) still does.

Marginals are *unconditional* per-position rates, as vLLM's
`spec_decode_num_accepted_tokens_per_pos_total / spec_decode_num_drafts_total` reports them;
the engine turns them into conditional probabilities (position j only if j-1 was accepted).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

# The DFlash2 per-position shape measured on the probe (positions 1-7, greedy draft).
_DFLASH_SHAPE = (0.75, 0.52, 0.36, 0.28, 0.22, 0.15, 0.12)
# MTP on production traffic (positions 1-3).
_MTP_SHAPE = (0.75, 0.57, 0.44)

# Prefill speed of the coding engine (facts: ~2,000 tokens/s, a 4,000-token prefill takes ~2 s).
PREFILL_TOKENS_PER_S = 2000.0


def _rescale(shape: tuple[float, ...], k: int, tokens_per_step: float) -> tuple[float, ...]:
    """Per-position marginals with the given shape whose total gives `tokens_per_step`."""
    head = shape[:k]
    factor = (tokens_per_step - 1.0) / sum(head)
    return tuple(round(x * factor, 4) for x in head)


def _blend(a: tuple[float, ...], b: tuple[float, ...], w: float) -> tuple[float, ...]:
    return tuple(round(x + (y - x) * w, 4) for x, y in zip(a, b, strict=True))


def _ramp(
    low: tuple[float, ...], high: tuple[float, ...], totals: dict[int, float]
) -> dict[int, tuple[float, ...]]:
    """Anchors whose totals follow `totals` (tokens/step by batch), blending two shapes.

    The probabilistic-draft rows accept more per step as N grows (facts: 3.0 -> 3.9 for block 5);
    each anchor mixes the one-stream shape and the sixteen-stream shape to hit that total.
    """
    lo, hi = 1.0 + sum(low), 1.0 + sum(high)
    return {n: _blend(low, high, (t - lo) / (hi - lo)) for n, t in totals.items()}


@dataclass(frozen=True, slots=True)
class Profile:
    """One simulated engine configuration (one vLLM `--speculative-config`, or none)."""

    name: str
    kind: str = "generate"  # "generate" | "embed"
    description: str = ""
    served_model_name: str = "qwen3.8-27b"
    model_path: str = "/models/Qwen3.8-27B-NVFP4"
    max_model_len: int = 262144
    speculative_config: dict[str, Any] | None = None
    num_spec_tokens: int = 0
    # batch size -> target step time in ms (unscaled), interpolated linearly in between.
    step_ms: dict[int, float] = field(default_factory=lambda: {1: 63.0})
    # batch size -> per-position marginal acceptance at temperature 0.7, interpolated in log2(N).
    acceptance: dict[int, tuple[float, ...]] = field(default_factory=dict)
    # Multiplier on the marginals at temperature 1.0 relative to 0.7 (linear in temperature).
    temp1_accept_factor: float = 1.0
    # Per-request content variance: sigma of a log-normal multiplier on the marginals,
    # at temperature 0.7 and at 1.0 (block drafters scatter far more at 1.0).
    content_sigma_07: float = 0.0
    content_sigma_10: float = 0.0
    prefill_tokens_per_s: float = PREFILL_TOKENS_PER_S
    # KV tokens in the documents' 36 GiB (GB10-facts); `specrouter sim` sizes the engine from the
    # memory model instead (colocate.py, --kv-budget), this figure being its `documents` budget.
    kv_cache_tokens: int = 813_427
    block_size: int = 16
    embed_dim: int = 1024
    # Embedding throughput (tokens/s) for the embed profile.
    embed_tokens_per_s: float = 20_000.0

    # -- step time ---------------------------------------------------------------------------

    def step_seconds(self, batch: int) -> float:
        """Unscaled duration of one engine step with `batch` sequences scheduled."""
        points = sorted(self.step_ms.items())
        b = max(1, batch)
        if len(points) == 1:
            return points[0][1] / 1000.0
        if b <= points[0][0]:
            return points[0][1] / 1000.0
        for (n0, t0), (n1, t1) in zip(points, points[1:], strict=False):
            if b <= n1:
                return (t0 + (t1 - t0) * (b - n0) / (n1 - n0)) / 1000.0
        # Beyond the table: extend the last segment's slope (more sequences, more work).
        (n0, t0), (n1, t1) = points[-2], points[-1]
        return (t1 + (t1 - t0) * (b - n1) / (n1 - n0)) / 1000.0

    # -- acceptance ----------------------------------------------------------------------------

    def marginals(self, batch: int) -> tuple[float, ...]:
        """Per-position marginal acceptance at `batch` decoding sequences (temperature 0.7)."""
        if not self.acceptance or self.num_spec_tokens == 0:
            return ()
        points = sorted(self.acceptance.items())
        b = max(1, batch)
        if b <= points[0][0]:
            return points[0][1]
        for (n0, v0), (n1, v1) in zip(points, points[1:], strict=False):
            if b <= n1:
                w = (math.log2(b) - math.log2(n0)) / (math.log2(n1) - math.log2(n0))
                return _blend(v0, v1, w)
        return points[-1][1]

    def temperature_factor(self, temperature: float) -> float:
        """Acceptance multiplier for a sampling temperature (1.0 at the probe's 0.7)."""
        t = min(max(temperature, 0.0), 1.5)
        f = 1.0 + (self.temp1_accept_factor - 1.0) * (t - 0.7) / 0.3
        # Below 0.7 acceptance rises, but not without bound (greedy sampling is not a perfect
        # draft); above 1.0 it keeps falling.
        return min(max(f, 0.2), 1.15)

    def content_sigma(self, temperature: float) -> float:
        t = min(max(temperature, 0.0), 1.5)
        s = (
            self.content_sigma_07
            + (self.content_sigma_10 - self.content_sigma_07) * (t - 0.7) / 0.3
        )
        return max(s, 0.0)

    def draft_tokens(self, batch: int) -> int:
        """K for a step with `batch` running sequences: vLLM's batch-size schedule
        (`num_speculative_tokens_per_batch_size`, looked up per step by its scheduler: 0.28.0
        v1/core/sched/scheduler.py:1256), capped at num_spec_tokens; a gap or the tail past the
        last range keeps the previous range's K (v1/spec_decode/dynamic/utils.py:100-131)."""
        schedule = (self.speculative_config or {}).get("num_speculative_tokens_per_batch_size")
        k = self.num_spec_tokens
        for start, _end, scheduled in schedule or ():
            if batch < start:
                break
            k = min(int(scheduled), self.num_spec_tokens)
        return k

    def tokens_per_step(self, batch: int = 1) -> float:
        """Expected accepted tokens per target step (bonus included), temperature 0.7."""
        return 1.0 + sum(self.marginals(batch))

    def to_public(self) -> dict[str, Any]:
        """What `/version` reports about the profile."""
        return {
            "name": self.name,
            "kind": self.kind,
            "num_spec_tokens": self.num_spec_tokens,
            "max_model_len": self.max_model_len,
        }


# -- built-in profiles -------------------------------------------------------------------------
#
# Facts (aggregate decode tokens/s at 1, 2, 4, 8, 16 streams; tokens/step at one stream):
#   mtp3            20.8  39.7  81.2 124.4 202.7   2.55
#   dflash7-greedy  26.0  52.3  81.0 135.2 192.6   3.16
#   dflash5-greedy  28.5  47.5  91.4 137.4 216.1   3.45
#   dflash4-greedy  23.0  47.8  94.2 142.4 229.7   2.77
#   dflash5-prob    25.7  57.1 101.2 163.5 246.0   3.0-3.9 across N
#   dflash5-prob-block  29.3 (one stream only), 3.18-3.92
#   dflash7-prob-block  34.8, +9 % / -3.5 % / -3.5 % vs block 5 at 2 / 4 / 16, 3.85-4.83
# The facts' "~121-123 ms per step at one stream for every config" fixes T(1) for the rows that
# only give a range: T(1) = tokens/s x 121.5 ms.

_DFLASH_BASE = {"method": "dflash", "model": "z-lab/Qwen3.8-27B-DFlash2"}


def _steps(tokens_per_step: dict[int, float], tok_s: dict[int, float]) -> dict[int, float]:
    """step_ms[N] = N x T(N) / tokens_per_s(N), in ms, rounded to 0.1 ms."""
    return {n: round(1000.0 * n * tokens_per_step[n] / tok_s[n], 1) for n in tok_s}


def _flat(t: float) -> dict[int, float]:
    return {n: t for n in (1, 2, 4, 8, 16)}


def _builtin() -> dict[str, Profile]:
    profiles: dict[str, Profile] = {}

    def add(p: Profile) -> None:
        profiles[p.name] = p

    # MTP head, 3 drafts. Probe acceptance 52 % (T = 2.55); production shape.
    add(
        Profile(
            name="mtp3",
            description="MTP head, 3 draft tokens (built into the model)",
            speculative_config={"method": "mtp", "num_speculative_tokens": 3},
            num_spec_tokens=3,
            step_ms=_steps(_flat(2.55), {1: 20.8, 2: 39.7, 4: 81.2, 8: 124.4, 16: 202.7}),
            acceptance={1: _rescale(_MTP_SHAPE, 3, 2.55)},
            # 52 % -> 43 % draft acceptance at 1.0 (18.5 tokens/s at one stream).
            temp1_accept_factor=0.827,
            content_sigma_07=0.03,
            content_sigma_10=0.06,
            kv_cache_tokens=1_014_892,
        )
    )
    for k, tps, tok_s, t1 in (
        (7, 3.16, {1: 26.0, 2: 52.3, 4: 81.0, 8: 135.2, 16: 192.6}, 0.91),
        (5, 3.45, {1: 28.5, 2: 47.5, 4: 91.4, 8: 137.4, 16: 216.1}, 0.63),
        (4, 2.77, {1: 23.0, 2: 47.8, 4: 94.2, 8: 142.4, 16: 229.7}, 0.884),
    ):
        # temp1 factors: block 7 averaged 24.4 tokens/s at 1.0 over four runs (32.5 ... 17.1),
        # block 5 21.0 (19.8, 22.1), block 4 21.3 (22.3, 20.3), at one stream.
        add(
            Profile(
                name=f"dflash{k}-greedy",
                description=f"DFlash2, block {k}, greedy draft",
                speculative_config={**_DFLASH_BASE, "num_speculative_tokens": k},
                num_spec_tokens=k,
                step_ms=_steps(_flat(tps), tok_s),
                acceptance={1: _rescale(_DFLASH_SHAPE, k, tps)},
                temp1_accept_factor=t1,
                content_sigma_07=0.05,
                # Same prompt family, acceptance 43 % down to 16 % at 1.0: a wide spread.
                content_sigma_10=0.35,
                kv_cache_tokens=838_501 if k <= 5 else 813_427,
            )
        )

    # Probabilistic draft, block 5: acceptance rises with N (3.0 -> 3.9).
    prob5_t = {1: 3.12, 2: 3.45, 4: 3.6, 8: 3.75, 16: 3.9}
    prob5_tok_s = {1: 25.7, 2: 57.1, 4: 101.2, 8: 163.5, 16: 246.0}
    add(
        Profile(
            name="dflash5-prob",
            description="DFlash2, block 5, draft_sample_method: probabilistic",
            speculative_config={
                **_DFLASH_BASE,
                "num_speculative_tokens": 5,
                "draft_sample_method": "probabilistic",
            },
            num_spec_tokens=5,
            step_ms=_steps(prob5_t, prob5_tok_s),
            acceptance=_ramp(
                _rescale(_DFLASH_SHAPE, 5, 3.12), (0.88, 0.70, 0.55, 0.43, 0.34), prob5_t
            ),
            # 26.0 tokens/s at 1.0 vs 25.7 at 0.7: coupling the draft's randomness to the
            # target's matters most when the target is most random.
            temp1_accept_factor=1.017,
            content_sigma_07=0.05,
            content_sigma_10=0.15,
            kv_cache_tokens=838_501,
        )
    )

    # Probabilistic + block verification, block 5. Only the one-stream cell is measured
    # (29.3 tokens/s); elsewhere the facts say the pair's worst case is -2 % vs probabilistic
    # alone, so the model tracks dflash5-prob at 0.99x from two streams on.
    pb5_t = {1: 3.56, 2: 3.6, 4: 3.7, 8: 3.8, 16: 3.92}
    pb5_tok_s = {1: 29.3, **{n: round(v * 0.99, 1) for n, v in prob5_tok_s.items() if n > 1}}
    add(
        Profile(
            name="dflash5-prob-block",
            description="DFlash2, block 5, probabilistic draft + block verification",
            speculative_config={
                **_DFLASH_BASE,
                "num_speculative_tokens": 5,
                "draft_sample_method": "probabilistic",
                "rejection_sample_method": "block",
            },
            num_spec_tokens=5,
            step_ms=_steps(pb5_t, pb5_tok_s),
            acceptance=_ramp((0.85, 0.62, 0.45, 0.35, 0.29), (0.90, 0.70, 0.52, 0.44, 0.36), pb5_t),
            temp1_accept_factor=0.78,  # 24.7 tokens/s at 1.0 vs 29.3 at 0.7
            content_sigma_07=0.06,
            content_sigma_10=0.15,
            kv_cache_tokens=838_501,
        )
    )

    # The deployed configuration: probabilistic + block, block 7. Relative facts are applied to
    # dflash5-prob (the only block-5 row measured at every N): +9 % at 2, -3.5 % (middle of
    # -2...5 %) at 4 and 16; 8 streams has no fact and takes -3.5 % too.
    pb7_t = {1: 4.23, 2: 4.5, 4: 4.6, 8: 4.7, 16: 4.8}
    pb7_tok_s = {1: 34.8, 2: 57.1 * 1.09, 4: 101.2 * 0.965, 8: 163.5 * 0.965, 16: 246.0 * 0.965}
    add(
        Profile(
            name="dflash7-prob-block",
            description="DFlash2, block 7, probabilistic draft + block verification (deployed)",
            speculative_config={
                **_DFLASH_BASE,
                "num_speculative_tokens": 7,
                "draft_sample_method": "probabilistic",
                "rejection_sample_method": "block",
            },
            num_spec_tokens=7,
            step_ms=_steps(pb7_t, pb7_tok_s),
            acceptance=_ramp(
                (0.85, 0.68, 0.52, 0.42, 0.33, 0.24, 0.19),
                (0.90, 0.76, 0.62, 0.52, 0.42, 0.33, 0.25),
                pb7_t,
            ),
            temp1_accept_factor=0.767,  # 28.6 tokens/s at 1.0 vs 34.8 at 0.7
            # One-stream runs at 0.7 scattered 39.7 / 33.1 / 31.5; kept smaller here so that a
            # handful of calibration runs can pin the mean (see calibrate.py).
            content_sigma_07=0.06,
            content_sigma_10=0.15,
            kv_cache_tokens=813_427,
        )
    )

    # No speculation: the MTP step (~123 ms) minus three ~20 ms MTP passes.
    add(
        Profile(
            name="nospec",
            description="no speculative decoding (one token per step)",
            speculative_config=None,
            num_spec_tokens=0,
            step_ms={1: 63.0, 2: 64.0, 4: 66.0, 8: 78.0, 16: 100.0},
            kv_cache_tokens=1_100_000,
        )
    )

    add(
        Profile(
            name="embed",
            kind="embed",
            description="embedding model",
            served_model_name="qwen3-embedding",
            model_path="/models/Qwen3-Embedding-0.6B",
            max_model_len=32768,
            step_ms={1: 20.0},
        )
    )
    return profiles


BUILTIN_PROFILES: dict[str, Profile] = _builtin()


class ProfileError(ValueError):
    pass


_INT_KEYED = ("step_ms", "acceptance")


def _profile_from_mapping(name: str, data: dict[str, Any], known: dict[str, Profile]) -> Profile:
    data = dict(data)
    base_name = data.pop("base", None)
    if base_name is not None:
        if base_name not in known:
            raise ProfileError(f"profile {name!r}: unknown base {base_name!r}")
        base = known[base_name]
    else:
        base = Profile(name=name)
    allowed = set(Profile.__dataclass_fields__) - {"name"}
    unknown = set(data) - allowed
    if unknown:
        raise ProfileError(f"profile {name!r}: unknown keys {sorted(unknown)}")
    for key in _INT_KEYED:
        if key in data:
            table = data[key]
            if not isinstance(table, dict) or not table:
                raise ProfileError(f"profile {name!r}: {key} must be a non-empty mapping")
            if key == "acceptance":
                data[key] = {int(n): tuple(float(x) for x in v) for n, v in table.items()}
            else:
                data[key] = {int(n): float(v) for n, v in table.items()}
    profile = replace(base, name=name, **data)
    if profile.kind not in ("generate", "embed"):
        raise ProfileError(f"profile {name!r}: kind must be 'generate' or 'embed'")
    for n, vec in profile.acceptance.items():
        if len(vec) != profile.num_spec_tokens:
            raise ProfileError(
                f"profile {name!r}: acceptance[{n}] has {len(vec)} positions, "
                f"num_spec_tokens is {profile.num_spec_tokens}"
            )
        if any(not 0.0 <= x <= 1.0 for x in vec):
            raise ProfileError(f"profile {name!r}: acceptance rates must lie in [0, 1]")
    return profile


def load_profiles(path: str | Path | None = None) -> dict[str, Profile]:
    """Built-in profiles, plus (overriding) those of a YAML file.

    The file is either `{profiles: {NAME: {...}}}` or `{NAME: {...}}`; each entry may name a
    `base` profile and override any field of it.
    """
    profiles = dict(BUILTIN_PROFILES)
    if path is None:
        return profiles
    raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    if not isinstance(raw, dict):
        raise ProfileError(f"{path}: expected a mapping")
    entries = raw.get("profiles", raw)
    if not isinstance(entries, dict):
        raise ProfileError(f"{path}: 'profiles' must be a mapping")
    for name, data in entries.items():
        if not isinstance(data, dict):
            raise ProfileError(f"{path}: profile {name!r} must be a mapping")
        profiles[str(name)] = _profile_from_mapping(str(name), data, profiles)
    return profiles
