"""The gateway measures the same in front of the simulator's SGLang mode as in front of its vLLM
mode: one engine model (same profile, same seed), two wires. Per request, tokens per step from
SGLang's `spec_verify_ct` equal those from vLLM's per-request summary, with the same text and
tokens; per window, the scraped verify calls equal vLLM's drafts counter."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from loadtests.harness.gateway import GatewayServer, coder_policy
from loadtests.harness.requestlog import logged_rows
from loadtests.harness.sim import SimServer
from proxy.certs import CertFiles

MODEL = "qwen3.8-27b"
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
INPUTS: dict[str, dict[str, Any]] = {
    "chat": {"messages": [{"role": "user", "content": "Write a function that adds two ints."}]},
    "completions": {"prompt": "def add(a: int, b: int) -> int:"},
}


@pytest.fixture(scope="module")
def gw(certs: CertFiles) -> Iterator[GatewayServer]:
    common: dict[str, Any] = {"served_model_name": MODEL, "spec_metrics": "summary", "seed": 7}
    with (
        SimServer(**common) as vsim,
        SimServer(**common, extra_args=("--engine-kind", "sglang")) as ssim,
    ):
        doc = coder_policy({"vllm": vsim.url, "sglang": ssim.url}, defaults={})
        doc["backends"]["sglang"]["kind"] = "sglang"
        with GatewayServer(doc, certs=certs) as gw:
            yield gw


def _text(endpoint: str, raw: bytes) -> str:
    out = []
    for frame in raw.split(b"\n\n"):
        if not frame.startswith(b"data: {"):
            continue
        for choice in orjson.loads(frame[6:])["choices"]:
            out.append(
                choice["delta"].get("content") or "" if endpoint == "chat" else choice["text"]
            )
    return "".join(out)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_the_same_figures_through_both_wires(gw: GatewayServer, endpoint: str) -> None:
    body = {"model": MODEL, "max_tokens": 96, "temperature": 0, "stream": True, **INPUTS[endpoint]}
    texts = {}
    for variant in ("vllm", "sglang"):
        rid = f"{endpoint}-{variant}"
        headers = {"x-request-id": rid, "x-specrouter-variant": variant}
        with gw.client() as c:
            r = c.post(PATHS[endpoint], json=body, headers=headers)
        assert r.status_code == 200, r.text
        assert r.headers["x-specrouter-variant"] == variant
        assert b"sglext" not in r.content and b'"usage":{' not in r.content  # asked, then cut
        texts[variant] = _text(endpoint, r.content)
    rows = logged_rows(gw.dir / "state", {f"{endpoint}-vllm", f"{endpoint}-sglang"})
    v, s = rows[f"{endpoint}-vllm"], rows[f"{endpoint}-sglang"]
    assert texts["vllm"] == texts["sglang"] != ""
    assert s["tps_source"] == v["tps_source"] == "engine"
    assert s["completion_tokens"] == v["completion_tokens"] > 1
    assert s["tokens_per_step"] == pytest.approx(v["tokens_per_step"])
    assert s["tokens_per_step"] > 1.0  # the profile's drafts were accepted


GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "sglang-golden" / "0.5.23"
TYPED: dict[str, tuple[str, dict[str, Any]]] = {
    "messages": ("/v1/messages", {"max_tokens": 96, "messages": INPUTS["chat"]["messages"]}),
    "responses": ("/v1/responses", {"max_output_tokens": 96, "input": "Add two ints."}),
}


def _events(raw: bytes) -> list[str]:
    """The event types in order, a run of deltas as one."""
    out: list[str] = []
    for line in raw.split(b"\n"):
        if line.startswith(b"event: ") and (kind := line[7:].decode()) not in out[-1:]:
            out.append(kind)
    return out


def _typed_text(raw: bytes) -> str:
    out = []
    for line in raw.split(b"\n"):
        if line.startswith(b"data: {"):
            obj = orjson.loads(line[6:])
            delta = obj.get("delta")
            out.append(delta.get("text", "") if isinstance(delta, dict) else "")
            if obj.get("type") == "response.output_text.delta":
                out.append(obj["delta"])
    return "".join(out)


@pytest.mark.parametrize("api", ["messages", "responses"])
def test_messages_and_responses_in_sglangs_events(gw: GatewayServer, api: str) -> None:
    """SGLang serves both APIs: the SGLang-mode simulator answers them in SGLang's event order
    (the frozen stream's, deltas aside), the same text as vLLM mode, and the gateway measures
    both streams alike (the request average: neither engine sends per-event counts)."""
    path, extra = TYPED[api]
    body = {"model": MODEL, "temperature": 0, "stream": True, **extra}
    texts, rows = {}, {}
    for variant in ("vllm", "sglang"):
        rid = f"{api}-{variant}"
        headers = {"x-request-id": rid, "x-specrouter-variant": variant}
        with gw.client() as c:
            r = c.post(path, json=body, headers=headers)
        assert r.status_code == 200, r.text
        texts[variant] = _typed_text(r.content)
        if variant == "sglang":
            frozen = (GOLDEN / f"{api}_stream.sse").read_bytes()
            assert _events(r.content)[:-1] == _events(frozen)[:-1]  # the last: how it ended
    rows = logged_rows(gw.dir / "state", {f"{api}-vllm", f"{api}-sglang"})
    v, s = rows[f"{api}-vllm"], rows[f"{api}-sglang"]
    assert texts["vllm"] == texts["sglang"] != ""
    assert s["completion_tokens"] == v["completion_tokens"] > 1
    assert (s["tps_source"], s["tokens_per_step"]) == (
        v["tps_source"],
        pytest.approx(v["tokens_per_step"]),
    )
    body["stream"] = False  # to both, so the scrapes stay comparable (below)
    answers = {}
    for variant in ("vllm", "sglang"):
        with gw.client() as c:
            r = c.post(path, json=body, headers={"x-specrouter-variant": variant})
        assert r.status_code == 200, r.text
        answers[variant] = r.json()
    frozen = orjson.loads((GOLDEN / f"{api}_full.json").read_bytes())
    assert list(answers["sglang"]) == list(frozen)
    text = {
        v: (a["content"] if api == "messages" else a["output"][-1]["content"])
        for v, a in answers.items()
    }
    assert text["vllm"][0]["text"] == text["sglang"][0]["text"] == texts["sglang"]


def test_the_scrapes_agree(gw: GatewayServer) -> None:
    """After the same requests on both: SGLang's verify calls and generated tokens, scraped and
    re-exported, equal vLLM's drafts and generated tokens."""
    families = ("spec_drafts_total", "generation_tokens_total")

    def values() -> dict[tuple[str, str], float]:
        text = gw.admin_get("/metrics").text
        out = {}
        for fam in families:
            for b in ("vllm", "sglang"):
                m = re.search(rf'specrouter_backend_{fam}\{{backend="{b}"\}} (\S+)', text)
                out[(fam, b)] = float(m.group(1)) if m else -1.0
        return out

    deadline = time.monotonic() + 10.0  # within a scrape interval of the last request
    while True:
        seen = values()
        if all(seen[(f, "vllm")] == seen[(f, "sglang")] > 0 for f in families):
            break
        assert time.monotonic() < deadline, seen
        time.sleep(0.1)
