"""Pure statistics of the probe: per-cell summaries, comparisons and their flags.

No I/O and no clock here, so every rule is tested with tables (tests/probe/test_probe.py).

A *cell* is one (concurrency, temperature) point; it holds the figure of each run. The probe
reports each cell as mean, min-max and run count, because single runs scatter (the facts: one
178.5 tokens/s run re-measured at 161.8, 167.8, 160.9).

Comparison flags (`specrouter probe compare`):

* **not separable with these runs**: the two cells' ranges [min, max] overlap and at least one of
  them has two runs or more. A difference inside the runs' own scatter is not a difference.
* **re-measure**: a cell with a single run on either side whose change is smaller than the
  scatter a single run can show, so that one more run could reverse which configuration wins the
  cell: the decision would rest on that run alone. The scatter is estimated from the compared
  files themselves: the largest relative range (max - min) / mean among their multi-run cells
  at the same concurrency, else at any concurrency, else `DEFAULT_SCATTER`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from proxy.observe.stats import mean, quantile

# Relative scatter assumed for a single run when no multi-run cell tells better: the probe's
# +-10 % tolerance (the facts' one-stream runs spread 31.5 ... 39.7 around 34.8).
DEFAULT_SCATTER = 0.10

NOT_SEPARABLE = "not separable with these runs"
RE_MEASURE = "re-measure"


@dataclass(frozen=True, slots=True)
class Summary:
    """Mean, range and count of one cell's runs."""

    mean: float
    min: float
    max: float
    n: int

    @property
    def rel_range(self) -> float:
        """(max - min) / mean; 0 for a single run or a zero mean."""
        return (self.max - self.min) / self.mean if self.n > 1 and self.mean else 0.0

    def fmt(self, digits: int = 1) -> str:
        if self.n == 1:
            return f"{self.mean:.{digits}f} (1 run)"
        return f"{self.mean:.{digits}f} [{self.min:.{digits}f}-{self.max:.{digits}f}] x{self.n}"


def summarize(values: Iterable[float | None]) -> Summary | None:
    """Summary of the runs that have a value; None when none has."""
    xs = [float(v) for v in values if v is not None]
    m = mean(xs)
    if m is None:
        return None
    return Summary(mean=m, min=min(xs), max=max(xs), n=len(xs))


def p50_p95(values: Sequence[float]) -> tuple[float | None, float | None]:
    return quantile(values, 0.5), quantile(values, 0.95)


def overlaps(a: Summary, b: Summary) -> bool:
    """True when the closed ranges [min, max] of a and b intersect."""
    return a.min <= b.max and b.min <= a.max


def pct_change(base: float, other: float) -> float | None:
    """Relative change from base to other, in percent; None when base is 0."""
    if base == 0:
        return None
    return 100.0 * (other - base) / base


def scatter_estimate(
    cells: Iterable[tuple[int, Summary]], concurrency: int, default: float = DEFAULT_SCATTER
) -> float:
    """Largest relative range among multi-run cells at `concurrency`, else any, else default.

    `cells` are (concurrency, summary) pairs from every compared file.
    """
    multi = [(n, s) for n, s in cells if s.n > 1]
    same = [s.rel_range for n, s in multi if n == concurrency]
    if same:
        return max(same)
    if multi:
        return max(s.rel_range for _, s in multi)
    return default


@dataclass(frozen=True, slots=True)
class Change:
    """One configuration against the baseline in one cell."""

    pct: float | None
    flags: tuple[str, ...]


def compare_cell(base: Summary | None, other: Summary | None, scatter: float) -> Change:
    """% change of `other` over `base` and the flags of that change (see the module docstring)."""
    if base is None or other is None:
        return Change(None, ())
    pct = pct_change(base.mean, other.mean)
    flags: list[str] = []
    if (base.n > 1 or other.n > 1) and overlaps(base, other):
        flags.append(NOT_SEPARABLE)
    if (base.n == 1 or other.n == 1) and pct is not None and abs(pct) < 100.0 * scatter:
        flags.append(RE_MEASURE)
    return Change(pct, tuple(flags))


CellKey = tuple[int, float | None]  # (concurrency, temperature; None = unset)


def temp_label(temperature: float | None) -> str:
    return "unset" if temperature is None else f"{temperature:g}"


def cell_order(keys: Iterable[CellKey]) -> list[CellKey]:
    """Temperatures as first seen (set values before unset), then concurrency ascending."""
    uniq = set(keys)
    temps = sorted({t for _, t in uniq}, key=lambda t: (t is None, t if t is not None else 0.0))
    return [(n, t) for t in temps for n in sorted({n for n, tt in uniq if tt == t})]


@dataclass(frozen=True, slots=True)
class CompareRow:
    key: CellKey
    summaries: tuple[Summary | None, ...]  # one per file, the first is the baseline
    changes: tuple[Change, ...]  # one per file after the first
    scatter: float


def compare(files: Sequence[Mapping[CellKey, Summary]]) -> list[CompareRow]:
    """Every cell of every file, each later file against the first."""
    keys = cell_order(k for f in files for k in f)
    rows: list[CompareRow] = []
    for key in keys:
        summaries = tuple(f.get(key) for f in files)
        pool = [(k[0], s) for f in files for k, s in f.items() if k[1] == key[1]]
        scatter = scatter_estimate(pool, key[0])
        base = summaries[0]
        changes = tuple(compare_cell(base, s, scatter) for s in summaries[1:])
        rows.append(CompareRow(key, summaries, changes, scatter))
    return rows


# -- the policy's verdict ("the policy earns its keep") ------------------------------------------


@dataclass(frozen=True, slots=True)
class VerdictRow:
    key: CellKey
    best_single: str
    best_mean: float
    ratios: dict[str, float]  # configuration -> mean / best single variant's mean
    policy_ok: bool


@dataclass(frozen=True, slots=True)
class Verdict:
    rows: list[VerdictRow]
    policy_ok: bool  # the policy reaches the threshold in every cell
    singles_fail: dict[str, list[CellKey]]  # each single variant: cells where it falls below
    ok: bool  # policy_ok and every single variant falls below somewhere

    @property
    def missing(self) -> list[CellKey]:
        return [r.key for r in self.rows if not r.ratios]


def policy_verdict(
    singles: Mapping[str, Mapping[CellKey, Summary]],
    policy: Mapping[CellKey, Summary],
    threshold: float = 0.97,
) -> Verdict:
    """Does the policy reach `threshold` x the best single variant's mean in every cell, while
    each single variant alone falls below that in at least one cell?

    Cells missing from the policy or from every single variant make the verdict fail.
    """
    keys = cell_order([*policy, *(k for s in singles.values() for k in s)])
    rows: list[VerdictRow] = []
    fails: dict[str, list[CellKey]] = {name: [] for name in singles}
    policy_ok = bool(keys)
    for key in keys:
        present = {name: s[key] for name, s in singles.items() if key in s}
        p = policy.get(key)
        if not present:
            rows.append(VerdictRow(key, "", 0.0, {}, False))
            policy_ok = False
            continue
        best_name = max(present, key=lambda n: present[n].mean)
        best = present[best_name].mean
        ratios = {name: s.mean / best for name, s in present.items()}
        ok = False
        if p is not None:
            ratios["policy"] = p.mean / best
            ok = ratios["policy"] >= threshold
        policy_ok = policy_ok and ok
        for name in present:
            if ratios[name] < threshold:
                fails[name].append(key)
        rows.append(VerdictRow(key, best_name, best, ratios, ok))
    ok_all = policy_ok and all(fails[name] for name in singles)
    return Verdict(rows, policy_ok, fails, ok_all)
