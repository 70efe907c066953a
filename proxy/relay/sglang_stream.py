"""What the relay does with an SGLang answer: vLLM's reading (proxy/relay/measure.py's
`StreamFilter`, or the continuable one of proxy/relay/continuation.py) with SGLang's differences
around it (proxy/relay/sglang.py): its spec frame read, and cut when the gateway asked for it;
completions' `"usage":null` put back where the per-chunk usage was cut; and on a body, its
`sglext.spec_tokens_details` cut as the body passes (`BodyCut`)."""

from __future__ import annotations

from typing import Any

from policies.capabilities import SGLANG_ASK, SGLEXT_KEY
from policies.types import Endpoint
from proxy.relay import sglang
from proxy.relay.continuation import ContinuableFilter
from proxy.relay.measure import StreamFilter
from proxy.relay.rewrite import USAGE_ENDPOINTS, UsagePlan

_SGLEXT = b',"' + SGLEXT_KEY.encode() + b'":{'
# The most a body's `sglext` may hold back: SGLang writes it last and it is a few hundred bytes
# (a histogram per draft position); past this the rest passes uncut.
_HOLD_LIMIT = 1 << 16


def asks(body: dict[str, Any], endpoint: Endpoint, usage: UsagePlan) -> bool:
    """Whether the gateway asks SGLang for its spec figures on this request: chat and
    completions bodies of one choice, and the streams it already asks continuous usage for,
    unless the client asked itself (its answer then carries them and nothing is cut)."""
    if SGLANG_ASK in body or endpoint not in USAGE_ENDPOINTS:
        return False
    if body.get("stream") is True:
        return usage.injected
    return body.get("n", 1) in (1, None)


class _Sglang(StreamFilter):
    """SGLang's reading, over vLLM's (`SglangFilter`) or the continuable one
    (`SglangContinuableFilter`). `asked`: the gateway asked for the spec figures, so their
    frame is cut."""

    __slots__ = ()
    asked: bool

    def frame(self, frame: bytes, now: float) -> bytes:
        spec = sglang.frame_spec(frame)
        if spec is not None:
            self.m.spec = spec
        if self.asked:
            frame = sglang.strip_frame(frame)
            if not frame:
                return b""
        out = super().frame(frame, now)
        return sglang.null_usage(out) if self.strip_usage else out

    def release(self) -> bytes:
        out = super().release()
        return sglang.null_usage(out) if self.strip_usage else out


class SglangFilter(_Sglang):
    __slots__ = ("asked",)

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.asked = False


class SglangContinuableFilter(_Sglang, ContinuableFilter):
    """A stream another SGLang variant may finish: the continuation's own spec frame is read
    and cut as the first engine's would have been."""

    __slots__ = ("asked",)

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.asked = False


class BodyCut:
    """A body relayed piece by piece without the spec figures the gateway asked for: bytes pass
    as soon as they cannot begin `,"sglext":{`; from that key on (SGLang writes it last) the
    rest is held and cut at the end (`end`)."""

    __slots__ = ("_held", "_holding")

    def __init__(self) -> None:
        self._held = b""
        self._holding = False

    def feed(self, data: bytes) -> bytes:
        held = self._held + data
        if self._holding:
            if len(held) > _HOLD_LIMIT:
                self._held, self._holding = b"", False
                return held  # not SGLang's short extension: relayed as it came
            self._held = held
            return b""
        at = held.find(_SGLEXT)
        if at >= 0:
            self._held, self._holding = held[at:], True
            return held[:at]
        keep = len(_SGLEXT) - 1  # a key split across two reads
        self._held = held[-keep:]
        return held[:-keep]

    def end(self) -> bytes:
        held, self._held = self._held, b""
        return sglang.strip_body(held) if self._holding else held
