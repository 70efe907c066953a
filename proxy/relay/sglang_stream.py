"""The stream filter of an SGLang stream: vLLM's reading (proxy/relay/measure.py's
`StreamFilter`: continuous usage counted and cut) with SGLang's two differences around it
(proxy/relay/sglang.py): its spec frame read, and cut when the gateway asked for it; and
completions' `"usage":null` put back where the per-chunk usage was cut."""

from __future__ import annotations

from typing import Any

from policies.capabilities import SGLANG_ASK
from proxy.relay import sglang
from proxy.relay.measure import StreamFilter
from proxy.relay.rewrite import UsagePlan


def asks(body: dict[str, Any], usage: UsagePlan, continuable: bool) -> bool:
    """Whether the gateway asks SGLang for its spec figures on this request: on the streams it
    already asks continuous usage for, unless the client asked itself or the stream may be
    continued (a continuation's filter does not cut SGLang's frame)."""
    return usage.injected and not continuable and SGLANG_ASK not in body


class SglangFilter(StreamFilter):
    """`asked`: the gateway asked for the spec figures (`asks`), so their frame is cut."""

    __slots__ = ("asked",)

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.asked = False

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
