"""The gateway measures the same in front of the simulator's SGLang mode as in front of its vLLM
mode: one engine model (same profile, same seed), two wires. Per request, tokens per step from
SGLang's `spec_verify_ct` equal those from vLLM's per-request summary, with the same text and
tokens; per window, the scraped verify calls equal vLLM's drafts counter."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
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
