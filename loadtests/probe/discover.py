"""What is being probed: the model, the backends behind a gateway, the counters, the time scale."""

from __future__ import annotations

import argparse
import os
import ssl
from typing import Any

import httpx

from loadtests.probe.run import MetricsSource
from policies.capabilities import LlamaCppFamily
from proxy.vllm_wire import Family


def _base(url: str) -> str:
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _verify(args: argparse.Namespace) -> ssl.SSLContext | bool:
    if args.insecure:
        return False
    if args.ca_cert is not None:
        return ssl.create_default_context(cafile=str(args.ca_cert))
    return True


async def _get_json(
    client: httpx.AsyncClient, url: str, headers: dict[str, str] | None = None
) -> dict[str, Any] | None:
    try:
        resp = await client.get(url, headers=headers, timeout=5.0)
    except httpx.HTTPError:
        return None
    if resp.status_code != 200:
        return None
    try:
        data = resp.json()
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _engine_info(version: dict[str, Any] | None) -> dict[str, Any] | None:
    if version is None:
        return None
    sim = version.get("specrouter_sim")
    info: dict[str, Any] = {"vllm_version": version.get("version")}
    if isinstance(sim, dict):
        info["sim"] = sim
    return info


async def discover(
    args: argparse.Namespace, key: str | None, admin_token: str | None
) -> tuple[dict[str, Any], list[MetricsSource], float]:
    """What is being probed: (target description, counter sources, time scale)."""
    base = _base(args.url)
    verify = _verify(args)
    target: dict[str, Any] = {"url": base, "via": "gateway" if args.admin_url else "direct"}
    engines: dict[str, dict[str, Any] | None] = {}
    sources: list[MetricsSource] = []
    async with httpx.AsyncClient(verify=verify) as client:
        model = args.model
        if model is None:
            models = await _get_json(
                client, f"{base}/v1/models", {"authorization": f"Bearer {key}"} if key else None
            )
            data = (models or {}).get("data") or []
            if not data:
                raise SystemExit("specrouter probe: --model is required (no /v1/models answer)")
            model = str(data[0]["id"])
        target["model"] = model
        backends: list[str] | None = args.backend
        if args.admin_url:
            admin = _base(args.admin_url)
            hdr = {"authorization": f"Bearer {admin_token}"} if admin_token else None
            status = await _get_json(client, f"{admin}/admin/status", hdr)
            policy = await _get_json(client, f"{admin}/admin/policy", hdr)
            target["admin_url"] = admin
            target["policy_version"] = (status or policy or {}).get(
                "policy_version", (policy or {}).get("version")
            )
            doc = (policy or {}).get("document") or {}
            if backends is None:
                for route in (doc.get("routes") or {}).values():
                    if model in (route.get("models") or []):
                        backends = list(route.get("variants") or [])
                        target["route_rules"] = [r.get("name") for r in route.get("rules") or []]
                        target["route_defaults"] = route.get("defaults")
                        break
            described: dict[str, Any] = {}
            for name in backends or []:
                spec = (doc.get("backends") or {}).get(name) or {}
                urls = spec.get("urls") or ([spec["url"]] if spec.get("url") else [])
                described[name] = {"speculative": spec.get("speculative"), "urls": urls}
                for u in urls:
                    engines[u] = _engine_info(await _get_json(client, f"{_base(u)}/version"))
            target["backends"] = described
            if policy is None:
                target["note"] = "admin API not readable: no policy version or backend description"
        else:
            engines[base] = _engine_info(await _get_json(client, f"{base}/version"))
        target["engines"] = engines

        urls = args.metrics_url or (
            [f"{_base(args.admin_url)}/metrics"] if args.admin_url else [f"{base}/metrics"]
        )
        metrics_key = args.metrics_key or os.environ.get("SPECROUTER_PROBE_METRICS_KEY")
        hdr = {"authorization": f"Bearer {metrics_key}"} if metrics_key else {}
        for u in urls:
            hint = (
                ""
                if args.metrics_url or args.admin_url
                else " (behind the gateway, give --admin-url, or the engine's --metrics-url)"
            )
            try:
                resp = await client.get(u, timeout=5.0, headers=hdr)
            except httpx.HTTPError as exc:
                raise SystemExit(f"specrouter probe: cannot read {u}: {exc}{hint}") from exc
            text = resp.text if resp.status_code == 200 else ""
            if "specrouter_backend_generation_tokens" in text:
                sources.append(
                    MetricsSource(u, "gateway", tuple(backends) if backends is not None else None)
                )
            elif Family.GENERATION_TOKENS in text or LlamaCppFamily.GENERATION_TOKENS in text:
                sources.append(MetricsSource(u, "engine", key=metrics_key))
            else:
                raise SystemExit(
                    f"specrouter probe: {u} (HTTP {resp.status_code}) has neither "
                    f"an engine's generation counter nor the gateway's re-exported "
                    f"one{hint}"
                )
    target["metrics"] = [s.describe() for s in sources]

    scales = {float(e["sim"]["time_scale"]) for e in engines.values() if e and "sim" in e}
    if args.time_scale is not None:
        scale, how = args.time_scale, "--time-scale"
    elif len(scales) > 1:
        raise SystemExit(
            f"specrouter probe: the backends run different time scales {scales}; give --time-scale"
        )
    elif scales:
        scale, how = scales.pop(), "read from the engine's /version"
    else:
        scale, how = 1.0, "real time (no simulated engine found)"
    target["time_scale"] = {"value": scale, "source": how}
    return target, sources, scale


def default_label(target: dict[str, Any]) -> str:
    profiles = sorted(
        {e["sim"]["profile"] for e in target.get("engines", {}).values() if e and "sim" in e}
    )
    if profiles:
        name = "+".join(profiles)
    else:
        specs = [b.get("speculative") for b in (target.get("backends") or {}).values()]
        name = "+".join(_spec_name(s) for s in specs) if specs else str(target.get("model"))
    return name + ("@gateway" if target.get("via") == "gateway" else "")


def _spec_name(spec: dict[str, Any] | None) -> str:
    if not spec:
        return "nospec"
    name = f"{spec.get('method')}{spec.get('num_speculative_tokens')}"
    if spec.get("draft_sample_method") == "probabilistic":
        name += "-prob"
    if spec.get("rejection_sample_method") == "block":
        name += "-block"
    return name


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text)
