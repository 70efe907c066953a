"""`specrouter deploy`: the GB10 stack rendered from the policy, and checked against it.

    specrouter deploy render POLICY [--out DIR]   # DIR/compose.yaml, DIR/prometheus/prometheus.yml
    specrouter deploy check POLICY COMPOSE        # every difference; exit 1 when there is any
    specrouter deploy check POLICY --live         # ... with what the running engines report

One source of truth: the policy's backend descriptions (served model name, max_concurrency, the
port of the URL, the speculative configuration) are what the metrics are labelled with, so they
are also what the engines are launched with. What the policy does not say (where the weights are,
the drafter's checkpoint, the memory split, images) is a compose variable with a default, listed
in the rendered `env.example`.

The pure functions (`engine_plans`, `engine_command`, `render_compose`, `render_prometheus`,
`render_env_example`, `compose_engines`, `check_compose`, `check_live`) take documents and return text or
lists; `main` only reads and writes files.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from policies.schema import BackendSpec, PolicyDocument, PolicyError, SpeculativeSpec, load_policy

REPO_ROOT = Path(__file__).resolve().parents[2]
ASSETS = REPO_ROOT / "deploy"  # grafana provisioning, the gateway's Dockerfile, systemd

# The gateway inside the stack: public TLS listener on the host, admin listener on loopback only
# (Prometheus scrapes it there; every service runs with the host's network).
GATEWAY_LISTEN = "0.0.0.0:8443"
ADMIN_LISTEN = "127.0.0.1:9443"
PROMETHEUS_LISTEN = "127.0.0.1:9090"
GRAFANA_PORT = 3000
PROMETHEUS_SCRAPE_INTERVAL = "5s"

VLLM_IMAGE = "vllm/vllm-openai:v0.28.0"
PROMETHEUS_IMAGE = "prom/prometheus:v2.55.1"
GRAFANA_IMAGE = "grafana/grafana-oss:11.4.0"

# Speculative methods whose drafter is built into the target model or needs no weights.
NO_DRAFTER_METHODS = frozenset({"mtp", "ngram", "ngram_gpu", "suffix"})
# Share of the GB10's unified memory each engine may take (vLLM --gpu-memory-utilization): the
# embedders a small fixed share, the coding engines (weights ~16 GiB + drafter ~3 GiB + KV each)
# split what is left after ~12 % for the OS, the gateway and the monitoring.
GPU_MEMORY_EMBED = "0.04"
GPU_MEMORY_USABLE = 0.88

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
BACKEND_LABEL = "io.specrouter.backend"


class DeployError(ValueError):
    """A policy that cannot be rendered, or a compose file that cannot be read."""


# What runs ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EnginePlan:
    """One engine container, as the policy describes it."""

    service: str
    backend: str
    spec: BackendSpec
    host: str  # what vLLM binds: loopback when the policy reaches it on loopback
    port: int
    memory_share: str = GPU_MEMORY_EMBED

    @property
    def model_var(self) -> str:
        return "MODEL_" + env_suffix(self.spec.served_model_name)

    @property
    def drafter_var(self) -> str:
        return "DRAFTER_" + env_suffix(self.backend)

    @property
    def gpu_memory_var(self) -> str:
        return "GPU_MEMORY_" + env_suffix(self.backend)


@dataclass(frozen=True, slots=True)
class Skipped:
    backend: str
    reason: str


def env_suffix(name: str) -> str:
    """`qwen3.8-27b` -> `QWEN3_8_27B`: a name as the tail of an environment variable."""
    return re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_").upper()


def engine_plans(doc: PolicyDocument) -> tuple[list[EnginePlan], list[Skipped]]:
    """The engines this machine runs (vLLM backends reached on loopback), and the others."""
    plans: list[EnginePlan] = []
    skipped: list[Skipped] = []
    for name, backend in doc.backends.items():
        if backend.kind != "vllm":
            skipped.append(Skipped(name, f"kind {backend.kind}: not an engine this stack runs"))
            continue
        endpoints = backend.endpoints
        for i, url in enumerate(endpoints):
            parts = urlsplit(url)
            host = parts.hostname or ""
            service = name if len(endpoints) == 1 else f"{name}-{i + 1}"
            if host not in LOOPBACK_HOSTS:
                skipped.append(Skipped(service, f"{url} is on another machine"))
                continue
            if parts.scheme != "http":
                skipped.append(Skipped(service, f"{url}: vLLM on loopback serves plain http"))
                continue
            if parts.path:
                skipped.append(Skipped(service, f"{url}: an engine serves at the root, not "
                                                f"under {parts.path}"))
                continue
            port = parts.port or 80
            bind = "::1" if host in {"::1", "[::1]"} else "127.0.0.1"
            plans.append(EnginePlan(service, name, backend, bind, port))
    seen: dict[int, str] = {}
    for plan in plans:
        if plan.port in seen:
            raise DeployError(f"backends {seen[plan.port]!r} and {plan.service!r} both listen on "
                              f"port {plan.port} of this machine")
        seen[plan.port] = plan.service
    return _with_memory_shares(plans), skipped


def _with_memory_shares(plans: list[EnginePlan]) -> list[EnginePlan]:
    embedders = sum(p.spec.task == "embed" for p in plans)
    coders = len(plans) - embedders
    left = GPU_MEMORY_USABLE - embedders * float(GPU_MEMORY_EMBED)
    share = f"{int(left / max(coders, 1) * 100) / 100:.2f}"  # rounded down: never over 100 %
    return [p if p.spec.task == "embed" else replace(p, memory_share=share) for p in plans]


def speculative_config(spec: SpeculativeSpec, drafter: str | None) -> dict[str, Any]:
    """vLLM's `--speculative-config` for a policy's speculative description.

    Fields at the schema's default are left out (the engine's default is the same); `drafter` is
    the drafter checkpoint, for methods that need one."""
    out: dict[str, Any] = {"method": spec.method}
    if spec.method not in NO_DRAFTER_METHODS and drafter is not None:
        out["model"] = drafter
    out["num_speculative_tokens"] = spec.num_speculative_tokens
    if spec.draft_sample_method != "greedy":
        out["draft_sample_method"] = spec.draft_sample_method
    if spec.rejection_sample_method != "standard":
        out["rejection_sample_method"] = spec.rejection_sample_method
    if spec.num_speculative_tokens_per_batch_size is not None:
        out["num_speculative_tokens_per_batch_size"] = spec.num_speculative_tokens_per_batch_size
    return out


def _json(value: Any) -> str:
    return json.dumps(value, separators=(", ", ": "))


def drafter_ref(plan: EnginePlan) -> str:
    return f"${{{plan.drafter_var}:-/models/drafters/{plan.backend}}}"


def engine_command(plan: EnginePlan) -> list[str]:
    """`vllm serve` arguments (after the entrypoint), one flag per item."""
    spec = plan.spec
    args = [
        f"${{{plan.model_var}:-/models/{spec.served_model_name}}}",
        f"--served-model-name={spec.served_model_name}",
        f"--host={plan.host}",
        f"--port={plan.port}",
        f"--max-num-seqs={spec.max_concurrency}",
    ]
    if spec.task == "embed":
        args += ["--runner=pooling",
                 f"--gpu-memory-utilization=${{{plan.gpu_memory_var}:-{GPU_MEMORY_EMBED}}}"]
    else:
        args += [f"--gpu-memory-utilization=${{{plan.gpu_memory_var}:-{plan.memory_share}}}",
                 # cached prompt tokens in each response's usage, for the gateway's request log
                 "--enable-prompt-tokens-details"]
    if spec.priority_scheduling:
        args.append("--scheduling-policy=priority")
    if spec.speculative is not None:
        config = speculative_config(spec.speculative, drafter_ref(plan))
        args.append(f"--speculative-config={_json(config)}")
        # Exact accepted/drafted counts in each response: the gateway's acceptance is then the
        # engine's own figure, not an estimate from chunk sizes.
        args.append("--per-request-spec-decode-metrics=summary")
    return args


# Rendering ------------------------------------------------------------------------------------


def _q(value: str) -> str:
    """A YAML scalar for `value`, quoted only when plain style would change its meaning."""
    try:
        plain = yaml.safe_load(value) if value[:1] not in ("", "{", "[", "*", "&", "!") else None
    except yaml.YAMLError:
        plain = None
    if plain == value and "#" not in value and ": " not in value:
        return value
    if "'" not in value and "\n" not in value:
        return f"'{value}'"
    return json.dumps(value)


def _rel(target: Path, start: Path) -> str:
    rel = os.path.relpath(target.resolve(), start.resolve())
    return rel if rel.startswith(".") else f"./{rel}"


def _fallback_of(doc: PolicyDocument, backend: str) -> tuple[str, SpeculativeSpec] | None:
    """The speculative fallback of the route `backend` serves, when it is another backend."""
    for route in doc.routes.values():
        if backend in route.variants and route.fallback and route.fallback != backend:
            spec = doc.backends[route.fallback].speculative
            if spec is not None:
                return route.fallback, spec
    return None


def _engine_service(doc: PolicyDocument, plan: EnginePlan) -> list[str]:
    spec = plan.spec
    what = (f"{spec.task} engine for backend {plan.backend!r}, served as "
            f"{spec.served_model_name!r}, {spec.max_concurrency} sequences")
    lines = [f"  {plan.service}:", f"    # {what}", "    image: ${VLLM_IMAGE:-" + VLLM_IMAGE + "}",
             "    entrypoint: [vllm, serve]", "    command:"]
    for arg in engine_command(plan):
        if arg.startswith("--speculative-config="):
            s = spec.speculative
            assert s is not None
            prob = s.draft_sample_method == "probabilistic"
            block = s.rejection_sample_method == "block"
            if prob and block:
                lines += ["      # draft_sample_method: probabilistic and rejection_sample_method: "
                          "block go together:",
                          "      # each alone regresses (greedy + block loses at every load; "
                          "probabilistic alone loses",
                          "      # ~10 % at one stream). Change both or neither."]
            elif prob or block:
                lines.append("      # WARNING: probabilistic draft and block verification each "
                             "regress alone; deploy them together.")
            lines.append(f"      - {_q(arg)}")
            fallback = _fallback_of(doc, plan.backend)
            if fallback is not None:
                name, fb = fallback
                fb_arg = f"--speculative-config={_json(speculative_config(fb, None))}"
                lines += [f"      # The {fb.method} fallback, one line away (it is also backend "
                          f"{name!r}; change the policy",
                          "      # with it, or `specrouter deploy check` reports the difference):",
                          f"      # - {_q(fb_arg)}"]
            continue
        lines.append(f"      - {_q(arg)}")
    if spec.api_key_env:
        lines += ["    environment:",
                  f"      VLLM_API_KEY: ${{{spec.api_key_env}:?set {spec.api_key_env} in .env}}"]
    lines += [
        "    labels:",
        f"      {BACKEND_LABEL}: {plan.backend}",
        "    network_mode: host",
        "    ipc: host",
        "    ulimits: {memlock: -1, stack: 67108864}",
        "    volumes:",
        "      - ${MODELS_DIR:-/models}:/models:ro",
        "      - ${HF_CACHE:-/var/cache/huggingface}:/root/.cache/huggingface",
        "    deploy:",
        "      resources:",
        "        reservations:",
        "          devices: [{driver: nvidia, count: all, capabilities: [gpu]}]",
        "    healthcheck:",
        "      test: " + _healthcheck("python3", f"http://{_hostport(plan)}/health"),
        "      interval: 30s",
        "      timeout: 5s",
        "      start_period: 15m   # a cold start of the coding engine takes 6-7 minutes"
        if spec.task == "generate" else "      start_period: 5m",
        "    restart: unless-stopped",
        "",
    ]
    return lines


def _healthcheck(python: str, url: str) -> str:
    code = f"import urllib.request; urllib.request.urlopen({url!r}, timeout=4)"
    return json.dumps(["CMD", python, "-c", code])


def _hostport(plan: EnginePlan) -> str:
    return f"[{plan.host}]:{plan.port}" if ":" in plan.host else f"{plan.host}:{plan.port}"


def render_compose(doc: PolicyDocument, *, policy: Path, out_dir: Path) -> str:
    """The whole stack for one machine: engines from the policy, gateway, Prometheus, Grafana.

    Paths are relative to `out_dir` (where the file is written): the policy file, the repository
    (the gateway's image is built from it) and the Grafana provisioning under deploy/."""
    plans, skipped = engine_plans(doc)
    policy_dir = _rel(policy.parent, out_dir)
    policy_name = policy.name
    api_keys = sorted({p.spec.api_key_env for p in plans if p.spec.api_key_env}
                      | {b.api_key_env for b in doc.backends.values() if b.api_key_env})
    grafana = _rel(ASSETS / "grafana", out_dir)
    lines = [
        "# The GB10 stack: vLLM engines, the specrouter gateway, Prometheus and Grafana.",
        "#",
        f"# Rendered from {_rel(policy, out_dir)} by `specrouter deploy render`: each engine's "
        "launch arguments",
        "# (served name, --max-num-seqs, port, --speculative-config) are the policy's backend "
        "description,",
        "# so the configuration the metrics are labelled with is the one that runs. Change the "
        "policy and",
        "# render again; `specrouter deploy check POLICY compose.yaml` lists every difference "
        "after a hand edit.",
        "# Variables (${...}) come from .env next to this file: see env.example.",
        "#",
        "# Every service uses the host's network: the policy's loopback URLs are the engines' "
        "addresses.",
    ]
    for s in skipped:
        lines.append(f"# Not run here: {s.backend} ({s.reason}).")
    lines += ["", "name: specrouter", "", "services:"]
    for plan in plans:
        lines += _engine_service(doc, plan)
    gateway_cmd = [
        "serve", f"--config=/etc/specrouter/policy/{policy_name}",
        f"--listen={GATEWAY_LISTEN}", f"--admin-listen={ADMIN_LISTEN}",
        "--tls-cert=/etc/specrouter/tls/fullchain.pem",
        "--tls-key=/etc/specrouter/tls/privkey.pem",
        "--state-dir=/var/lib/specrouter",
    ]
    lines += [
        "  gateway:",
        "    # TLS in front of the engines; the policy file is read (and, through the admin API, "
        "written) here.",
        "    # Reload certificate and policy: docker compose kill -s HUP gateway",
        "    build:",
        f"      context: {_rel(REPO_ROOT, out_dir)}",
        "      dockerfile: deploy/Dockerfile",
        "    image: specrouter:local",
        "    command:",
        *[f"      - {_q(a)}" for a in gateway_cmd],
        "    environment:",
        "      SPECROUTER_ADMIN_TOKEN: ${SPECROUTER_ADMIN_TOKEN:?set SPECROUTER_ADMIN_TOKEN in .env}",
        "      SPECROUTER_DASHBOARD_TOKEN: ${SPECROUTER_DASHBOARD_TOKEN:-}",
        *[f"      {k}: ${{{k}:?set {k} in .env}}" for k in api_keys],
        "    network_mode: host",
        "    volumes:",
        f"      - {policy_dir}:/etc/specrouter/policy",
        "      - ${SPECROUTER_TLS_DIR:-/etc/specrouter/tls}:/etc/specrouter/tls:ro",
        "      - specrouter-state:/var/lib/specrouter",
        "    read_only: true",
        "    tmpfs: [/tmp]",
        "    cap_drop: [ALL]",
        "    security_opt: [no-new-privileges:true]",
        "    healthcheck:",
        "      test: " + _healthcheck("python", f"http://{ADMIN_LISTEN}/metrics"),
        "      interval: 15s",
        "      timeout: 5s",
        "    stop_grace_period: 40s   # streams in flight get 30 s to finish",
        "    restart: unless-stopped",
        "",
        "  prometheus:",
        "    image: ${PROMETHEUS_IMAGE:-" + PROMETHEUS_IMAGE + "}",
        "    command:",
        "      - --config.file=/etc/prometheus/prometheus.yml",
        "      - --storage.tsdb.path=/prometheus",
        "      - --storage.tsdb.retention.time=${PROMETHEUS_RETENTION:-30d}",
        f"      - --web.listen-address={PROMETHEUS_LISTEN}",
        "      - --web.enable-lifecycle",
        "    network_mode: host",
        "    volumes:",
        "      - ./prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro",
        "      - prometheus-data:/prometheus",
        "    restart: unless-stopped",
        "",
        "  grafana:",
        "    image: ${GRAFANA_IMAGE:-" + GRAFANA_IMAGE + "}",
        "    environment:",
        "      GF_SERVER_HTTP_ADDR: 127.0.0.1   # reach it through an SSH tunnel",
        f"      GF_SERVER_HTTP_PORT: '{GRAFANA_PORT}'",
        "      GF_SECURITY_ADMIN_PASSWORD: ${GRAFANA_ADMIN_PASSWORD:?set GRAFANA_ADMIN_PASSWORD "
        "in .env}",
        "      GF_ANALYTICS_REPORTING_ENABLED: 'false'",
        "      GF_ANALYTICS_CHECK_FOR_UPDATES: 'false'",
        "      GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH: "
        "/var/lib/grafana/dashboards/specrouter.json",
        "    network_mode: host",
        "    volumes:",
        f"      - {grafana}/provisioning:/etc/grafana/provisioning:ro",
        f"      - {grafana}/dashboards:/var/lib/grafana/dashboards:ro",
        "      - grafana-data:/var/lib/grafana",
        "    depends_on: [prometheus]",
        "    restart: unless-stopped",
        "",
        "volumes:",
        "  specrouter-state: {}   # policy versions, audit log, request log",
        "  prometheus-data: {}",
        "  grafana-data: {}",
    ]
    return "\n".join(lines) + "\n"


def render_prometheus(doc: PolicyDocument) -> str:
    """Prometheus scrapes the gateway's admin /metrics (which re-exports every backend's engine
    state with a `backend` label: one target suffices) and, for vLLM's own histograms, the
    engines directly."""
    plans, _ = engine_plans(doc)
    lines = [
        "# Rendered by `specrouter deploy render` (the engine targets are the policy's backends).",
        "global:",
        f"  scrape_interval: {PROMETHEUS_SCRAPE_INTERVAL}",
        "  evaluation_interval: 15s",
        "",
        "scrape_configs:",
        "  # Everything the dashboard reads: the gateway's metrics and, re-exported with a backend",
        "  # label, each engine's running/waiting, KV use, spec-decode and prefix-cache counters.",
        "  - job_name: specrouter",
        "    metrics_path: /metrics",
        "    static_configs:",
        f"      - targets: ['{ADMIN_LISTEN}']",
    ]
    if plans:
        lines += [
            "",
            "  # Optional: vLLM's own metrics (its latency histograms, per-engine detail).",
            "  - job_name: vllm",
            "    metrics_path: /metrics",
            "    static_configs:",
        ]
        for plan in plans:
            lines += [f"      - targets: ['{_hostport(plan)}']",
                      f"        labels: {{backend: {plan.service}}}"]
    return "\n".join(lines) + "\n"


def render_env_example(doc: PolicyDocument) -> str:
    """The variables the rendered compose file reads, with their defaults."""
    plans, _ = engine_plans(doc)
    lines = ["# Copy to .env next to compose.yaml (chmod 600) and fill in the secrets.",
             "# Every other line shows the default the compose file uses when it is unset.",
             "", "# Secrets (required; the dashboard token is optional)",
             "SPECROUTER_ADMIN_TOKEN=", "SPECROUTER_DASHBOARD_TOKEN=", "GRAFANA_ADMIN_PASSWORD="]
    keys = sorted({b.api_key_env for b in doc.backends.values() if b.api_key_env})
    for k in keys:
        lines += ["# An engine's API key (vLLM's --api-key), which the gateway sends to it", f"{k}="]
    lines += ["", "# Where things are on the host; the TLS directory holds fullchain.pem and "
              "privkey.pem", "SPECROUTER_TLS_DIR=/etc/specrouter/tls",
              "MODELS_DIR=/models", "HF_CACHE=/var/cache/huggingface", "",
              "# Weights, as paths inside the containers (/models is MODELS_DIR) or hub names"]
    done: set[str] = set()
    for plan in plans:
        if plan.model_var not in done:
            done.add(plan.model_var)
            lines.append(f"{plan.model_var}=/models/{plan.spec.served_model_name}")
    for plan in plans:
        s = plan.spec.speculative
        if s is not None and s.method not in NO_DRAFTER_METHODS:
            lines += [f"# The {s.method} drafter of backend {plan.backend}",
                      f"{plan.drafter_var}=/models/drafters/{plan.backend}"]
    lines += ["", "# Memory: share of the unified memory each engine takes"]
    for plan in plans:
        lines.append(f"{plan.gpu_memory_var}={plan.memory_share}")
    lines += ["", "# Images", f"VLLM_IMAGE={VLLM_IMAGE}", f"PROMETHEUS_IMAGE={PROMETHEUS_IMAGE}",
              f"GRAFANA_IMAGE={GRAFANA_IMAGE}", "PROMETHEUS_RETENTION=30d"]
    return "\n".join(lines) + "\n"


def render(doc: PolicyDocument, *, policy: Path, out_dir: Path) -> dict[str, str]:
    """Every rendered file, by path relative to `out_dir`."""
    return {
        "compose.yaml": render_compose(doc, policy=policy, out_dir=out_dir),
        "prometheus/prometheus.yml": render_prometheus(doc),
        "env.example": render_env_example(doc),
    }


# Reading a compose file back ------------------------------------------------------------------


@dataclass(slots=True)
class EngineArgs:
    """A compose service's `vllm serve` command line, parsed."""

    service: str
    backend: str | None  # from the io.specrouter.backend label
    model: str | None = None
    flags: dict[str, str | None] = field(default_factory=dict)
    environment: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return shlex.split(value)
    if isinstance(value, list):
        return [str(v) for v in value]
    raise DeployError(f"expected a string or a list, got {type(value).__name__}")


def _mapping(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, dict):
        return {str(k): "" if v is None else str(v) for k, v in value.items()}
    if isinstance(value, list):
        out: dict[str, str] = {}
        for item in value:
            key, _, val = str(item).partition("=")
            out[key] = val
        return out
    raise DeployError(f"expected a mapping or a list, got {type(value).__name__}")


def parse_vllm_args(argv: Sequence[str]) -> tuple[str | None, dict[str, str | None]] | None:
    """(model, flags) of a `vllm serve ...` (or the api_server module) command, else None."""
    args = list(argv)
    if args[:2] == ["vllm", "serve"]:
        args = args[2:]
    elif len(args) >= 3 and args[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]:
        args = args[3:]
    else:
        return None
    model: str | None = None
    flags: dict[str, str | None] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            name = name.replace("_", "-")
            if eq:
                flags[name] = value
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                flags[name] = args[i + 1]
                i += 1
            else:
                flags[name] = None
        elif model is None:
            model = arg
        i += 1
    if model is None and flags.get("model"):
        model = flags.pop("model")
    return model, flags


def compose_engines(compose: Mapping[str, Any]) -> dict[str, EngineArgs]:
    """The vLLM services of a compose document, by service name."""
    services = compose.get("services")
    if not isinstance(services, dict):
        raise DeployError("the compose file has no services mapping")
    out: dict[str, EngineArgs] = {}
    for name, service in services.items():
        if not isinstance(service, dict):
            continue
        argv = _as_list(service.get("entrypoint")) + _as_list(service.get("command"))
        parsed = parse_vllm_args(argv)
        if parsed is None:
            continue
        labels = _mapping(service.get("labels"))
        engine = EngineArgs(str(name), labels.get(BACKEND_LABEL), parsed[0], parsed[1],
                            _mapping(service.get("environment")))
        out[str(name)] = engine
    return out


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


_SPEC_DEFAULTS: dict[str, Any] = {"draft_sample_method": "greedy",
                                  "rejection_sample_method": "standard",
                                  "num_speculative_tokens_per_batch_size": None}


def _check_speculative(where: str, policy: SpeculativeSpec | None,
                       engine: EngineArgs) -> list[str]:
    running, error = _spec_of(engine)
    if error is not None:
        return [f"{where}: {error}"]
    if policy is None:
        if running is not None:
            return [f"{where}: the engine speculates ({_json(running)}) but the policy "
                    "describes no speculative configuration"]
        return []
    if running is None:
        return [f"{where}: the policy says speculative {policy.method} with "
                f"{policy.num_speculative_tokens} tokens, the engine has no --speculative-config"]
    out: list[str] = []
    want = speculative_config(policy, None)
    for key in ("method", "num_speculative_tokens", *_SPEC_DEFAULTS):
        have_value = running.get(key, _SPEC_DEFAULTS.get(key))
        want_value = want.get(key, _SPEC_DEFAULTS.get(key))
        if have_value != want_value:
            out.append(f"{where}: speculative {key} is {_json(have_value)} in the compose file, "
                       f"{_json(want_value)} in the policy")
    known = {"model", *want, *_SPEC_DEFAULTS}
    for key in sorted(set(running) - known):
        out.append(f"{where}: speculative {key} = {_json(running[key])} is not in the policy "
                   "(the policy cannot label metrics with it)")
    if policy.method not in NO_DRAFTER_METHODS and not running.get("model"):
        out.append(f"{where}: speculative method {policy.method} needs a drafter model "
                   "(\"model\" in --speculative-config)")
    if engine.flags.get("per-request-spec-decode-metrics") != "summary":
        out.append(f"{where}: --per-request-spec-decode-metrics is "
                   f"{engine.flags.get('per-request-spec-decode-metrics')!r}, not 'summary' "
                   "(the gateway would estimate acceptance instead of reading it)")
    return out


def _check_engine(plan: EnginePlan, engine: EngineArgs) -> list[str]:
    where = f"service {engine.service} (backend {plan.backend})"
    spec = plan.spec
    out: list[str] = []

    def flag(name: str, want: str | None, what: str) -> None:
        have = engine.flags.get(name)
        if have != want:
            out.append(f"{where}: --{name} is {have!r} in the compose file, {want!r} in the "
                       f"policy ({what})")

    flag("served-model-name", spec.served_model_name, "served_model_name")
    flag("max-num-seqs", str(spec.max_concurrency), "max_concurrency")
    flag("port", str(plan.port), f"the port of {spec.endpoints[0]}")
    has_key = "api-key" in engine.flags or "VLLM_API_KEY" in engine.environment
    if spec.api_key_env and not has_key:
        out.append(f"{where}: the policy sends a key from {spec.api_key_env} but the engine has "
                   "no --api-key (nor VLLM_API_KEY)")
    elif not spec.api_key_env and has_key:
        out.append(f"{where}: the engine requires an API key but the policy sets no api_key_env")
    priority = engine.flags.get("scheduling-policy") == "priority"
    if priority != spec.priority_scheduling:
        out.append(f"{where}: scheduling policy is {'priority' if priority else 'fcfs'} in the "
                   f"compose file, priority_scheduling is {spec.priority_scheduling} in the policy")
    pooling = engine.flags.get("runner") == "pooling" or engine.flags.get("task") == "embed"
    if (spec.task == "embed") != pooling:
        out.append(f"{where}: the engine runs as {'pooling' if pooling else 'generate'}, the "
                   f"policy's task is {spec.task}")
    out += _check_speculative(where, spec.speculative, engine)
    return out


def check_compose(doc: PolicyDocument, compose: Mapping[str, Any], *,
                  compose_dir: Path | None = None, policy: Path | None = None) -> list[str]:
    """Every difference between a compose document and the policy; empty when they agree.

    Engine services are matched to backends by their `io.specrouter.backend` label, else by
    service name. With `compose_dir` and `policy`, the gateway service must serve that file."""
    plans, _ = engine_plans(doc)
    engines = compose_engines(compose)
    by_service = {p.service: p for p in plans}
    matched: set[str] = set()
    out: list[str] = []
    for engine in engines.values():
        plan = by_service.get(engine.service)
        if engine.backend is not None:
            candidates = [p for p in plans if p.backend == engine.backend]
            if not candidates:
                out.append(f"service {engine.service}: labelled backend {engine.backend!r}, "
                           "which the policy does not run on this machine")
                continue
            port = engine.flags.get("port")
            plan = next((p for p in candidates if p.service == engine.service),
                        next((p for p in candidates if str(p.port) == port),
                             candidates[0] if len(candidates) == 1 else None))
        if plan is None:
            out.append(f"service {engine.service}: a vLLM engine that no backend of the policy "
                       "describes")
            continue
        if plan.service in matched:
            out.append(f"service {engine.service}: a second engine for backend {plan.backend}")
            continue
        matched.add(plan.service)
        out += _check_engine(plan, engine)
    for plan in plans:
        if plan.service not in matched:
            out.append(f"backend {plan.backend}: no engine service {plan.service} in the compose "
                       f"file (the policy reaches it at {plan.spec.endpoints[0]})")
    if compose_dir is not None and policy is not None:
        out += _check_gateway_policy(compose, compose_dir, policy)
    return out


def _check_gateway_policy(compose: Mapping[str, Any], compose_dir: Path,
                          policy: Path) -> list[str]:
    services = compose.get("services") or {}
    for name, service in services.items():
        if not isinstance(service, dict):
            continue
        argv = _as_list(service.get("command"))
        if "serve" not in argv[:3] or not any(a.startswith("--config") for a in argv):
            continue
        config = _flag_value(argv, "--config")
        if config is None:
            continue
        for volume in _as_list(service.get("volumes")):
            source, _, rest = volume.partition(":")
            target = rest.split(":")[0]
            if "$" in source or not config.startswith(target.rstrip("/") + "/"):
                continue
            host = (compose_dir / source / config[len(target.rstrip("/")) + 1:]).resolve()
            if host != policy.resolve():
                return [f"service {name}: the gateway serves {host}, not the checked policy "
                        f"{policy.resolve()}"]
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
                positions |= {s.labels.get("position", "") for s in family.samples
                              if not s.name.endswith("_created")}
    except ValueError:
        return None
    return len(positions) or None


def check_live(doc: PolicyDocument, fetch: Fetch,
               env: Mapping[str, str] | None = None) -> list[str]:
    """Every difference between the policy and what its vLLM engines report about themselves.

    vLLM tells its served names (`/v1/models`) and, through its spec-decode counters, how many
    draft positions it runs; an engine that also reports its configuration on `/version` (the
    simulator does) is compared field by field, as a compose file is."""
    env = os.environ if env is None else env
    out: list[str] = []
    for name, backend in doc.backends.items():
        if backend.kind != "vllm":
            continue
        key = env.get(backend.api_key_env) if backend.api_key_env else None
        headers = {"authorization": f"Bearer {key}"} if key else {}
        for url in backend.endpoints:
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
                out.append(f"{where}: the engine speculates ({positions} draft positions) but "
                           "the policy describes no speculative configuration")
            elif spec is not None and positions and positions != spec.num_speculative_tokens:
                out.append(f"{where}: the engine drafts {positions} positions, the policy says "
                           f"num_speculative_tokens {spec.num_speculative_tokens}")
            out += _check_reported_config(where, backend, fetch(url + "/version", {}))
    return out


def _check_reported_config(where: str, backend: BackendSpec, version: str | None) -> list[str]:
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
        out.append(f"{where}: max_num_seqs is {seqs} on the engine, max_concurrency "
                   f"{backend.max_concurrency} in the policy")
    engine = EngineArgs(where, None)
    if config.get("speculative_config") is not None:
        engine.flags["speculative-config"] = _json(config["speculative_config"])
    metrics_mode = config.get("per_request_spec_decode_metrics")
    if isinstance(metrics_mode, str):
        engine.flags["per-request-spec-decode-metrics"] = metrics_mode
    if backend.speculative is not None and "per-request-spec-decode-metrics" not in engine.flags:
        engine.flags["per-request-spec-decode-metrics"] = "summary"  # not reported: not judged
    for diff in _check_speculative(where, backend.speculative, engine):
        out.append(diff.replace("in the compose file", "on the engine"))
    return out


# Command line -----------------------------------------------------------------------------------


def _load(policy: str) -> PolicyDocument:
    try:
        return load_policy(policy)
    except PolicyError as exc:
        raise DeployError(f"{policy}: {exc}") from None


def write_rendered(files: Mapping[str, str], out_dir: Path) -> list[Path]:
    written = []
    for rel, text in files.items():
        path = out_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
        written.append(path)
    return written


def _print_lines(lines: Iterable[str], file: Any = None) -> None:
    for line in lines:
        print(line, file=file or sys.stdout)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="specrouter deploy", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("render", help="render the stack's files from the policy")
    r.add_argument("policy", type=Path)
    r.add_argument("--out", type=Path, help="write compose.yaml, prometheus/prometheus.yml and "
                                            "env.example here (default: compose.yaml to stdout)")
    c = sub.add_parser("check", help="list every difference between a compose file (and/or "
                                     "the running engines) and the policy; exit 1 when any")
    c.add_argument("policy", type=Path)
    c.add_argument("compose", type=Path, nargs="?")
    c.add_argument("--live", action="store_true",
                   help="also ask each vLLM backend of the policy what it serves and drafts")
    args = p.parse_args(argv)
    if args.command == "check" and args.compose is None and not args.live:
        p.error("check needs a COMPOSE file, --live, or both")
    try:
        doc = _load(str(args.policy))
        if args.command == "render":
            if args.out is None:
                sys.stdout.write(render_compose(doc, policy=args.policy, out_dir=Path.cwd()))
                return 0
            files = render(doc, policy=args.policy, out_dir=args.out)
            _print_lines(f"wrote {path}" for path in write_rendered(files, args.out))
            return 0
        diffs: list[str] = []
        if args.compose is not None:
            try:
                compose = yaml.safe_load(args.compose.read_text())
            except (OSError, yaml.YAMLError) as exc:
                raise DeployError(f"{args.compose}: {exc}") from None
            if not isinstance(compose, dict):
                raise DeployError(f"{args.compose}: not a compose document")
            diffs += check_compose(doc, compose, compose_dir=args.compose.parent,
                                   policy=args.policy)
        if args.live:
            diffs += check_live(doc, http_fetch())
    except DeployError as exc:
        print(f"specrouter deploy: {exc}", file=sys.stderr)
        return 2
    what = " and ".join(([str(args.compose)] if args.compose else [])
                        + (["the running engines"] if args.live else []))
    if diffs:
        _print_lines(diffs)
        print(f"{len(diffs)} difference(s) between {what} and {args.policy}", file=sys.stderr)
        return 1
    print(f"{what}: as {args.policy} describes")
    return 0
