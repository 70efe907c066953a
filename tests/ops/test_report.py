"""`specrouter report`: statistics tables, and the command on a log written by RequestLog."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from proxy.observe.requestlog import RequestLog
from proxy.ops import report
from proxy.ops.report import (
    Comparison,
    Stats,
    build_report,
    compare,
    concurrency_bucket,
    group_rows,
    overlaps,
    parse_since,
    summarize,
    temperature_label,
)
from tests.observe.test_requestlog import make_record

# --- statistics tables --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([], Stats(0, None, None, None)),
        ([None, None], Stats(0, None, None, None)),
        ([2.0], Stats(1, 2.0, 2.0, 2.0)),
        ([1.0, None, 3.0], Stats(2, 2.0, 1.1, 2.9)),
        ([float(i) for i in range(1, 101)], Stats(100, 50.5, 5.95, 95.05)),
    ],
)
def test_summarize(values: list[float | None], expected: Stats) -> None:
    got = summarize(values)
    assert got.n == expected.n
    assert (got.mean, got.p5, got.p95) == (
        pytest.approx(expected.mean),
        pytest.approx(expected.p5),
        pytest.approx(expected.p95),
    )


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (Stats(5, 1.0, 0.5, 1.5), Stats(5, 3.0, 2.0, 4.0), False),
        (Stats(5, 1.0, 0.5, 2.0), Stats(5, 3.0, 2.0, 4.0), True),  # touching counts as overlap
        (Stats(5, 3.0, 2.0, 4.0), Stats(5, 1.0, 0.5, 2.5), True),
        (Stats(5, 3.0, 1.0, 9.0), Stats(5, 3.0, 2.0, 4.0), True),  # one inside the other
        (Stats(0, None, None, None), Stats(5, 3.0, 2.0, 4.0), False),
    ],
)
def test_overlaps(a: Stats, b: Stats, expected: bool) -> None:
    assert overlaps(a, b) is expected
    assert overlaps(b, a) is expected


REF = Stats(50, 10.0, 8.0, 12.0)


@pytest.mark.parametrize(
    ("stats", "ref", "is_ref", "expected"),
    [
        (REF, REF, True, Comparison(None, None, "reference")),
        (Stats(40, 20.0, 15.0, 25.0), REF, False, Comparison(10.0, 1.0, "")),
        (Stats(40, 11.0, 9.0, 13.0), REF, False, Comparison(1.0, 0.1, "not separable")),
        (Stats(2, 20.0, 19.0, 21.0), REF, False, Comparison(10.0, 1.0, "too few")),
        (
            Stats(40, 20.0, 15.0, 25.0),
            Stats(2, 10.0, 9.0, 11.0),
            False,
            Comparison(10.0, 1.0, "too few"),
        ),  # a small reference is no reference
        (Stats(0, None, None, None), REF, False, Comparison(None, None, "too few")),
        (Stats(5, 1.0, 0.5, 1.5), Stats(5, 0.0, 0.0, 0.0), False, Comparison(1.0, None, "")),
    ],
)
def test_compare(stats: Stats, ref: Stats, is_ref: bool, expected: Comparison) -> None:
    got = compare(stats, ref, is_ref=is_ref)
    assert got.note == expected.note
    assert got.diff == pytest.approx(expected.diff)
    assert got.rel == pytest.approx(expected.rel)


@pytest.mark.parametrize(
    ("concurrency", "bucket"),
    [
        (None, "?"),
        (0, "?"),
        (1, "1"),
        (2, "2"),
        (3, "3–4"),
        (4, "3–4"),
        (5, "5–8"),
        (8, "5–8"),
        (9, "9–16"),
        (16, "9–16"),
        (17, "17+"),
        (64, "17+"),
    ],
)
def test_concurrency_bucket(concurrency: int | None, bucket: str) -> None:
    assert concurrency_bucket(concurrency) == bucket


@pytest.mark.parametrize(
    ("temperature", "defaulted", "label"),
    [
        (0.7, True, "0.7 (default)"),
        (0.7, False, "0.7"),
        (0.0, 0, "0"),
        (1.0, 1, "1 (default)"),
        (None, False, "unset"),
    ],
)
def test_temperature_label(temperature: float | None, defaulted: bool, label: str) -> None:
    assert temperature_label(temperature, defaulted) == label


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("22h", 79200.0),
        ("30m", 1800.0),
        ("90s", 90.0),
        ("90", 90.0),
        ("7d", 604800.0),
        ("1.5h", 5400.0),
        ("2w", 1209600.0),
        (" 3H ", 10800.0),
    ],
)
def test_parse_since(text: str, seconds: float) -> None:
    assert parse_since(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "-3h", "3y", "three hours"])
def test_parse_since_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_since(text)


def _row(
    variant: str,
    ttft: float | None = 0.2,
    outcome: str = "ok",
    concurrency: int = 1,
    temperature: float | None = 0.7,
    defaulted: int = 0,
) -> dict[str, object]:
    return {
        "variant": variant,
        "ttft_s": ttft,
        "itl_p50_s": None,
        "itl_p95_s": None,
        "tokens_per_step": None,
        "decode_tokens_per_s": None,
        "outcome": outcome,
        "concurrency": concurrency,
        "temperature": temperature,
        "temperature_defaulted": defaulted,
    }


def test_group_rows_largest_first() -> None:
    rows = [_row("b"), _row("a"), _row("b"), _row("c"), _row("c")]
    assert [(k, len(g)) for k, g in group_rows(rows, ["variant"])] == [
        (("b",), 2),
        (("c",), 2),
        (("a",), 1),
    ]  # ties in name order


def test_group_rows_by_several_keys() -> None:
    rows = [
        _row("a", concurrency=3, defaulted=1),
        _row("a", concurrency=4, defaulted=1),
        _row("a", concurrency=9),
    ]
    keys = [k for k, _ in group_rows(rows, ["variant", "temperature", "concurrency"])]
    assert keys == [("a", "0.7 (default)", "3–4"), ("a", "0.7", "9–16")]


def test_build_report_counts_failures_apart() -> None:
    rows = [
        _row("a", 0.1),
        _row("a", 0.2),
        _row("a", 0.3),
        _row("a", None, outcome="rejected"),
        _row("b", 0.5),
        _row("c", None, outcome="upstream_error"),
    ]
    groups = build_report(rows, ["variant"])
    assert [(g.key["variant"], g.requests, g.failed) for g in groups] == [
        ("a", 3, 1),
        ("b", 1, 0),
        ("c", 0, 1),
    ]
    ttft_b = groups[1].metrics["ttft_s"]
    assert ttft_b.stats.n == 1 and ttft_b.comparison.note == "too few"
    assert ttft_b.comparison.diff == pytest.approx(0.3)


# --- the command, on a log written by RequestLog ------------------------------------------------

FAST = ((0.010, 3), (0.012, 3), (0.011, 2), (0.010, 3))  # eagle3: ~3 tokens per step
SLOW = ((0.020, 1), (0.022, 1), (0.021, 1), (0.020, 1))  # base: one token per step


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A log with a clear winner, a close call, a tiny group, failures and an old request."""
    path = tmp_path / "requests.sqlite3"
    now = time.time()
    records = []
    for i in range(12):
        records.append(
            make_record(
                i,
                variant="eagle3",
                steps=FAST,
                ttft=0.20 + i * 0.002,
                defaulted=True,
                concurrency=1 + i % 4,
                wall=now - 600 + i,
            )
        )
    for i in range(12, 20):
        records.append(
            make_record(
                i,
                variant="base",
                steps=SLOW,
                ttft=0.21 + (i % 4) * 0.002,
                concurrency=1 + i % 2,
                wall=now - 500 + i,
            )
        )
    records.append(make_record(20, variant="mtp", steps=FAST, wall=now - 400))
    records.append(make_record(21, variant="base", outcome="upstream_error", wall=now - 300))
    records.append(make_record(22, variant="ngram", wall=now - 3 * 86400))  # outside 22h

    async def write() -> None:
        log = RequestLog(path)
        for record in records:
            log.sink(record)
        await log.stop()
        assert log.written == len(records)

    asyncio.run(write())
    return path


def test_text_report(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert report.main(["--db", str(db), "--since", "22h"]) == 0
    out = capsys.readouterr().out
    assert "22 requests, 21 ok" in out  # the 3-day-old one is outside the window
    assert "ngram" not in out
    assert "groups (largest first: the first is the reference)" in out
    lines = out.splitlines()
    itl = lines[lines.index("ITL p50 (ms)") + 2 : lines.index("ITL p50 (ms)") + 5]
    assert itl[0].split()[:2] == ["variant=eagle3", "12"] and itl[0].endswith("reference")
    assert itl[1].split()[:2] == ["variant=base", "8"] and "+" in itl[1]
    assert not itl[1].endswith(("not separable", "too few"))  # 2x the ITL: separable
    assert itl[2].split()[:2] == ["variant=mtp", "1"] and itl[2].endswith("too few")
    ttft = lines[lines.index("TTFT (ms)") + 3]
    assert ttft.startswith("  variant=base") and ttft.endswith("not separable")
    groups = lines[lines.index("groups (largest first: the first is the reference)") + 1 :]
    assert groups[0].split() == ["variant=eagle3", "12", "ok", "0", "failed"]
    assert groups[1].split() == ["variant=base", "8", "ok", "1", "failed"]


def test_json_report(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert report.main(["--db", str(db), "--json", "--by", "variant,temperature"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["by"] == ["variant", "temperature"] and data["requests"] == 22
    groups = {(g["key"]["variant"], g["key"]["temperature"]): g for g in data["groups"]}
    eagle = groups[("eagle3", "0.7 (default)")]
    base = groups[("base", "0.7")]
    assert eagle["requests"] == 12 and base["requests"] == 8 and base["failed"] == 1
    tps = eagle["metrics"]["tokens_per_step"]
    assert tps["stats"]["mean"] == pytest.approx(11 / 4)
    assert tps["comparison"]["note"] == "reference"
    base_itl = base["metrics"]["itl_p50_s"]
    assert base_itl["stats"]["n"] == 8 and base_itl["comparison"]["rel"] > 1.0
    assert base["metrics"]["decode_tokens_per_s"]["stats"]["mean"] == pytest.approx(
        4 / 0.083, rel=0.01
    )


def test_report_by_concurrency(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        report.main(
            ["--state-dir", str(db.parent), "--by", "concurrency", "--json", "--since", "all"]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    buckets = {g["key"]["concurrency"]: g["requests"] for g in data["groups"]}
    assert buckets == {"1": 9, "2": 7, "3–4": 6}  # the ngram request counts with 'all'


def test_report_finds_the_demo_log_by_itself(
    db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No flag, no variable, no gateway log in .state: the demo's (.state/demo) is read."""
    monkeypatch.delenv("SPECROUTER_STATE_DIR", raising=False)
    clone = tmp_path / "clone"
    (clone / ".state" / "demo").mkdir(parents=True)
    db.rename(clone / ".state" / "demo" / report.DB_NAME)
    monkeypatch.chdir(clone)
    assert report.main(["--since", "22h"]) == 0
    assert "request log .state/demo/requests.sqlite3" in capsys.readouterr().out


def test_report_errors(tmp_path: Path, db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert report.main(["--db", str(tmp_path / "missing.sqlite3")]) == 1
    assert "no request log" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        report.main(["--db", str(db), "--by", "colour"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit):
        report.main(["--db", str(db), "--since", "yesterday"])


def test_empty_window(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert report.main(["--db", str(db), "--since", "1s"]) == 0
    assert "no requests in this window" in capsys.readouterr().out


def test_plot(db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "report.png"
    assert report.main(["--db", str(db), "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib(
    db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if not installed
    assert report.main(["--db", str(db), "--plot", str(tmp_path / "x.png")]) == 2
    captured = capsys.readouterr()
    assert "TTFT" in captured.out and "needs matplotlib" in captured.err


def test_group_rows_by_session_and_agent_old_logs_included() -> None:
    rows = [
        {**_row("a"), "session": "s-1", "agent": "codex"},
        {**_row("a"), "session": "s-1", "agent": "codex"},
        {**_row("b"), "session": "s-2", "agent": "claude-code/subagent"},
        _row("b"),
    ]  # a row from a log written before sessions were logged
    assert [(k, len(g)) for k, g in group_rows(rows, ["session"])] == [
        (("s-1",), 2),
        (("(none)",), 1),
        (("s-2",), 1),
    ]
    assert [k for k, _ in group_rows(rows, ["agent"])] == [
        ("codex",),
        ("(none)",),
        ("claude-code/subagent",),
    ]


def test_report_names_both_engines_of_continued_streams(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "requests.sqlite3"
    records = [make_record(i, variant="base") for i in range(3)]
    for record in records[:2]:
        record.continued_from = "eagle3"

    async def write() -> None:
        log = RequestLog(path)
        for record in records:
            log.sink(record)
        await log.stop()

    asyncio.run(write())
    assert report.main(["--db", str(path), "--by", "continued_from"]) == 0
    out = capsys.readouterr().out
    assert "3 requests, 3 ok, 2 continued (eagle3->base x2)" in out
    groups = out.splitlines()[
        out.splitlines().index("groups (largest first: the first is the reference)") + 1 :
    ][:2]
    assert [g.split()[:2] for g in groups] == [
        ["continued_from=eagle3", "2"],
        ["continued_from=(none)", "1"],
    ]
