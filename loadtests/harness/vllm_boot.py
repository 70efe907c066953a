"""vLLM servers started one after another on a background thread, ahead of the code that uses
them, so that their boots (20-150 s each on 2 cores) overlap other work instead of stalling it.

    boot = Boot({"draft": lambda: VllmServer(home, "draft"), "kv": make_kv}, at_once=3)
    boot.start(["draft", "kv"])   # returns at once; boots in this order
    server = boot.take("draft")   # blocks until it answers /health, or raises its failure
    ...
    boot.done("draft")            # stopped: the next may start

One at a time (a boot is about one core busy: the engines run one OpenMP thread), at most
`at_once` started and not yet done (each holds about 3 GiB). A server taken (or wanted) before
its turn boots next; several waited for at once boot side by side, as nothing else runs then. PR_SET_PDEATHSIG fires when the thread that spawned a child ends, so the boot
thread never ends: it parks once everything is started, and the servers end with the process
(or at close()).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from loadtests.harness.vllm import VllmServer


@dataclass
class _Entry:
    make: Callable[[], VllmServer]
    server: VllmServer | None = None
    started: bool = False
    done: bool = False
    error: BaseException | None = None
    ready: threading.Event = field(default_factory=threading.Event)


class Boot:
    def __init__(self, makers: Mapping[str, Callable[[], VllmServer]], *, at_once: int = 3) -> None:
        self._entries = {key: _Entry(make) for key, make in makers.items()}
        self._order: list[str] = []
        self._wanted: list[str] = []
        self._at_once = at_once
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def start(self, order: Iterable[str]) -> None:
        """Boot these servers, in this order, from now on (a second call adds to the order)."""
        with self._cond:
            self._order += [key for key in order if key not in self._order]
            self._cond.notify_all()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="vllm-boot", daemon=True)
                self._thread.start()

    def want(self, *keys: str) -> None:
        """These servers are waited for now: they boot next, side by side."""
        with self._cond:
            self._wanted += [key for key in keys if key not in self._wanted]
        self.start(keys)

    def take(self, key: str) -> VllmServer:
        """The server, once it answers /health (booted next if it was not yet)."""
        entry = self._entries[key]
        self.want(key)
        entry.ready.wait()
        if entry.error is not None or entry.server is None:
            raise RuntimeError(f"vLLM ({key}) did not start") from entry.error
        return entry.server

    def done(self, key: str) -> None:
        """Stop the server; the next one may boot."""
        entry = self._entries[key]
        if entry.server is not None:
            entry.server.stop()
        with self._cond:
            entry.done = True
            self._cond.notify_all()

    def close(self) -> None:
        """Stop every server, booted or booting; boot no more."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for key in self._entries:
            self.done(key)

    @staticmethod
    def _healthy(entry: _Entry) -> None:
        assert entry.server is not None
        try:
            entry.server.wait_healthy()
        except Exception as exc:  # re-raised by take(), in the test that needs it
            entry.error = exc
        finally:
            entry.ready.set()

    def _next(self) -> str | None:
        """The key to boot now, "" to wait, None when nothing is left (the lock held)."""
        pending = [k for k in self._order if not self._entries[k].started]
        if self._closed or not pending:
            return None
        for key in self._wanted:
            if key in pending:
                return key
        busy = sum(1 for e in self._entries.values() if e.started and not e.done)
        return pending[0] if busy < self._at_once else ""

    def _run(self) -> None:
        while True:
            with self._cond:
                key = self._next()
                while key == "" or (key is None and not self._closed):
                    self._cond.wait()
                    key = self._next()
                if key is None:
                    break
                entry = self._entries[key]
                entry.started = True
            try:
                entry.server = entry.make()
                entry.server.spawn()
            except Exception as exc:  # re-raised by take(), in the test that needs it
                entry.error = exc
                entry.ready.set()
                continue
            if self._closed:
                entry.server.stop()
            with self._cond:
                rush = any(k in self._wanted and not self._entries[k].started for k in self._order)
            if rush:  # another is waited for too: spawn it now, this one comes up meanwhile
                threading.Thread(target=self._healthy, args=(entry,), daemon=True).start()
            else:
                self._healthy(entry)
        for entry in self._entries.values():
            entry.ready.set()  # nothing more boots: take() of what never started raises
        threading.Event().wait()  # the servers' parent thread lives as long as the process
