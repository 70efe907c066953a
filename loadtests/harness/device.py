"""Co-located simulated engines: one `specrouter sim --engine ...` process for one device.

    with DeviceSim([("deep", "dflash7-prob-block", None), ("mtp", "mtp3", None)]) as dev:
        dev.urls["deep"], dev.kv_tokens["mtp"]

The process prints one listening line per engine, all at once, when every engine accepts
connections (loadtests/sim/colocate.py).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

from loadtests.harness.launch import SIM_READY, Child, cli

ENGINE_LINE = re.compile(
    r"specrouter-sim listening on (\S+) engine (\S+) profile \S+ device \S+ kv_tokens (\d+)"
)


class DeviceSim:
    def __init__(
        self,
        engines: Sequence[tuple[str, str, float | None]],
        *,
        time_scale: float = 0.05,
        overlap: float = 0.0,
        device: str = "gb10",
        seed: int = 0,
        extra: Sequence[str] = (),
    ) -> None:
        args = [
            "--device",
            device,
            "--overlap",
            str(overlap),
            "--time-scale",
            str(time_scale),
            "--seed",
            str(seed),
        ]
        for name, profile, share in engines:
            args += ["--engine", f"{name}:0:{profile}" + ("" if share is None else f":{share}")]
        self.names = [e[0] for e in engines]
        self.child = Child(
            f"specrouter sim device {device}", cli("sim", *args, *extra), ready=SIM_READY
        )
        self.urls: dict[str, str] = {}
        self.kv_tokens: dict[str, int] = {}

    def __enter__(self) -> DeviceSim:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 20.0) -> None:
        self.child.start(timeout)
        # The lines come in one write; the reader thread may not have split them all yet.
        deadline = time.monotonic() + 5.0
        while len(self.urls) < len(self.names) and time.monotonic() < deadline:
            for line in list(self.child.output):
                m = ENGINE_LINE.search(line)
                if m:
                    self.urls[m.group(2)] = m.group(1)
                    self.kv_tokens[m.group(2)] = int(m.group(3))
            time.sleep(0.02)
        if len(self.urls) < len(self.names):
            self.stop()
            raise RuntimeError(
                "not every engine announced itself:\n" + "".join(self.child.output[-20:])
            )

    def stop(self) -> None:
        self.child.stop(timeout=5)
