"""Start `specrouter serve` / `specrouter sim` by forking a zygote that imported them once
(loadtests/harness/zygote.py), behind Popen's interface: `pid`, `poll()`, `wait()`,
`send_signal()`, `terminate()`, `kill()`, `returncode`, `stdout`.

    proc = forked(cli("sim", ...), stderr=True, env=env, detach=False)  # None: not forkable

One zygote per subcommand, started on first use and kept for the run (it ends when this process
does, and its children with it). SPECROUTER_TEST_FORK=0 turns it off: every start is then a
plain interpreter start, as before.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO

# The subcommands worth a zygote (each start imports seconds of modules) -> what it preloads.
PRELOAD = {"serve": "proxy.serve", "sim": "loadtests.sim.cli"}
ROOT = Path(__file__).resolve().parents[2]
CLI = str(ROOT / "proxy" / "cli.py")
START_TIMEOUT_S = 60.0
# Environment variables read at process start (by the interpreter, glibc's malloc, the loader).
STARTUP_ENV = ("PYTHON", "MALLOC_", "GLIBC_", "LD_")


class ForkedProcess:
    """A zygote's child, as much of subprocess.Popen as the harness and the tests use."""

    def __init__(self, pid: int, reply: socket.socket, stdout: IO[str] | None) -> None:
        self.pid = pid
        self.stdout = stdout
        self.returncode: int | None = None
        self.args: list[str] = []
        self._reply = reply
        self._lock = threading.Lock()

    def _read_exit(self, timeout: float | None) -> int | None:
        with self._lock:
            if self.returncode is None:
                ready, _, _ = select.select([self._reply], [], [], timeout)
                if ready:
                    msg = self._reply.recv(4096)
                    # No message: the zygote itself died (its children got SIGTERM).
                    code = json.loads(msg)["returncode"] if msg else -signal.SIGTERM
                    self.returncode = int(code)
                    self._reply.close()
            return self.returncode

    def poll(self) -> int | None:
        return self._read_exit(0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._read_exit(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _startup_env(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """What the interpreter and the C library read once, at process start (a forked child keeps
    its zygote's): a zygote per distinct set (the memory tests' MALLOC_* settings get theirs)."""
    return tuple(
        sorted(
            (k, v)
            for k, v in env.items()
            if k.startswith(STARTUP_ENV) and k != "PYTHONUNBUFFERED"  # the zygote runs with -u
        )
    )


class _Zygote:
    def __init__(self, module: str, startup: tuple[tuple[str, str], ...]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {k: v for k, v in os.environ.items() if not k.startswith(STARTUP_ENV)}
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-m", "loadtests.harness.zygote", str(theirs.fileno()), module],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            env={**env, **dict(startup)},
            # The tree's root first on sys.path (as `-m` from it): the code under test is what
            # it imports, whatever directory a test has moved to; each child gets its own cwd.
            cwd=ROOT,
        )
        theirs.close()
        self.control = ours
        self.lock = threading.Lock()
        ready, _, _ = select.select([ours], [], [], START_TIMEOUT_S)
        self.ok = bool(ready) and bool(ours.recv(4096))
        atexit.register(self.close)

    def close(self) -> None:
        """The zygote ends when its control socket closes; its children get SIGTERM."""
        self.control.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def fork(
        self, args: list[str], *, stderr: bool, env: dict[str, str], detach: bool
    ) -> ForkedProcess:
        read_end, write_end = os.pipe()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        request = {
            "args": args,
            "sys_argv": [CLI, *args],
            "env": env,
            "cwd": os.getcwd(),
            "detach": detach,
        }
        with open(os.devnull, "rb") as devnull:
            fds = [devnull.fileno(), write_end, write_end if stderr else 2, theirs.fileno()]
            try:
                with self.lock:
                    socket.send_fds(self.control, [json.dumps(request).encode()], fds)
            finally:
                os.close(write_end)
                theirs.close()
        ready, _, _ = select.select([mine], [], [], START_TIMEOUT_S)
        msg = mine.recv(4096) if ready else b""
        if not msg:
            os.close(read_end)
            mine.close()
            raise RuntimeError(f"the zygote did not fork {args[:1]}")
        stdout = io.TextIOWrapper(io.FileIO(read_end, "r"))
        proc = ForkedProcess(int(json.loads(msg)["pid"]), mine, stdout)
        proc.args = [sys.executable, "-m", "proxy.cli", *args]
        return proc


# What Child.proc is: a plain child or a forked one.
Process = subprocess.Popen[str] | ForkedProcess

_zygotes: dict[tuple[str, tuple[tuple[str, str], ...]], _Zygote | None] = {}
_zygotes_lock = threading.Lock()


def _zygote(sub: str, env: dict[str, str]) -> _Zygote | None:
    key = (sub, _startup_env(env))
    with _zygotes_lock:
        if key not in _zygotes:
            zygote = _Zygote(PRELOAD[sub], key[1])
            _zygotes[key] = zygote if zygote.ok else None
        return _zygotes[key]


def forked(
    cmd: Sequence[str], *, stderr: bool, env: dict[str, str], detach: bool
) -> ForkedProcess | None:
    """`cmd` (from launch.cli) forked from its subcommand's zygote; None if it is not a
    subcommand with one, forking is turned off, or the zygote could not start."""
    prefix = [sys.executable, "-m", "proxy.cli"]
    if list(cmd[:3]) != prefix or len(cmd) < 4 or cmd[3] not in PRELOAD:
        return None
    if os.environ.get("SPECROUTER_TEST_FORK", "1") == "0":
        return None
    zygote = _zygote(cmd[3], env)
    if zygote is None:
        return None
    return zygote.fork(list(cmd[3:]), stderr=stderr, env=env, detach=detach)
