"""Faults on demand (only with `--faults`): the failure modes the deployment paid for.

A fault is set with `POST /_sim/faults {"mode": M, ...params}` and lasts until `DELETE /_sim/faults`,
or until its optional `seconds` (scaled by --time-scale) run out, or (http_500/http_503) its
optional `count` of failed requests is used up. Setting a mode again replaces it.

* die_mid_stream {after_chunks=3}: the engine "crashes". Every stream, open or new, loses its
  connection after `after_chunks` SSE frames with no terminating chunk (as when the vLLM process
  dies); non-streaming requests lose the connection before any response; /health answers 503.
* hang {seconds}: the engine stops stepping. Open and new streams stay open and silent (after
  their response headers, as in a long prefill); with `seconds`, for that long.
* http_500 / http_503 {count}: new requests get that status in vLLM's error shape.
* health_fail: /health answers 503; requests are still served.
* cold_start {seconds=5}: /health and every /v1 request answer 503 until the time has passed.
* acceptance_collapse {factor=0.1, seconds}: per-position acceptance multiplied by `factor`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from .engine import Engine

MODES = (
    "die_mid_stream",
    "hang",
    "http_500",
    "http_503",
    "health_fail",
    "cold_start",
    "acceptance_collapse",
)


class FaultError(ValueError):
    pass


@dataclass(slots=True)
class Fault:
    mode: str
    params: dict[str, Any]
    set_at: float
    expires_at: float | None = None
    remaining: int | None = None
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)

    def public(self, now: float) -> dict[str, Any]:
        out: dict[str, Any] = {"mode": self.mode, **self.params}
        if self.expires_at is not None:
            out["remaining_s"] = round(max(0.0, self.expires_at - now), 3)
        if self.remaining is not None:
            out["remaining_count"] = self.remaining
        return out


def _number(
    params: dict[str, Any], key: str, default: float | None, lo: float, hi: float
) -> float | None:
    value = params.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise FaultError(f"{key} must be a number in [{lo}, {hi}]")
    return float(value)


class Faults:
    def __init__(self, engine: Engine, *, time_scale: float) -> None:
        self.engine = engine
        self.time_scale = time_scale
        self._active: dict[str, Fault] = {}

    # -- control -----------------------------------------------------------------------------

    def set(self, mode: str, params: dict[str, Any]) -> Fault:
        if mode not in MODES:
            raise FaultError(f"unknown fault mode {mode!r}; known: {', '.join(MODES)}")
        params = dict(params)
        clean: dict[str, Any] = {}
        default_seconds = 5.0 if mode == "cold_start" else None
        seconds = _number(params, "seconds", default_seconds, 0.0, 86400.0)
        count: int | None = None
        if mode == "die_mid_stream":
            after = _number(params, "after_chunks", 3, 0, 1_000_000)
            clean["after_chunks"] = int(after or 0)
        elif mode == "acceptance_collapse":
            clean["factor"] = _number(params, "factor", 0.1, 0.0, 1.0)
        elif mode in ("http_500", "http_503") and "count" in params:
            count = int(_number(params, "count", None, 1, 1_000_000) or 1)
            clean["count"] = count
        if seconds is not None:
            clean["seconds"] = seconds
        self._remove(mode)
        now = time.monotonic()
        fault = Fault(mode, clean, now, remaining=count)
        if seconds is not None:
            delay = seconds * self.time_scale
            fault.expires_at = now + delay
            fault.timer = asyncio.get_running_loop().call_later(delay, self._expire, fault)
        self._active[mode] = fault
        self._apply(mode, on=True)
        return fault

    def clear(self) -> None:
        for mode in list(self._active):
            self._remove(mode)

    def active(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        return [f.public(now) for f in self._active.values()]

    # -- queries from the request path -------------------------------------------------------

    def health_ok(self) -> bool:
        return not any(m in self._active for m in ("die_mid_stream", "health_fail", "cold_start"))

    def drop_after(self) -> int | None:
        """Frames after which a stream's connection is dropped, or None."""
        fault = self._active.get("die_mid_stream")
        return None if fault is None else int(fault.params["after_chunks"])

    def starting_status(self) -> int | None:
        return 503 if "cold_start" in self._active else None

    def reject_status(self) -> int | None:
        """The status a new /v1 request must get instead of being served, if any."""
        if "cold_start" in self._active:
            return 503
        for mode, status in (("http_500", 500), ("http_503", 503)):
            fault = self._active.get(mode)
            if fault is None:
                continue
            if fault.remaining is not None:
                fault.remaining -= 1
                if fault.remaining <= 0:
                    self._remove(mode)
            return status
        return None

    # -- internals ---------------------------------------------------------------------------

    def _expire(self, fault: Fault) -> None:
        if self._active.get(fault.mode) is fault:
            fault.timer = None
            self._remove(fault.mode)

    def _remove(self, mode: str) -> None:
        fault = self._active.pop(mode, None)
        if fault is None:
            return
        if fault.timer is not None:
            fault.timer.cancel()
        self._apply(mode, on=False)

    def _apply(self, mode: str, *, on: bool) -> None:
        if mode == "hang":
            if on:
                self.engine.pause()
            else:
                self.engine.resume()
        elif mode == "acceptance_collapse":
            fault = self._active.get(mode)
            self.engine.core.accept_factor = float(fault.params["factor"]) if on and fault else 1.0
