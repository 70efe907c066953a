"""The stack's files from the policy: compose.yaml (engines, gateway, Prometheus, Grafana),
prometheus/prometheus.yml, operator.yaml (the secrets the policy names) and env.example."""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from policies.spec.backends import SpeculativeSpec
from policies.spec.document import PolicyDocument
from proxy.ops.deploy import llamacpp, sglang, versions
from proxy.ops.deploy.plan import (
    BACKEND_LABEL,
    NO_DRAFTER_METHODS,
    EnginePlan,
    engine_command,
    engine_plans,
    secret_env,
    speculative_config,
    to_json,
)

REPO_ROOT = Path(__file__).resolve().parents[3]
ASSETS = REPO_ROOT / "deploy"  # grafana provisioning, the gateway's Dockerfile, systemd

# The gateway inside the stack: public TLS listener on the host, admin listener and /metrics on
# loopback only (Prometheus scrapes the metrics listener; every service uses the host's network).
GATEWAY_LISTEN = "0.0.0.0:8443"
ADMIN_LISTEN = "127.0.0.1:9443"
METRICS_LISTEN = "127.0.0.1:9464"
OPERATOR_FILE = "/etc/specrouter/operator.yaml"
PROMETHEUS_LISTEN = "127.0.0.1:9090"
GRAFANA_PORT = 3000
PROMETHEUS_SCRAPE_INTERVAL = "5s"

VLLM_IMAGE = "vllm/vllm-openai:v{version}"  # the engine's release, from the policy
PROMETHEUS_IMAGE = "prom/prometheus:v2.55.1"
GRAFANA_IMAGE = "grafana/grafana-oss:11.4.0"


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
    what = (
        f"{spec.task} engine for backend {plan.backend!r}, served as "
        f"{spec.served_model_name!r}, {spec.max_concurrency} sequences"
    )
    image = VLLM_IMAGE.format(version=plan.version)
    lines = [
        f"  {plan.service}:",
        f"    # {what}",
        "    image: ${VLLM_IMAGE:-" + image + "}",
        "    entrypoint: [vllm, serve]",
        "    command:",
    ]
    for arg in engine_command(plan):
        if arg.startswith("--speculative-config="):
            s = spec.speculative
            assert s is not None
            prob = s.draft_sample_method == "probabilistic"
            block = s.rejection_sample_method == "block"
            if prob and block:
                lines += [
                    "      # draft_sample_method: probabilistic and rejection_sample_method: "
                    "block go together:",
                    "      # each alone regresses (greedy + block loses at every load; "
                    "probabilistic alone loses",
                    "      # ~10 % at one stream). Change both or neither.",
                ]
            elif prob or block:
                lines.append(
                    "      # WARNING: probabilistic draft and block verification each "
                    "regress alone; deploy them together."
                )
            lines.append(f"      - {_q(arg)}")
            fallback = _fallback_of(doc, plan.backend)
            if fallback is not None:
                name, fb = fallback
                fb_arg = f"--speculative-config={to_json(speculative_config(fb, None))}"
                lines += [
                    f"      # The {fb.method} fallback, one line away (it is also backend "
                    f"{name!r}; change the policy",
                    "      # with it, or `specrouter deploy check` reports the difference):",
                    f"      # - {_q(fb_arg)}",
                ]
            continue
        lines.append(f"      - {_q(arg)}")
    if spec.api_key:
        var = secret_env(spec.api_key)
        lines += ["    environment:", f"      VLLM_API_KEY: ${{{var}:?set {var} in .env}}"]
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
        if spec.task == "generate"
        else "      start_period: 5m",
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
    api_keys = _secret_vars(doc)
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
        b = doc.backends.get(s.backend)
        if b is None or not (llamacpp.rendered(b) or sglang.rendered(b)):
            lines.append(f"# Not run here: {s.backend} ({s.reason}).")
    lines += ["", "name: specrouter", "", "services:"]
    for plan in plans:
        lines += _engine_service(doc, plan)
    for llama in llamacpp.llama_plans(doc):
        lines += llamacpp.service_lines(llama)
    for sgl in sglang.sglang_plans(doc):
        lines += sglang.service_lines(sgl)
    gateway_cmd = [
        "serve",
        f"--config=/etc/specrouter/policy/{policy_name}",
        f"--listen={GATEWAY_LISTEN}",
        f"--admin-listen={ADMIN_LISTEN}",
        f"--metrics-listen={METRICS_LISTEN}",
        f"--operator-file={OPERATOR_FILE}",
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
        "    # Room above max_connections (4,096 per listener) and the engine connections.",
        "    ulimits: {nofile: 65536}",
        "    command:",
        *[f"      - {_q(a)}" for a in gateway_cmd],
        "    environment:",
        "      SPECROUTER_ADMIN_TOKEN: ${SPECROUTER_ADMIN_TOKEN:?set SPECROUTER_ADMIN_TOKEN in .env}",
        "      SPECROUTER_DASHBOARD_TOKEN: ${SPECROUTER_DASHBOARD_TOKEN:-}",
        *[f"      {k}: ${{{k}:?set {k} in .env}}" for k in api_keys],
        "    network_mode: host",
        "    volumes:",
        f"      - {policy_dir}:/etc/specrouter/policy",
        f"      - ./operator.yaml:{OPERATOR_FILE}:ro   # chmod go-w: the gateway refuses it "
        "otherwise",
        "      - ${SPECROUTER_TLS_DIR:-/etc/specrouter/tls}:/etc/specrouter/tls:ro",
        "      - specrouter-state:/var/lib/specrouter",
        "    read_only: true",
        "    tmpfs: [/tmp]",
        "    cap_drop: [ALL]",
        "    security_opt: [no-new-privileges:true]",
        "    healthcheck:",
        "      test: " + _healthcheck("python", f"http://{METRICS_LISTEN}/metrics"),
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
    """Prometheus scrapes the gateway's metrics listener (which re-exports every backend's engine
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
        f"      - targets: ['{METRICS_LISTEN}']",
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
            lines += [
                f"      - targets: ['{_hostport(plan)}']",
                f"        labels: {{backend: {plan.service}}}",
            ]
    return "\n".join(lines) + "\n"


def render_env_example(doc: PolicyDocument) -> str:
    """The variables the rendered compose file reads, with their defaults."""
    plans, _ = engine_plans(doc)
    lines = [
        "# Copy to .env next to compose.yaml (chmod 600) and fill in the secrets.",
        "# Every other line shows the default the compose file uses when it is unset.",
        "",
        "# Secrets (required; the dashboard token is optional)",
        "# The admin token: 32 characters at least, e.g. `openssl rand -hex 32` (the "
        "gateway refuses",
        "# a shorter one)",
        "SPECROUTER_ADMIN_TOKEN=",
        "SPECROUTER_DASHBOARD_TOKEN=",
        "GRAFANA_ADMIN_PASSWORD=",
    ]
    for k in _secret_vars(doc):
        lines += [
            "# An engine's API key (vLLM's --api-key), which the gateway sends to it",
            f"{k}=",
        ]
    lines += [
        "",
        "# Where things are on the host; the TLS directory holds fullchain.pem and privkey.pem",
        "SPECROUTER_TLS_DIR=/etc/specrouter/tls",
        "MODELS_DIR=/models",
        "HF_CACHE=/var/cache/huggingface",
        "",
        "# Weights, as paths inside the containers (/models is MODELS_DIR) or hub names",
    ]
    done: set[str] = set()
    for plan in plans:
        if plan.model_var not in done:
            done.add(plan.model_var)
            lines.append(f"{plan.model_var}=/models/{plan.spec.served_model_name}")
    for plan in plans:
        s = plan.spec.speculative
        if s is not None and s.method not in NO_DRAFTER_METHODS:
            lines += [
                f"# The {s.method} drafter of backend {plan.backend}",
                f"{plan.drafter_var}=/models/drafters/{plan.backend}",
            ]
    lines += [
        "",
        "# Memory: share of the unified memory each engine takes and, for the coding",
        "# engines, their KV budget in bytes (`specrouter deploy check` refuses a split",
        "# whose KV cannot hold the engine's --max-model-len)",
    ]
    for plan in plans:
        lines.append(f"{plan.gpu_memory_var}={plan.memory_share}")
        if plan.memory is not None and versions.has_flag(plan.version, versions.KV_BYTES_FLAG):
            lines.append(f"{plan.kv_bytes_var}={plan.memory.kv_bytes}")
    lines += llamacpp.env_lines(doc)
    lines += sglang.env_lines(doc)
    images = sorted({VLLM_IMAGE.format(version=p.version) for p in plans}) or [
        VLLM_IMAGE.format(version=doc.deployment.vllm_version)
    ]
    # One image for all engines when they run one release; with several, each keeps its own
    # default and VLLM_IMAGE (which would replace them all) is left commented.
    lines += [
        "",
        "# Images",
        ("" if len(images) == 1 else "#") + f"VLLM_IMAGE={images[0]}",
        f"PROMETHEUS_IMAGE={PROMETHEUS_IMAGE}",
        f"GRAFANA_IMAGE={GRAFANA_IMAGE}",
        "PROMETHEUS_RETENTION=30d",
    ]
    return "\n".join(lines) + "\n"


def _secret_vars(doc: PolicyDocument) -> list[str]:
    return sorted({secret_env(b.api_key) for b in doc.backends.values() if b.api_key})


def _repair_actions(doc: PolicyDocument) -> dict[str, list[str]]:
    """Each repair action the policy names: a restart of the containers compose gives the
    backends that name it (project `specrouter`, so `specrouter-SERVICE-1`)."""
    plans, _ = engine_plans(doc)
    actions: dict[str, list[str]] = {}
    for plan in plans:
        repair = plan.spec.repair
        if repair is not None:
            actions.setdefault(repair.action, []).append(f"specrouter-{plan.service}-1")
    return {name: ["docker", "restart", *containers] for name, containers in actions.items()}


def render_operator(doc: PolicyDocument) -> str:
    """The operator file: each secret the policy names, read from the stack's environment; each
    repair action it names, a docker restart of its engines; the engines on loopback."""
    names = sorted({b.api_key for b in doc.backends.values() if b.api_key})
    lines = [
        "# Rendered by `specrouter deploy render`. What the admin-editable policy may name but",
        "# not define: engine secrets, repair actions, engine hosts. Keep it chmod go-w.",
        "secrets:" + ("" if names else " {}"),
    ]
    lines += [f"  {n}: {{env: {secret_env(n)}}}" for n in names]
    actions = _repair_actions(doc)
    if actions:
        lines += [
            "# Run by the gateway (proxy/backends/repair.py), so it needs the docker CLI and the",
            "# daemon's socket: on the host (deploy/systemd), or mounted into its container.",
            "actions:",
        ]
        lines += [
            f"  {n}: {{command: {json.dumps(c)}, timeout_s: 120}}"
            for n, c in sorted(actions.items())
        ]
    else:
        lines.append("actions: {}   # e.g. restart-coder: {command: [docker, restart, NAME]}")
    lines.append("engine_hosts: ['127.0.0.1', '::1', localhost]")
    return "\n".join(lines) + "\n"


def render(doc: PolicyDocument, *, policy: Path, out_dir: Path) -> dict[str, str]:
    """Every rendered file, by path relative to `out_dir`."""
    return {
        "compose.yaml": render_compose(doc, policy=policy, out_dir=out_dir),
        "operator.yaml": render_operator(doc),
        "prometheus/prometheus.yml": render_prometheus(doc),
        "env.example": render_env_example(doc),
    }
