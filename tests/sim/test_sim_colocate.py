"""`specrouter sim --engine ...`: several engines of one device in one process."""

from __future__ import annotations

import httpx
import pytest

from loadtests.harness.device import DeviceSim
from loadtests.sim.colocate import EngineSpec, kv_tokens, parse_engine
from loadtests.sim.device import kv_tokens_from_share, kv_tokens_split
from loadtests.sim.profiles import BUILTIN_PROFILES

DEEP, MTP = BUILTIN_PROFILES["dflash7-prob-block"], BUILTIN_PROFILES["mtp3"]


def test_parse_engine() -> None:
    assert parse_engine("deep:8001:mtp3") == EngineSpec("deep", 8001, "mtp3", None)
    assert parse_engine("deep:0:mtp3:0.26").share == 0.26
    for bad in ("deep:8001", ":1:mtp3", "deep:1:mtp3:1.5", "deep:x:mtp3"):
        with pytest.raises(ValueError):
            parse_engine(bad)


def test_memory_of_co_located_engines() -> None:
    alone = [EngineSpec("a", 0, DEEP.name, None)]
    # Alone: the machine's limit by default (what `deploy render` gives gb10.yaml's engine:
    # tests/ops/test_kv_budget.py), the documents' 36 GiB by name, at most a number of GiB.
    assert kv_tokens(alone, BUILTIN_PROFILES) == [1_609_965]
    assert kv_tokens(alone, BUILTIN_PROFILES, "documents") == [DEEP.kv_cache_tokens] == [813_427]
    assert kv_tokens(alone, BUILTIN_PROFILES, 18.0) == [813_427 // 2]
    pair = [EngineSpec("a", 0, DEEP.name, None), EngineSpec("b", 0, MTP.name, None)]
    assert kv_tokens(pair, BUILTIN_PROFILES) == kv_tokens_split([DEEP, MTP])
    shared = [EngineSpec("a", 0, DEEP.name, 0.26), EngineSpec("b", 0, MTP.name, None)]
    assert kv_tokens(shared, BUILTIN_PROFILES)[0] == kv_tokens_from_share(DEEP, 0.26)


def test_one_process_serves_the_device_engines() -> None:
    with DeviceSim([("deep", DEEP.name, 0.26), ("mtp", MTP.name, 0.26)]) as dev:
        assert set(dev.urls) == {"deep", "mtp"} and dev.urls["deep"] != dev.urls["mtp"]
        assert dev.kv_tokens["deep"] == kv_tokens_from_share(DEEP, 0.26)
        assert dev.kv_tokens["deep"] < dev.kv_tokens["mtp"]  # no drafter weights, more KV
        for name, url in dev.urls.items():
            body = {
                "model": "qwen3.8-27b",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": f"hello {name}"}],
            }
            r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=10)
            assert r.status_code == 200, r.text
            metrics = httpx.get(f"{url}/metrics", timeout=5).text
            assert "vllm:num_preemptions_total" in metrics
        proc = dev.child.proc
    assert proc is not None and proc.returncode == 0


def test_one_engine_takes_the_kv_budget() -> None:
    """`specrouter sim` alone (no --engine): --kv-budget sizes it, --kv-share overrides it."""
    import argparse

    from loadtests.sim.colocate import add_arguments, single
    from loadtests.sim.state import SimConfig

    p = argparse.ArgumentParser()
    add_arguments(p)
    config = SimConfig(profile=DEEP, served_model_name=DEEP.served_model_name)
    assert single(p.parse_args([]), config).kv_cache_tokens == 1_609_965
    assert single(p.parse_args(["--kv-budget", "documents"]), config).kv_cache_tokens == 813_427
    share = p.parse_args(["--kv-budget", "documents", "--kv-share", "0.26"])
    assert single(share, config).kv_cache_tokens == kv_tokens_from_share(DEEP, 0.26)
    with pytest.raises(ValueError, match="holds less than one max-model-len request"):
        single(p.parse_args(["--kv-budget", "5"]), config)
    with pytest.raises(SystemExit):
        p.parse_args(["--kv-budget", "lots"])
