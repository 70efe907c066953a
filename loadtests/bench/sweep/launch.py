"""Starts one configuration on loopback: a `specrouter sim` process per device, then (unless
`direct`) a TLS gateway on the configuration's policy; yields the replay's target."""

from __future__ import annotations

import contextlib
import ssl
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from loadtests.harness.device import DeviceSim
from loadtests.harness.gateway import CLIENT_KEY, GatewayServer
from loadtests.replay.cli import Address
from proxy.auth import hash_key

from .configs import PROFILES, Config, gateway_policy

# As `specrouter replay --sim`: the engines parse the agents' tool calls.
ENGINE_FLAGS = ("--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder")


def profile_file(config: Config, folder: Path) -> Path:
    """Simulated profiles named after the backends, at the max-model-len the policy gives each
    (co-located engines need the shorter length to fit; alone, the profile's 262144)."""
    engines: dict[str, Any] = {}
    if config.policy is not None:
        engines = {
            name: (spec.get("engine") or {})
            for name, spec in _policy_doc(config)["backends"].items()
        }
    out: dict[str, dict[str, Any]] = {}
    for backend in config.engines:
        out[backend] = {"base": PROFILES[backend]}
        length = engines.get(backend, {}).get("max_model_len")
        if length is not None and config.colocated:
            out[backend]["max_model_len"] = int(length)
    path = folder / "profiles.yaml"
    path.write_text(yaml.safe_dump(out, sort_keys=False))
    return path


def _policy_doc(config: Config) -> dict[str, Any]:
    assert config.policy is not None
    doc: dict[str, Any] = yaml.safe_load(config.policy.read_text())
    return doc if config.edit is None else config.edit(doc)


@contextlib.contextmanager
def started(
    config: Config, *, time_scale: float, seed: int
) -> Iterator[tuple[Address, dict[str, int], GatewayServer | None]]:
    """The replay's target, each engine's KV tokens (as its simulator announced them) and the
    gateway, if the configuration has one (its metrics say what its policy did)."""
    with contextlib.ExitStack() as stack:
        urls: dict[str, str] = {}
        pids: list[int] = []
        kv: dict[str, int] = {}
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sweep-")))
        flags = (
            *ENGINE_FLAGS,
            "--profile-file",
            str(profile_file(config, folder)),
            "--kv-budget",
            config.kv_budget,
        )
        for i, backends in enumerate(config.devices):
            dev = stack.enter_context(
                DeviceSim(
                    [(b, b, None) for b in backends],
                    time_scale=time_scale,
                    overlap=config.overlap,
                    device=f"gb10-{i}",
                    seed=seed,
                    extra=flags,
                )
            )
            assert dev.child.proc is not None
            pids.append(dev.child.proc.pid)
            urls.update(dev.urls)
            kv.update(dev.kv_tokens)
        metrics = [urls[b] for b in config.engines]
        if config.policy is None:
            target = Address(urls[config.engines[0]], True, None, metrics, {"simulator": pids})
            yield target, kv, None
            return
        gw = stack.enter_context(
            GatewayServer(gateway_policy(config, urls, hash_key(CLIENT_KEY), time_scale))
        )
        assert gw.proc is not None
        verify = ssl.create_default_context(cafile=str(gw.certs.ca_cert))
        pids_by = {"simulator": pids, "gateway": [gw.proc.pid]}
        yield Address(gw.base, verify, CLIENT_KEY, metrics, pids_by), kv, gw
