"""The simulator's /metrics families (its 0.32.0 mode) against the real vLLM 0.32.0's (the
families half; test_vllm_sim_bytes.py is the bytes half).

Every family on the real draft-model engine's page, with its type, must be on the simulator's
page, and the reverse, except the differences listed here with their reasons: the test fails
when a listed difference disappears or a new one appears.
"""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from loadtests.harness.vllm import DRAFT_TOKENS, SERVED
from loadtests.sim.metrics import SimMetrics
from tests.engines.vllm.conftest import Engines

# family -> why the real 0.32.0 page has it and the simulator's does not.
REAL_ONLY = {
    "vllm:tool_call_parser_invocations": (
        "counted by 0.32.0 when a tool-call parser is set (the engines here run qwen3_coder); "
        "the golden fixtures the simulator follows had none"
    ),
}
SIM_ONLY: dict[str, str] = {}


def _families(page: str) -> dict[str, str]:
    return {
        f.name: f.type
        for f in text_string_to_metric_families(page)
        if f.name.startswith("vllm:") and not f.name.endswith("_created")
    }


def test_the_simulators_families_are_the_real_engines(vllm: Engines) -> None:
    real = _families(vllm.draft.metrics_text())
    sim_metrics = SimMetrics(SERVED, 32768, DRAFT_TOKENS, vllm_version="0.32.0")
    sim = _families(generate_latest(sim_metrics.registry).decode())
    assert {f: REAL_ONLY.get(f, "?") for f in real.keys() - sim.keys()} == REAL_ONLY
    assert {f: SIM_ONLY.get(f, "?") for f in sim.keys() - real.keys()} == SIM_ONLY
    assert {f: (sim[f], real[f]) for f in real.keys() & sim.keys() if sim[f] != real[f]} == {}
