"""Pure, incremental SSE framing and the byte-level edits the relay makes to vLLM frames.

vLLM writes every event as `data: <compact json>\\n\\n` (and `event: ...\\n` before it on
/v1/responses). The relay never re-encodes a frame: it cuts the few keys it added upstream out
of the bytes, so everything else reaches the client exactly as the engine wrote it.
"""

from __future__ import annotations

FRAME_END = b"\n\n"
USAGE_KEY = b',"usage":{'
FINGERPRINT_KEY = b',"system_fingerprint":"'
DONE = b"data: [DONE]\n\n"


class FrameSplitter:
    """Cut a byte stream into complete SSE frames, keeping each frame's bytes intact."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._buf + data if self._buf else data
        end = buf.rfind(FRAME_END)
        if end < 0:
            self._buf = buf
            return []
        end += 2
        self._buf = buf[end:]
        complete = buf[:end]
        if complete.count(FRAME_END) == 1:
            return [complete]
        return [part + FRAME_END for part in complete[:-2].split(FRAME_END)]

    def flush(self) -> bytes:
        """Whatever is left that did not end a frame (a truncated upstream stream)."""
        rest, self._buf = self._buf, b""
        return rest


def object_end(data: bytes, start: int) -> int:
    """Index just past the JSON object that opens at `data[start]` (a `{`); -1 if unclosed.

    Only for objects of numbers and nested objects, like `usage`: no strings containing braces.
    """
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


def insert(frame: bytes, at: int, piece: bytes) -> bytes:
    return frame[:at] + piece + frame[at:]


def insert_before_close(frame: bytes, piece: bytes) -> bytes:
    """Insert `piece` just before the closing `}` of the frame's top-level object."""
    close = frame.rfind(b"}")
    return frame[:close] + piece + frame[close:]
