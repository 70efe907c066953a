"""The policy on disk: validated apply, atomic writes, numbered versions, audit log, rollback.

Every applied change is written to the config file by temp file + fsync + rename (a crash at
any point leaves the last good file), kept as `versions/NNNN.yaml` and appended to
`audit.jsonl`. Applying is one reference swap on the gateway's `PolicyHolder`; requests in
flight keep the policy they started with. Edits made to the file by hand are picked up by
`poll()`: a valid file is applied, an invalid one refused while the running policy stays.
Parsing and compiling run in a worker thread, within the document limits, so a large or
hostile document never holds the event loop (policies/loading.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from policies.compiled import CompiledPolicy, compile_policy
from policies.diff import diff_documents
from policies.loading import DEFAULT_LIMITS, DocumentLimits, dump_yaml
from policies.schema import PolicyError, parse_policy
from proxy.gateway import PolicyHolder
from proxy.observe.events import EventLog

log = logging.getLogger("specrouter.policy")

ANY = "*"  # If-Match: * (any current version)


class StaleVersion(Exception):
    """The change was based on a version that is no longer current (HTTP 412)."""


@dataclass(frozen=True, slots=True)
class Applied:
    number: int
    version: str
    changes: tuple[str, ...]


def atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class PolicyStore:
    def __init__(
        self,
        holder: PolicyHolder,
        config: Path,
        state_dir: Path,
        limits: DocumentLimits = DEFAULT_LIMITS,
        events: EventLog | None = None,
    ) -> None:
        self.holder = holder
        # The gateway's event log (gw.events): applied and refused policies are shown on
        # /admin/status and the dashboard.
        self.events = events if events is not None else EventLog()
        self.limits = limits
        self.config = config
        self.dir = state_dir / "policy"
        self.versions = self.dir / "versions"
        self.audit = self.dir / "audit.jsonl"
        self.versions.mkdir(parents=True, exist_ok=True)
        self._lock = asyncio.Lock()
        self._file_sig = self._signature()
        self.reload_failures = 0
        self.last_error: str | None = None
        if not any(self.versions.iterdir()):
            self._record(self.holder.current, self.config.read_bytes(), "startup", ())

    @property
    def current(self) -> CompiledPolicy:
        return self.holder.current

    def _signature(self) -> tuple[int, int] | None:
        try:
            st = self.config.stat()
        except FileNotFoundError:
            return None
        return st.st_mtime_ns, st.st_size

    def history(self) -> list[dict[str, Any]]:
        if not self.audit.exists():
            return []
        return [orjson.loads(line) for line in self.audit.read_bytes().splitlines() if line]

    def _next_number(self) -> int:
        numbers = [int(p.stem) for p in self.versions.glob("*.yaml") if p.stem.isdigit()]
        return max(numbers, default=0) + 1

    def _record(
        self,
        policy: CompiledPolicy,
        text: bytes,
        who: str,
        changes: tuple[str, ...],
        note: str = "",
    ) -> int:
        number = self._next_number()
        atomic_write(self.versions / f"{number:04d}.yaml", text)
        entry = {
            "number": number,
            "version": policy.version,
            "time": time.time(),
            "who": who,
            "changes": list(changes),
            "note": note,
        }
        with open(self.audit, "ab") as f:
            f.write(orjson.dumps(entry) + b"\n")
            f.flush()
            os.fsync(f.fileno())
        return number

    def compile(self, text: bytes | str) -> CompiledPolicy:
        """Parse and compile; raises PolicyError with every problem found."""
        return compile_policy(parse_policy(text, self.holder.context, self.limits))

    async def validate(self, text: bytes | str) -> CompiledPolicy:
        """`compile` in a worker thread: the event loop keeps serving meanwhile."""
        return await asyncio.to_thread(self.compile, text)

    def check(self, if_match: str | None) -> None:
        """Raise StaleVersion unless `if_match` holds: the current version, `*` (any current
        version) or None (unconditional: the store's own callers)."""
        current = self.holder.current.version
        if if_match not in (None, ANY, current):
            raise StaleVersion(current)

    def _number_of(self, version: str) -> int:
        return next((h["number"] for h in reversed(self.history()) if h["version"] == version), 0)

    async def apply(
        self,
        text: bytes,
        *,
        who: str,
        if_match: str | None,
        note: str = "",
        unless_running: bool = False,
    ) -> Applied:
        """Validate, persist, swap. `if_match` is the version the change was based on, checked
        before the text (RFC 9110 13.2.1) and again under the lock. `unless_running`: a policy
        that is already the running one is no change (no history entry)."""
        self.check(if_match)
        policy = await self.validate(text)
        async with self._lock:
            current = self.holder.current
            self.check(if_match)
            if unless_running and policy.version == current.version:
                return Applied(self._number_of(current.version), current.version, ())
            changes = tuple(diff_documents(current.document, policy.document))
            await asyncio.to_thread(atomic_write, self.config, text)
            self._file_sig = self._signature()
            number = await asyncio.to_thread(self._record, policy, text, who, changes, note)
            self.holder.current = policy  # the swap: nothing above touched live requests
            log.warning("policy version %s applied by %s (#%d)", policy.version, who, number)
            self.events.add(
                "policy_applied",
                version=policy.version,
                detail=f"by {who} (#{number}){f': {note}' if note else ''}",
            )
            return Applied(number, policy.version, changes)

    async def rollback(self, number: int, *, who: str, if_match: str | None) -> Applied:
        path = self.versions / f"{number:04d}.yaml"
        if not path.exists():
            raise KeyError(number)
        return await self.apply(
            path.read_bytes(),
            who=who,
            if_match=if_match,
            note=f"rollback to #{number}",
            unless_running=True,
        )

    async def poll(self, *, force: bool = False) -> bool:
        """Apply the config file if someone edited it; True when a new version was applied."""
        sig = self._signature()
        if sig is None or (sig == self._file_sig and not force):
            return False
        # Under the lock: an `apply` in progress writes the file before it records its version;
        # read outside the lock, that write looked like a hand edit and was recorded twice.
        async with self._lock:
            sig = self._signature()
            if sig is None or (sig == self._file_sig and not force):
                return False
            self._file_sig = sig
            try:
                text = await asyncio.to_thread(self._read_config)
                policy = await self.validate(text)
            except PolicyError as exc:
                self.reload_failures += 1
                self.last_error = str(exc)
                log.error(
                    "edited policy file %s refused, keeping version %s: %s",
                    self.config,
                    self.holder.current.version,
                    exc,
                )
                self.events.add(
                    "policy_refused",
                    version=self.holder.current.version,
                    detail=f"edited file {self.config.name} refused, version kept: {exc}",
                )
                return False
            current = self.holder.current
            if policy.version == current.version:  # the file an apply (just) wrote: no edit
                return False
            changes = tuple(diff_documents(current.document, policy.document))
            await asyncio.to_thread(self._record, policy, text, "file", changes)
            self.holder.current = policy
        log.warning("policy file %s edited: applied version %s", self.config, policy.version)
        self.events.add(
            "policy_applied", version=policy.version, detail=f"edited file {self.config.name}"
        )
        return True

    def _read_config(self) -> bytes:
        """The config file, up to one byte past the limit (a larger one is refused unread)."""
        try:
            with open(self.config, "rb") as f:
                return f.read(self.limits.max_bytes + 1)
        except OSError as exc:
            raise PolicyError([f"{self.config}: {exc.strerror or exc}"]) from None

    def document_yaml(self) -> str:
        return dump_yaml(self.holder.current.document.to_data())
