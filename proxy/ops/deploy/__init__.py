"""`specrouter deploy`: the GB10 stack rendered from the policy, and checked against it.

    plan     the engines this machine runs, their memory shares and `vllm serve` arguments
    memory   the GB10 memory model: weights, KV tokens per GiB, the split between engines
    versions the vLLM releases known, their `vllm serve` flags (vllm_flags/*.txt)
    flagtable how a release's flag table is made from its wheel (`python -m ...flagtable`)
    render   compose.yaml, prometheus/prometheus.yml and env.example from the policy
    compose_read  a compose file's `vllm serve` command lines, read back as flags
    check    `deploy check`: a compose file, or the running engines, against the policy
    launch_check  flags against the release's table, launch settings, the memory split
    draft_schedule  where vLLM honours a speculative schedule per batch size, by release
    local_engine  an engine service other than vLLM: its loopback address, variables, command
    llamacpp  llama.cpp engines: a `llama-server` service per backend, its flags checked
    llamacpp_flagtable  a llama.cpp build's `llama-server` flags, read from its source
    sglang   SGLang engines: a `launch_server` service per backend, its flags checked
    cli      argument parsing (`specrouter deploy render|check`), file reading and writing
    policy_check  `specrouter policy check` with each valid file's engine memory added

The names below are the package's public surface, for the tests and the tools.
"""

from __future__ import annotations

from proxy.ops.deploy.check import Fetch, check_compose, check_live, draft_positions, http_fetch
from proxy.ops.deploy.cli import main, write_rendered
from proxy.ops.deploy.compose_read import EngineArgs, compose_engines, parse_vllm_args
from proxy.ops.deploy.plan import (
    BACKEND_LABEL,
    DeployError,
    EnginePlan,
    Skipped,
    engine_command,
    engine_plans,
    env_suffix,
    secret_env,
    speculative_config,
)
from proxy.ops.deploy.render import (
    ADMIN_LISTEN,
    GATEWAY_LISTEN,
    METRICS_LISTEN,
    PROMETHEUS_LISTEN,
    render,
    render_compose,
    render_env_example,
    render_operator,
    render_prometheus,
)

__all__ = [
    "ADMIN_LISTEN",
    "BACKEND_LABEL",
    "GATEWAY_LISTEN",
    "METRICS_LISTEN",
    "PROMETHEUS_LISTEN",
    "DeployError",
    "EngineArgs",
    "EnginePlan",
    "Fetch",
    "Skipped",
    "check_compose",
    "check_live",
    "compose_engines",
    "draft_positions",
    "engine_command",
    "engine_plans",
    "env_suffix",
    "http_fetch",
    "main",
    "parse_vllm_args",
    "render",
    "render_compose",
    "render_env_example",
    "render_operator",
    "render_prometheus",
    "secret_env",
    "speculative_config",
    "write_rendered",
]
