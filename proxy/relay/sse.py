"""Pure, incremental SSE framing and the byte-level edits the relay makes to vLLM frames.

vLLM writes every event as `data: <compact json>\\n\\n` (and `event: ...\\n` before it on
/v1/responses). The relay never re-encodes a frame: it cuts the few keys it added upstream out
of the bytes, so everything else reaches the client exactly as the engine wrote it.
"""

from __future__ import annotations

import re

# vLLM's framing facts live in proxy.vllm_wire; the relay's tests read DONE from here.
from proxy.vllm_wire import DONE as DONE
from proxy.vllm_wire import FINGERPRINT_KEY, FRAME_END, USAGE_KEY


class FrameTooLarge(Exception):
    """An engine's event grew past the frame limit without ending."""


class FrameSplitter:
    """Cut a byte stream into complete SSE frames, keeping each frame's bytes intact.

    A frame ends at the first blank line: two line ends in a row, each `\n` (what vLLM
    writes), `\r\n` or a lone `\r` (the SSE grammar allows all three). Frames come out the
    same whatever the network's cuts, and the work is linear in the bytes: a pending partial
    frame is only appended to and searched from where the last search ended. A pending frame
    longer than `max_frame` raises FrameTooLarge (None: no limit).
    """

    __slots__ = ("_buf", "_scan", "max_frame", "peak")

    def __init__(self, max_frame: int | None = None) -> None:
        self._buf = bytearray()
        self._scan = 0  # where to resume looking for a boundary in _buf
        self.max_frame = max_frame
        self.peak = 0  # the longest partial frame held, for the memory trim

    def feed(self, data: bytes) -> list[bytes]:
        # The common case, one read holding exactly one `\n\n` frame: no search loop, no copy.
        if (
            not self._buf
            and len(data) > 2
            and data.find(FRAME_END) == len(data) - 2
            and b"\r" not in data
        ):
            return [data]
        if self._buf:
            self._buf += data
            buf: bytes | bytearray = self._buf
            pos = self._scan
        else:
            buf, pos = data, 0  # the common case: no copy until a frame is cut
        frames: list[bytes] = []
        start = 0
        while True:
            end = _frame_end(buf, max(pos, start))
            if end < 0:
                break
            frames.append(bytes(buf[start:end]))
            start = end
        if start == 0 and buf is self._buf:
            pass  # still one unfinished frame: keep the buffer, copy nothing
        elif start < len(buf):
            self._buf = bytearray(buf[start:])
        else:
            self._buf = bytearray()
        held = len(self._buf)
        self.peak = max(self.peak, held)
        if self.max_frame is not None and held > self.max_frame:
            self._buf, self._scan = bytearray(), 0
            raise FrameTooLarge(f"engine event larger than {self.max_frame} bytes")
        self._scan = max(0, held - 3)  # a boundary may straddle the next read
        return frames

    def finish(self) -> list[bytes]:
        """At the stream's clean end: a last frame held back only because it ends in `\r`
        (whose `\n` never came) is complete; anything else held is a truncated frame."""
        rest = self._buf
        if rest.endswith(b"\r") and _frame_end(rest + b"\0", 0) == len(rest):
            self._buf, self._scan = bytearray(), 0
            return [bytes(rest)]
        return []

    def flush(self) -> bytes:
        """Whatever is left that did not end a frame (a truncated upstream stream)."""
        rest = bytes(self._buf)
        self._buf, self._scan = bytearray(), 0
        return rest


# Two line ends in a row; a `\r` is a line end of its own unless a `\n` follows it.
_BLANK_LINE = re.compile(rb"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r(?!\n)|\n)")


def _frame_end(buf: bytes | bytearray, pos: int) -> int:
    """Index just past the first blank line at or after `pos`, or -1."""
    cr = buf.find(b"\r", pos)
    if cr < 0:  # what vLLM writes: LF only, C-speed find
        lf = buf.find(b"\n\n", pos)
        return lf + 2 if lf >= 0 else -1
    lf = buf.find(b"\n\n", pos, cr)  # a plain boundary before the first CR
    if lf >= 0:
        return lf + 2
    match = _BLANK_LINE.search(buf, max(pos, cr - 1))
    if match is None:
        return -1
    end = match.end()
    if end == len(buf) and buf[end - 1] == 0x0D:
        return -1  # a `\r` last: the `\n` of a `\r\n` may be in the next read
    return end


def object_end(data: bytes, start: int) -> int:
    """Index just past the JSON object that opens at `data[start]` (a `{`); -1 if unclosed.

    Only for objects of numbers and nested objects, like `usage`: no strings containing braces.
    """
    # Fast path, the flat per-chunk usage object: no other `{` before the first `}`, and no
    # string that could hide one (even quotes, no escapes). C-speed finds instead of a Python
    # loop over every byte (~1 us instead of ~6 us a frame).
    close = data.find(b"}", start)
    if (
        close > 0
        and data.find(b"{", start + 1, close) < 0
        and data.count(b'"', start, close) % 2 == 0
        and data.find(b"\\", start, close) < 0
    ):
        return close + 1
    depth = 0
    i = start
    n = len(data)
    while i < n:
        c = data[i]
        if c == 0x7B:  # {
            depth += 1
        elif c == 0x7D:  # }
            depth -= 1
            if depth == 0:
                return i + 1
        elif c == 0x22:  # a string: skip it whole, escapes included
            i += 1
            while i < n and data[i] != 0x22:
                i += 2 if data[i] == 0x5C else 1
        i += 1
    return -1


def usage_span(frame: bytes) -> tuple[int, int] | None:
    """The span of `,"usage":{...}` in a frame, comma included, or None."""
    start = frame.find(USAGE_KEY)
    if start < 0:
        return None
    end = object_end(frame, start + len(USAGE_KEY) - 1)
    if end < 0:
        return None
    return start, end


def fingerprint_span(frame: bytes) -> tuple[int, int] | None:
    """The span of `,"system_fingerprint":"..."`, comma included, or None."""
    start = frame.find(FINGERPRINT_KEY)
    if start < 0:
        return None
    end = frame.find(b'"', start + len(FINGERPRINT_KEY))
    if end < 0:
        return None
    return start, end + 1


def cut(frame: bytes, span: tuple[int, int]) -> bytes:
    return frame[: span[0]] + frame[span[1] :]


def insert_before_close(frame: bytes, piece: bytes) -> bytes:
    """Insert `piece` just before the closing `}` of the frame's top-level object."""
    close = frame.rfind(b"}")
    return frame[:close] + piece + frame[close:]
