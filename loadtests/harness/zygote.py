"""A fork server for `specrouter serve` and `specrouter sim`: imports the command's module once,
then forks a child per request (loadtests/harness/forked.py is the client side).

A start is then a fork (tens of milliseconds) instead of an interpreter start and the imports
(1.5-3 s on a loaded 2-core machine, nearly all of a start). The child is still a process of its
own: signals, exit codes, /proc, its memory and its sockets are its own.

    python -m loadtests.harness.zygote FD MODULE

FD is one end of an AF_UNIX SOCK_SEQPACKET pair. Each request on it is a JSON object (args,
sys_argv, env, cwd, detach) with four descriptors: the child's stdin, stdout and stderr, and the request's own
socket, on which the zygote answers {"pid": N} and later {"returncode": N} (Popen's sign: -N for
a signal). It exits when the other end closes; its children then get SIGTERM (PDEATHSIG).
This process starts no thread and opens no event loop, so forking it is safe.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import selectors
import signal
import socket
import sys
import threading
from typing import Any

_PR_SET_PDEATHSIG = 1


def _die_with_zygote() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _returncode(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.waitstatus_to_exitcode(status)


def _send(sock: socket.socket, msg: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # the client went away: nobody to tell
        sock.send(json.dumps(msg).encode())


class Zygote:
    def __init__(self, control: socket.socket) -> None:
        self.control = control
        self.sel = selectors.DefaultSelector()
        self.sel.register(control, selectors.EVENT_READ, None)
        # pidfd -> (pid, the request's socket)
        self.children: dict[int, tuple[int, socket.socket]] = {}

    def serve(self) -> list[str] | None:
        """Until the client closes (None); in a forked child, that child's argv."""
        while True:
            for key, _ in self.sel.select():
                if key.data is None:
                    request = self._receive()
                    if request is None:
                        return None
                    argv = self._fork(*request)
                    if argv is not None:
                        return argv
                else:
                    self._reap(key.fd)

    def _receive(self) -> tuple[dict[str, Any], list[int]] | None:
        msg, fds, _, _ = socket.recv_fds(self.control, 1 << 20, 4)
        if not msg:
            return None
        return json.loads(msg), fds

    def _fork(self, req: dict[str, Any], fds: list[int]) -> list[str] | None:
        stdin, stdout, stderr, reply_fd = fds
        reply = socket.socket(fileno=reply_fd)
        pid = os.fork()
        if pid == 0:
            self._become_child(req, stdin, stdout, stderr, reply)
            return list(req["args"])
        for fd in (stdin, stdout, stderr):
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        self.children[pidfd] = (pid, reply)
        self.sel.register(pidfd, selectors.EVENT_READ, pid)
        _send(reply, {"pid": pid})
        return None

    def _reap(self, pidfd: int) -> None:
        pid, reply = self.children.pop(pidfd)
        self.sel.unregister(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        _send(reply, {"returncode": _returncode(status)})
        reply.close()

    def _become_child(
        self, req: dict[str, Any], stdin: int, stdout: int, stderr: int, reply: socket.socket
    ) -> None:
        """What Popen's child does before exec, minus the exec: the zygote's own descriptors
        closed, stdio and environment from the request, signals as a fresh interpreter has."""
        self.sel.close()
        self.control.close()
        reply.close()
        for pidfd, (_, other) in self.children.items():
            os.close(pidfd)
            other.close()
        self.children.clear()
        for target, fd in enumerate((stdin, stdout, stderr)):
            os.dup2(fd, target)
        for fd in {stdin, stdout, stderr}:
            if fd > 2:
                os.close(fd)
        if req["detach"]:
            os.setsid()
        _die_with_zygote()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        sys.argv = list(req["sys_argv"])


def main() -> list[str] | None:
    control = socket.socket(fileno=int(sys.argv[1]))
    for module in sys.argv[2:]:
        importlib.import_module(module)
    # A thread would not survive the fork (its locks might be held): then refuse to serve.
    if threading.active_count() != 1:
        return None
    # Ctrl-C is the test run's to handle: it stops the children it started (they get SIGINT too).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _send(control, {"ready": True})
    return Zygote(control).serve()


if __name__ == "__main__":
    child_argv = main()
    if child_argv is not None:
        from proxy.cli import main as cli_main

        sys.exit(cli_main(child_argv))
