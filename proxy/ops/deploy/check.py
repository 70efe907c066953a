"""`specrouter deploy check`: a compose file, or the running engines, against the policy.

A compose service's `vllm serve` command line is read back into flags and compared with the
engine plan; the running engines are asked what they serve and how many positions they draft."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from policies.spec.backends import BackendSpec, SpeculativeSpec
from policies.spec.document import PolicyDocument
from proxy.ops.deploy import draft_schedule, llamacpp, sglang, versions
from proxy.ops.deploy.compose_read import EngineArgs, as_list, compose_engines
from proxy.ops.deploy.compose_read import parse_vllm_args as parse_vllm_args
from proxy.ops.deploy.launch_check import check_launch, check_memory
from proxy.ops.deploy.plan import (
    NO_DRAFTER_METHODS,
    EnginePlan,
    engine_plans,
    memory_params,
    secret_env,
    speculative_config,
    to_json,
)

# Checking ---------------------------------------------------------------------------------------


def _spec_of(engine: EngineArgs) -> tuple[dict[str, Any] | None, str | None]:
    raw = engine.flags.get("speculative-config")
    if raw is None:
        return None, None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        return None, f"--speculative-config is not JSON ({exc.msg})"
    if not isinstance(value, dict):
        return None, "--speculative-config is not a JSON object"
    return value, None


_SPEC_DEFAULTS: dict[str, Any] = {
    "draft_sample_method": "greedy",
    "rejection_sample_method": "standard",
    "num_speculative_tokens_per_batch_size": None,
}


def _check_speculative(
    where: str, policy: SpeculativeSpec | None, engine: EngineArgs, version: str
) -> list[str]:
    running, error = _spec_of(engine)
    if error is not None:
        return [f"{where}: {error}"]
    if policy is None:
        if running is not None:
            return [
                f"{where}: the engine speculates ({to_json(running)}) but the policy "
                "describes no speculative configuration"
            ]
        return []
    if running is None:
        return [
            f"{where}: the policy says speculative {policy.method} with "
            f"{policy.num_speculative_tokens} tokens, the engine has no --speculative-config"
        ]
    out: list[str] = []
    want = speculative_config(policy, None)
    for key in ("method", "num_speculative_tokens", *_SPEC_DEFAULTS):
        have_value = running.get(key, _SPEC_DEFAULTS.get(key))
        want_value = want.get(key, _SPEC_DEFAULTS.get(key))
        if have_value != want_value:
            out.append(
                f"{where}: speculative {key} is {to_json(have_value)} in the compose file, "
                f"{to_json(want_value)} in the policy"
            )
    known = {"model", *want, *_SPEC_DEFAULTS}
    for key in sorted(set(running) - known):
        out.append(
            f"{where}: speculative {key} = {to_json(running[key])} is not in the policy "
            "(the policy cannot label metrics with it)"
        )
    if policy.method not in NO_DRAFTER_METHODS and not running.get("model"):
        out.append(
            f"{where}: speculative method {policy.method} needs a drafter model "
            '("model" in --speculative-config)'
        )
    if policy.num_speculative_tokens_per_batch_size is not None:
        reason = draft_schedule.refusal(version, policy.method)
        if reason is not None:
            out.append(f"{where}: {reason}")
    if (
        version in versions.SUPPORTED
        and versions.has_flag(version, versions.PER_REQUEST_SPEC_FLAG)
        and engine.flags.get("per-request-spec-decode-metrics") != "summary"
    ):
        out.append(
            f"{where}: --per-request-spec-decode-metrics is "
            f"{engine.flags.get('per-request-spec-decode-metrics')!r}, not 'summary' "
            "(the gateway would estimate acceptance instead of reading it)"
        )
    return out


def _check_engine(plan: EnginePlan, engine: EngineArgs) -> list[str]:
    where = f"service {engine.service} (backend {plan.backend})"
    spec = plan.spec
    out: list[str] = []

    def flag(name: str, want: str | None, what: str) -> None:
        have = engine.flags.get(name)
        if have != want:
            out.append(
                f"{where}: --{name} is {have!r} in the compose file, {want!r} in the "
                f"policy ({what})"
            )

    flag("served-model-name", spec.served_model_name, "served_model_name")
    flag("max-num-seqs", str(spec.max_concurrency), "max_concurrency")
    flag("port", str(plan.port), f"the port of {spec.engine_urls[0]}")
    has_key = "api-key" in engine.flags or "VLLM_API_KEY" in engine.environment
    if spec.api_key and not has_key:
        out.append(
            f"{where}: the policy sends the secret {spec.api_key} but the engine has "
            "no --api-key (nor VLLM_API_KEY)"
        )
    elif not spec.api_key and has_key:
        out.append(f"{where}: the engine requires an API key but the policy sets no api_key")
    priority = engine.flags.get("scheduling-policy") == "priority"
    if priority != spec.priority_scheduling:
        out.append(
            f"{where}: scheduling policy is {'priority' if priority else 'fcfs'} in the "
            f"compose file, priority_scheduling is {spec.priority_scheduling} in the policy"
        )
    pooling = engine.flags.get("runner") == "pooling" or engine.flags.get("task") == "embed"
    if (spec.task == "embed") != pooling:
        out.append(
            f"{where}: the engine runs as {'pooling' if pooling else 'generate'}, the "
            f"policy's task is {spec.task}"
        )
    out += _check_speculative(where, spec.speculative, engine, plan.version)
    out += check_launch(where, plan, engine)
    return out


def check_compose(
    doc: PolicyDocument,
    compose: Mapping[str, Any],
    *,
    compose_dir: Path | None = None,
    policy: Path | None = None,
) -> list[str]:
    """Every difference between a compose document and the policy; empty when they agree.

    Engine services are matched to backends by their `io.specrouter.backend` label, else by
    service name. With `compose_dir` and `policy`, the gateway service must serve that file."""
    plans, _ = engine_plans(doc)
    engines = compose_engines(compose)
    by_service = {p.service: p for p in plans}
    matched: set[str] = set()
    pairs: list[tuple[EnginePlan, EngineArgs]] = []
    out: list[str] = []
    for engine in engines.values():
        plan = by_service.get(engine.service)
        if engine.backend is not None:
            candidates = [p for p in plans if p.backend == engine.backend]
            if not candidates:
                out.append(
                    f"service {engine.service}: labelled backend {engine.backend!r}, "
                    "which the policy does not run on this machine"
                )
                continue
            port = engine.flags.get("port")
            plan = next(
                (p for p in candidates if p.service == engine.service),
                next(
                    (p for p in candidates if str(p.port) == port),
                    candidates[0] if len(candidates) == 1 else None,
                ),
            )
        if plan is None:
            out.append(
                f"service {engine.service}: a vLLM engine that no backend of the policy describes"
            )
            continue
        if plan.service in matched:
            out.append(f"service {engine.service}: a second engine for backend {plan.backend}")
            continue
        matched.add(plan.service)
        pairs.append((plan, engine))
        out += _check_engine(plan, engine)
    out += check_memory(pairs, memory_params(doc))
    out += llamacpp.check_services(doc, compose)
    out += sglang.check_services(doc, compose)
    for plan in plans:
        if plan.service not in matched:
            out.append(
                f"backend {plan.backend}: no engine service {plan.service} in the compose "
                f"file (the policy reaches it at {plan.spec.engine_urls[0]})"
            )
    if compose_dir is not None and policy is not None:
        out += _check_gateway_policy(compose, compose_dir, policy)
    return out


def _check_gateway_policy(compose: Mapping[str, Any], compose_dir: Path, policy: Path) -> list[str]:
    services = compose.get("services") or {}
    for name, service in services.items():
        if not isinstance(service, dict):
            continue
        argv = as_list(service.get("command"))
        if "serve" not in argv[:3] or not any(a.startswith("--config") for a in argv):
            continue
        config = _flag_value(argv, "--config")
        if config is None:
            continue
        for volume in as_list(service.get("volumes")):
            source, _, rest = volume.partition(":")
            target = rest.split(":")[0]
            if "$" in source or not config.startswith(target.rstrip("/") + "/"):
                continue
            host = (compose_dir / source / config[len(target.rstrip("/")) + 1 :]).resolve()
            if host != policy.resolve():
                return [
                    f"service {name}: the gateway serves {host}, not the checked policy "
                    f"{policy.resolve()}"
                ]
            return []
    return []


def _flag_value(argv: Sequence[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
    return None


# Checking the running engines ----------------------------------------------------------------

# GET url with headers -> body, or None when the engine cannot be reached.
Fetch = Callable[[str, Mapping[str, str]], str | None]


def http_fetch(timeout_s: float = 5.0) -> Fetch:
    import httpx

    def fetch(url: str, headers: Mapping[str, str]) -> str | None:
        try:
            resp = httpx.get(url, headers=dict(headers), timeout=timeout_s)
        except httpx.HTTPError:
            return None
        return resp.text if resp.status_code == 200 else None

    return fetch


def draft_positions(metrics_text: str) -> int | None:
    """How many draft positions an engine counts (`vllm:spec_decode_num_accepted_tokens_per_pos`
    has one series per position from the start), or None when it reports none."""
    from prometheus_client.parser import text_string_to_metric_families

    positions: set[str] = set()
    try:
        for family in text_string_to_metric_families(metrics_text):
            if family.name.removesuffix("_total") == "vllm:spec_decode_num_accepted_tokens_per_pos":
                positions |= {
                    s.labels.get("position", "")
                    for s in family.samples
                    if not s.name.endswith("_created")
                }
    except ValueError:
        return None
    return len(positions) or None


def check_live(
    doc: PolicyDocument, fetch: Fetch, env: Mapping[str, str] | None = None
) -> list[str]:
    """Every difference between the policy and what its vLLM engines report about themselves.

    vLLM tells its served names (`/v1/models`) and, through its spec-decode counters, how many
    draft positions it runs; an engine that also reports its configuration on `/version` (the
    simulator does) is compared field by field, as a compose file is."""
    env = os.environ if env is None else env
    out: list[str] = []
    for name, backend in doc.backends.items():
        if backend.kind != "vllm":
            continue
        key = env.get(secret_env(backend.api_key)) if backend.api_key else None
        headers = {"authorization": f"Bearer {key}"} if key else {}
        for url in backend.engine_urls:
            where = f"backend {name} at {url}"
            models = fetch(url + "/v1/models", headers)
            if models is None:
                out.append(f"{where}: not reachable (GET /v1/models failed)")
                continue
            try:
                ids = [str(m.get("id")) for m in json.loads(models).get("data", [])]
            except (ValueError, AttributeError):
                ids = []
            if backend.served_model_name not in ids:
                out.append(f"{where}: serves {ids}, not {backend.served_model_name!r}")
            spec = backend.speculative
            metrics = fetch(url + "/metrics", {})
            positions = draft_positions(metrics) if metrics is not None else None
            if spec is None and positions:
                out.append(
                    f"{where}: the engine speculates ({positions} draft positions) but "
                    "the policy describes no speculative configuration"
                )
            elif spec is not None and positions and positions != spec.num_speculative_tokens:
                out.append(
                    f"{where}: the engine drafts {positions} positions, the policy says "
                    f"num_speculative_tokens {spec.num_speculative_tokens}"
                )
            release = backend.engine.vllm_version or doc.deployment.vllm_version
            out += _check_reported_config(where, backend, release, fetch(url + "/version", {}))
    return out


def _check_reported_config(
    where: str, backend: BackendSpec, release: str, version: str | None
) -> list[str]:
    try:
        data = json.loads(version) if version else None
    except ValueError:
        return []
    config = data.get("specrouter_sim") if isinstance(data, dict) else None
    if not isinstance(config, dict):
        return []  # vLLM itself does not report its launch configuration
    out: list[str] = []
    seqs = config.get("max_num_seqs")
    if isinstance(seqs, int) and seqs != backend.max_concurrency:
        out.append(
            f"{where}: max_num_seqs is {seqs} on the engine, max_concurrency "
            f"{backend.max_concurrency} in the policy"
        )
    engine = EngineArgs(where, None)
    if config.get("speculative_config") is not None:
        engine.flags["speculative-config"] = to_json(config["speculative_config"])
    metrics_mode = config.get("per_request_spec_decode_metrics")
    if isinstance(metrics_mode, str):
        engine.flags["per-request-spec-decode-metrics"] = metrics_mode
    if backend.speculative is not None and "per-request-spec-decode-metrics" not in engine.flags:
        engine.flags["per-request-spec-decode-metrics"] = "summary"  # not reported: not judged
    for diff in _check_speculative(where, backend.speculative, engine, release):
        out.append(diff.replace("in the compose file", "on the engine"))
    return out
