"""A forked `specrouter sim` (loadtests/harness/forked.py) is a process of its own, as a fresh
one is: its pid, its exit code, its output, its start-time environment, its directory."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from loadtests.harness.forked import ForkedProcess
from loadtests.harness.launch import SIM_READY, Child, cli, sim_args


def _sim(env: dict[str, str] | None = None, *extra: str) -> Child:
    args = sim_args("mtp3", time_scale=0.05, extra=extra)
    return Child("sim", cli("sim", *args), ready=SIM_READY, env=env).start(timeout=60)


def test_a_forked_child_is_its_own_process_and_says_how_it_ended() -> None:
    child = _sim()
    try:
        proc = child.proc
        assert isinstance(proc, ForkedProcess)
        assert proc.pid != os.getpid() and proc.poll() is None
        # The zygote's child, not ours: reaped there, its exit code reported back.
        ppid = int(Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        assert ppid != os.getpid()
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL and proc.returncode == -signal.SIGKILL
    finally:
        child.stop()
    with pytest.raises(RuntimeError, match=r"(?s)exit 2\).*unknown profile"):
        Child("sim", cli("sim", "--profile", "nope"), ready=SIM_READY).start(timeout=60)


def test_what_a_process_reads_at_start_comes_from_its_own_zygote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """glibc reads MALLOC_* once, at exec: a child asked for one is forked from a zygote started
    with it (/proc/PID/environ is the environment the process was exec'd with)."""
    monkeypatch.chdir(tmp_path)
    # tests/bench/test_faults.py's lean_malloc settings: the same zygote serves both.
    lean_env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "16384", "MALLOC_TRIM_THRESHOLD_": "0"}
    plain, lean = _sim(), _sim(lean_env)
    try:
        assert plain.proc is not None and lean.proc is not None
        exec_env = {
            c.proc.pid: Path(f"/proc/{c.proc.pid}/environ").read_bytes().split(b"\0")
            for c in (plain, lean)
            if c.proc is not None
        }
        assert b"MALLOC_MMAP_THRESHOLD_=16384" in exec_env[lean.proc.pid]
        assert b"MALLOC_MMAP_THRESHOLD_=16384" not in exec_env[plain.proc.pid]
        assert Path(f"/proc/{lean.proc.pid}/cwd").resolve() == tmp_path.resolve()
        lean.proc.terminate()
        assert lean.proc.wait(10) == 0  # SIGTERM: the simulator's own clean exit
    finally:
        plain.stop()
        lean.stop()
