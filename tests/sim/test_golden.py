"""The simulator in each version mode against that vLLM's own bytes
(tests/fixtures/vllm-golden/0.28.0 and 0.33.0).

Every fixture's request is sent to an in-process simulator whose engine plays back the
fixture's engine outputs (`loadtests.sim.playback.Playback`: same prompt token ids, same output
texts, token ids and finish reasons, one read per engine output), then the body is compared
frame by frame after the README's normalisation (ids, timestamps, fingerprint hash, /metrics
process samples). What still differs is listed in EXPECTED, with how many frames differ: the test
fails when a listed difference disappears or changes, or a new one appears.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from loadtests.sim.engine import Delta
from loadtests.sim.playback import Playback
from loadtests.sim.profiles import BUILTIN_PROFILES
from loadtests.sim.sequences import SpecStats
from loadtests.sim.server import create_app
from loadtests.sim.state import SimConfig
from tests.golden import GOLDEN, VERSIONS

# fixture -> (frames that differ, why). Frames: SSE events, or 1 for a JSON body.
EXPECTED_028: dict[str, tuple[int, str]] = {
    "anth_count_tokens": (
        1,
        "count_tokens: the simulator's tokenizer counts the rendered prompt "
        "differently from the fixture's synthetic prompt ids",
    ),
    "emb_float_no_orjson": (
        1,
        "vLLM 0.28 without orjson importable writes Python doubles; the simulator imitates an "
        "image with orjson installed (emb_float matches)",
    ),
    "emb_base64": (1, "vectors: the simulator's hash-seeded vector differs from the fixture's"),
    "metrics_k0": (
        26,
        "the families whose values come from the stats input.json records through "
        "PrometheusStatLogger (3 finished requests, not replayed into the sim); every other "
        "family matches (metrics_k7_fresh: all of them)",
    ),
    "metrics_k7": (30, "as metrics_k0, with the 4 spec_decode families' recorded values too"),
}

EXPECTED_033: dict[str, tuple[int, str]] = {
    "anth_count_tokens": EXPECTED_028["anth_count_tokens"],
    "emb_base64": EXPECTED_028["emb_base64"],
    "metrics_k0": (
        28,
        "as in 0.28, with 0.33's prompt_tokens_cached_by_source and request_num_preemptions",
    ),
    "metrics_k7": (32, "as metrics_k0, with the 4 spec_decode families' recorded values too"),
}
EXPECTED = {"0.28.0": EXPECTED_028, "0.33.0": EXPECTED_033}


# -- normalisation (README "Comparing a simulator's bytes with these") ---------------------------

_SUBS = [
    (re.compile(rb"chatcmpl-tool-[0-9a-f]{16}"), b"chatcmpl-tool-<ID>"),
    (re.compile(rb"(chatcmpl|cmpl|embd)-[0-9a-f]{16}"), rb"\1-<ID>"),
    (re.compile(rb"modelperm-[0-9a-f]{16}"), b"modelperm-<ID>"),
    (re.compile(rb'"(created|created_at)":\d+'), rb'"\1":<T>'),
    (re.compile(rb"(vllm-[0-9][^\"]*?)-[0-9a-f]{8}\""), rb'\1-<HASH>"'),
    # Anthropic thinking signatures: a fresh uuid4 hex per block in vLLM itself.
    (re.compile(rb'"signature":"[0-9a-f]{32}"'), b'"signature":"<SIG>"'),
]
_RESPONSES_IDS = re.compile(rb"resp_[0-9a-f]{16}|msg_[0-9a-f]{16}|(?<=\")[0-9a-f]{16}(?=\")")
_PROM_DROP = re.compile(r"^(# (HELP|TYPE) )?(process_|python_gc_|python_info|http_)")


def normalise(body: bytes, kind: str) -> list[bytes]:
    if kind == "prom":
        return _prom_frames(body.decode())
    for pattern, repl in _SUBS:
        body = pattern.sub(repl, body)
    if kind.startswith("responses"):
        seen: dict[bytes, bytes] = {}
        body = _RESPONSES_IDS.sub(
            lambda m: seen.setdefault(m.group(0), b"<ID%d>" % len(seen)), body
        )
    if kind.endswith("sse"):
        return [f for f in body.split(b"\n\n") if f]
    return [body]


def _prom_frames(text: str) -> list[bytes]:
    """One frame per vLLM family (HELP, TYPE, samples), by name: the exposition order is the
    registration order, which is not part of the format. `_created` samples are dropped and
    cache_config_info label values masked."""
    families: dict[str, list[str]] = {}
    name = ""
    for line in text.splitlines():
        if _PROM_DROP.match(line) or not line:
            continue
        if line.startswith("# HELP "):
            name = line.split(" ", 3)[2]
        if name.endswith("_created") or re.match(r"^\S+_created[{ ]", line):
            continue  # a timestamp, written as its own family by some exposition formats
        if "vllm:cache_config_info" in line and not line.startswith("#"):
            line = re.sub(r'="[^"]*"', '="<V>"', line)
        families.setdefault(name, []).append(line)
    return ["\n".join(families[n]).encode() for n in sorted(families)]


# -- driving the simulator ----------------------------------------------------------------------


def _fixtures(version: str) -> list[str]:
    return sorted(p.name[: -len(".input.json")] for p in (GOLDEN / version).glob("*.input.json"))


def _body_file(version: str, name: str) -> Path:
    (path,) = [
        p for p in (GOLDEN / version).glob(name + ".*") if not p.name.endswith(".input.json")
    ]
    return path


def _route(name: str, spec: dict[str, Any]) -> tuple[str, str]:
    http = spec.get("http", {})
    if "path" in http:
        return http.get("method", "POST"), http["path"]
    prefix = name.split("_", 1)[0]
    paths = {
        "chat": "/v1/chat/completions",
        "cmpl": "/v1/completions",
        "emb": "/v1/embeddings",
        "responses": "/v1/responses",
    }
    return "POST", paths[prefix]


def _script(spec: dict[str, Any]) -> Playback | None:
    eo = spec.get("engine_outputs")
    if not eo or "request_outputs" not in eo:
        return None
    steps = [
        [
            Delta(o["index"], o["text"], list(o["token_ids"]), o["finish_reason"], o["stop_reason"])
            for o in ro["outputs"]
        ]
        for ro in eo["request_outputs"]
    ]
    spec = None
    if "spec_decode" in eo:
        spec = SpecStats(eo["spec_decode"]["num_speculative_tokens"])
        for step in eo["spec_decode"]["verify_steps"]:
            spec.record(step["num_accepted"])
    return Playback(
        list(eo["prompt_token_ids"]),
        steps,
        cached_tokens=eo.get("num_cached_tokens") or 0,
        spec=spec,
    )


def _config(version: str, spec: dict[str, Any]) -> SimConfig:
    server = spec["server"]
    flags = " ".join(server.get("flags", []))
    summary = "--per-request-spec-decode-metrics" in flags
    if server["served_model_name"].endswith("embed"):
        profile = BUILTIN_PROFILES["embed"]
    elif "num_speculative_tokens" in flags:
        profile = BUILTIN_PROFILES["dflash7-prob-block"]
    else:
        profile = BUILTIN_PROFILES["nospec"]
    return SimConfig(
        profile=profile,
        served_model_name=server["served_model_name"],
        time_scale=0.0,
        enable_auto_tool_choice=bool(server.get("enable_auto_tool_choice")),
        tool_call_parser=server.get("tool_call_parser"),
        reasoning_parser=server.get("reasoning_parser"),
        vllm_version=version,
        spec_metrics="summary" if summary else "none",
        enable_prompt_tokens_details="--enable-prompt-tokens-details" in flags,
    )


async def _simulate(version: str, name: str, spec: dict[str, Any]) -> bytes:
    app, sim = create_app(_config(version, spec))
    sim.playback = _script(spec)
    method, path = _route(name, spec)
    transport = httpx.ASGITransport(app=app)
    sim.engine.start()  # requests the script does not answer (no engine outputs) still finish
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
            if method == "GET":
                resp = await client.get(path, timeout=10)
            else:
                resp = await client.post(path, json=spec["request_body"], timeout=10)
    finally:
        sim.abort_all()
        await sim.engine.stop()
    return resp.content


def _kind(path: Path) -> str:
    if path.suffix == ".prom":
        return "prom"
    kind = "sse" if path.suffix == ".sse" else "json"
    return "responses_" + kind if path.name.startswith("responses_") else kind


def compare(version: str, name: str) -> list[tuple[int, bytes | None, bytes | None]]:
    """(frame index, vLLM's frame, the simulator's) for every frame that differs."""
    spec = json.loads((GOLDEN / version / f"{name}.input.json").read_text())
    golden_file = _body_file(version, name)
    kind = _kind(golden_file)
    ours = normalise(asyncio.run(_simulate(version, name, spec)), kind)
    theirs = normalise(golden_file.read_bytes(), kind)
    if kind == "prom":  # families by name: a missing family is one difference, not a shift
        mine, vllm = _by_family(ours), _by_family(theirs)
        names = sorted(set(mine) | set(vllm))
        return [
            (i, vllm.get(n), mine.get(n)) for i, n in enumerate(names) if vllm.get(n) != mine.get(n)
        ]
    diffs: list[tuple[int, bytes | None, bytes | None]] = []
    for i in range(max(len(ours), len(theirs))):
        a = theirs[i] if i < len(theirs) else None
        b = ours[i] if i < len(ours) else None
        if a != b:
            diffs.append((i, a, b))
    return diffs


def _by_family(frames: list[bytes]) -> dict[bytes, bytes]:
    return {f.split(b"\n", 1)[0]: f for f in frames}


CASES = [(v, n) for v in VERSIONS for n in _fixtures(v)]


@pytest.mark.parametrize(("version", "name"), CASES, ids=[f"{v}-{n}" for v, n in CASES])
def test_fixture(version: str, name: str) -> None:
    diffs = compare(version, name)
    shown = "\n".join(f"[{i}]\n  vllm: {a!r}\n  sim:  {b!r}" for i, a, b in diffs[:3])
    expected = EXPECTED[version]
    if name not in expected:
        assert not diffs, f"{name}: {len(diffs)} frames differ from vLLM {version}\n{shown}"
        return
    count, reason = expected[name]
    assert diffs, f"{name} now matches vLLM: drop it from EXPECTED ({reason})"
    assert len(diffs) == count, f"{name}: {len(diffs)} frames differ, {count} expected\n{shown}"


@pytest.mark.parametrize("version", VERSIONS)
def test_expected_names_exist(version: str) -> None:
    assert set(EXPECTED[version]) <= set(_fixtures(version))


if __name__ == "__main__":  # a report of every difference, for updating EXPECTED
    import sys

    for n in _fixtures(sys.argv[1]):
        d = compare(sys.argv[1], n)
        print(f"{n}: {len(d)}")
        for i, a, b in d[:2]:
            print(f"   [{i}] vllm: {(a or b'')[:400]!r}\n        sim:  {(b or b'')[:400]!r}")
