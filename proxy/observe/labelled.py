"""prometheus_client's Counter and Gauge with each label set's child kept by its values.

`labels()` checks its arguments, turns each value to a string and takes a lock on every call
(~8 µs on a loaded 2-core machine, several times a request); the child it returns for a set
of values never changes until that child is removed. Here the child is looked up by the
values as given, and the library asked only the first time (and again after `remove`/`clear`).
"""

from __future__ import annotations

from typing import Any

import prometheus_client


class _Kept:
    _kept: dict[tuple[Any, ...], Any] | None = None  # label values -> child; per metric

    def labels(self, *values: Any, **named: Any) -> Any:
        kept = self._kept
        if kept is not None and not named:
            child = kept.get(values)
            if child is not None:
                return child
        child = super().labels(*values, **named)  # type: ignore[misc]
        if values and not named:
            if self._kept is None:
                self._kept = {}
            self._kept[values] = child
        return child

    def remove(self, *values: Any) -> None:
        self._kept = None
        super().remove(*values)  # type: ignore[misc]

    def clear(self) -> None:
        self._kept = None
        super().clear()  # type: ignore[misc]


class Counter(_Kept, prometheus_client.Counter):
    pass


class Gauge(_Kept, prometheus_client.Gauge):
    pass
