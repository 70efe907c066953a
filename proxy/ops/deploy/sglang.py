"""SGLang engines in the rendered stack: a `python -m sglang.launch_server` service per backend
of kind `sglang` that has an `engine:` block and a loopback URL, beside the vLLM engines or
instead of them, its flags checked against the release's table (sglang_flags/, read from SGLang's
own parser by scripts/sglang_flagtable.py).

What the gateway needs of it: `--enable-metrics` (it scrapes `sglang:`), and with
`priority_scheduling: true` `--enable-priority-scheduling --schedule-low-priority-values-first`
(the gateway sends lower values first, as vLLM orders them; SGLang's default is the opposite).
Rendered, not run: SGLang's server does not run on this CPU (docs/backends.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from policies.spec.backends import BackendSpec
from policies.spec.document import PolicyDocument
from proxy.ops.deploy import local_engine
from proxy.ops.deploy.compose_read import as_list
from proxy.ops.deploy.local_engine import (
    LocalEngine,
    command_lines,
    differences,
    local_engines,
)
from proxy.ops.deploy.plan import BACKEND_LABEL, DeployError, env_suffix, secret_env

VERSION = "0.5.23"  # the release whose parser the table was read from
TABLE = Path(__file__).resolve().parent / "sglang_flags" / f"{VERSION}.txt"
ENTRYPOINT = ["python3", "-m", "sglang.launch_server"]
IMAGE_VAR = "SGLANG_IMAGE"  # an image with SGLang VERSION for the GB10: the operator's
ALGORITHM = "speculative-algorithm "  # a table line naming one --speculative-algorithm value
ATTENTION = "attention-backend "
# Without the memory model's split (it plans vLLM engines): SGLang's static share, model weights
# and KV pool, of the machine's memory. Alone on a GB10 most of it; beside vLLM the operator
# lowers both engines' shares so they fit (a guess either way: docs/backends.md).
MEM_FRACTION = "0.80"

# A policy's speculative method (vLLM's names, and SGLang's own) -> SGLang's algorithm, how the
# depth K (num_speculative_tokens, the drafted tokens per step) is spelled, and whether a drafter
# checkpoint is passed. EAGLE-style chains: K steps of top-1, K + 1 tokens verified. DFlash's block
# is its verify window (K + 1); DSpark's block size is K (SGLang verifies K + 1).
_CHAIN = ("--speculative-num-steps={k}", "--speculative-eagle-topk=1")
METHODS: Mapping[str, tuple[str, tuple[str, ...], bool]] = {
    "eagle": ("EAGLE", (*_CHAIN, "--speculative-num-draft-tokens={k1}"), True),
    "eagle3": ("EAGLE3", (*_CHAIN, "--speculative-num-draft-tokens={k1}"), True),
    "mtp": ("NEXTN", (*_CHAIN, "--speculative-num-draft-tokens={k1}"), False),
    "draft_model": ("STANDALONE", (*_CHAIN, "--speculative-num-draft-tokens={k1}"), True),
    "ngram": ("NGRAM", ("--speculative-num-draft-tokens={k1}",), False),
    "dflash": ("DFLASH", ("--speculative-dflash-block-size={k1}",), True),
    "dspark": ("DSPARK", ("--speculative-dspark-block-size={k}",), True),
    "dspine": ("DSPARK", ("--speculative-dspark-block-size={k}",), True),
}
# DSpine's published configuration (the vendor's premise: SGLang 0.5.22, BF16, FlashAttention 3,
# concurrency 8, dynamic verification, blocks of 16): the flags the policy cannot say. Guesses:
# that DSpine runs as SGLang's DSPARK algorithm, and that its dynamic verification is DSPARK's
# ragged verify, which needs a cost table profiled offline (without one SGLang verifies all).
PUBLISHED: Mapping[str, tuple[str, ...]] = {
    "dspine": (
        "--dtype=bfloat16",
        "--attention-backend=fa3",
        "--speculative-dspark-sps-table-path=${{{sps_var}:?set {sps_var} in .env}}",
    ),
}


@dataclass(frozen=True, slots=True)
class SglangPlan(LocalEngine):
    @property
    def sps_var(self) -> str:
        return "SPS_TABLE_" + env_suffix(self.backend)

    @property
    def mem_var(self) -> str:
        return "SGLANG_MEM_FRACTION_" + env_suffix(self.backend)


@cache
def _table() -> tuple[frozenset[str], ...]:
    return local_engine.read_table(TABLE, ALGORITHM, ATTENTION)


def flags() -> frozenset[str]:
    return _table()[0]


def algorithms() -> frozenset[str]:
    return _table()[1]


def rendered(backend: BackendSpec) -> bool:
    """An SGLang backend the stack runs: the policy gave it launch settings."""
    return local_engine.rendered(backend, "sglang")


def sglang_plans(doc: PolicyDocument) -> list[SglangPlan]:
    return [
        SglangPlan(e.service, e.backend, e.spec, e.host, e.port)
        for e in local_engines(doc, "sglang", "SGLang server")
    ]


def server_command(plan: SglangPlan) -> list[str]:
    """`launch_server` arguments (after the entrypoint), only flags of the table's release."""
    spec = plan.spec
    args = [
        f"--model-path=${{{plan.model_var}:-/models/{spec.served_model_name}}}",
        f"--served-model-name={spec.served_model_name}",
        f"--host={plan.host}",
        f"--port={plan.port}",
        f"--max-running-requests={spec.max_concurrency}",
        f"--mem-fraction-static=${{{plan.mem_var}:-{MEM_FRACTION}}}",
        "--enable-metrics",  # the gateway scrapes sglang: (running, waiting, verify calls)
    ]
    if spec.priority_scheduling:
        args += ["--enable-priority-scheduling", "--schedule-low-priority-values-first"]
    if spec.api_key:
        var = secret_env(spec.api_key)
        args.append(f"--api-key=${{{var}:?set {var} in .env}}")
    engine = spec.engine
    if engine.max_model_len is not None:
        args.append(f"--context-length={engine.max_model_len}")
    if engine.tool_call_parser is not None:
        args.append(f"--tool-call-parser={engine.tool_call_parser}")
    if engine.reasoning_parser is not None:
        args.append(f"--reasoning-parser={engine.reasoning_parser}")
    s = spec.speculative
    if s is not None:
        if s.method not in METHODS:
            raise DeployError(
                f"backend {plan.backend!r}: speculative method {s.method!r} has no "
                f"SGLang rendering (known: {', '.join(METHODS)})"
            )
        algorithm, depth, drafter = METHODS[s.method]
        args.append(f"--speculative-algorithm={algorithm}")
        k = s.num_speculative_tokens
        args += [d.format(k=k, k1=k + 1) for d in depth]
        if drafter:
            args.append(
                f"--speculative-draft-model-path=${{{plan.drafter_var}:-/models/drafters/"
                f"{plan.backend}}}"
            )
        args += [a.format(sps_var=plan.sps_var) for a in PUBLISHED.get(s.method, ())]
    problems = unknown(args)
    if problems:
        raise DeployError(f"backend {plan.backend!r}: {'; '.join(problems)}")
    return args


def unknown(args: Sequence[str]) -> list[str]:
    """What the table's SGLang would refuse among `args`: flags it lacks, algorithms and
    attention backends it does not know."""
    out: list[str] = []
    table, algos, attention = _table()
    values = {"--speculative-algorithm": algos, "--attention-backend": attention}
    for i, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        name, eq, value = arg.partition("=")
        if name not in table:
            out.append(f"SGLang {VERSION} has no {name}")
        elif name in values:
            value = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            if value.upper() not in values[name] and value not in values[name]:
                out.append(f"SGLang {VERSION} has no {name} {value}")
    return out


def service_lines(plan: SglangPlan) -> list[str]:
    spec = plan.spec
    lines = [
        f"  {plan.service}:",
        f"    # SGLang engine for backend {plan.backend!r}, served as "
        f"{spec.served_model_name!r}, {spec.max_concurrency} running requests",
        f"    image: ${{{IMAGE_VAR}:?set {IMAGE_VAR} in .env}}",
        f"    entrypoint: [{', '.join(ENTRYPOINT)}]",
        "    command:",
    ]
    lines += command_lines(server_command(plan))
    lines += [
        "    labels:",
        f"      {BACKEND_LABEL}: {plan.backend}",
        "    network_mode: host",
        "    ipc: host",
        "    volumes:",
        "      - ${MODELS_DIR:-/models}:/models:ro",
        "    restart: unless-stopped",
        "",
    ]
    return lines


def env_lines(doc: PolicyDocument) -> list[str]:
    plans = sglang_plans(doc)
    if not plans:
        return []
    lines = ["", f"# SGLang engines: an image with SGLang {VERSION} for the GB10", f"{IMAGE_VAR}="]
    for plan in plans:
        lines.append(f"{plan.model_var}=/models/{plan.spec.served_model_name}")
        lines += [
            "# its static memory share: lower it beside vLLM engines",
            f"{plan.mem_var}={MEM_FRACTION}",
        ]
        s = plan.spec.speculative
        if s is not None and METHODS.get(s.method, ("", (), False))[2]:
            lines.append(f"{plan.drafter_var}=/models/drafters/{plan.backend}")
        if s is not None and s.method in PUBLISHED:
            lines += [
                "# the cost table sglang.benchmark.dspark_sps_profiler makes",
                f"{plan.sps_var}=",
            ]
    return lines


def check_services(doc: PolicyDocument, compose: Mapping[str, Any]) -> list[str]:
    """Each SGLang service's flags the release lacks, and where it differs from the policy."""
    services = compose.get("services")
    if not isinstance(services, dict):
        return []
    plans = {p.service: p for p in sglang_plans(doc)}
    out: list[str] = []
    for name, service in services.items():
        if not isinstance(service, dict):
            continue
        argv = as_list(service.get("entrypoint")) + as_list(service.get("command"))
        if argv[:3] != ENTRYPOINT:
            continue
        where = f"service {name} (sglang)"
        out += [f"{where}: {p}" for p in unknown(argv[3:])]
        plan = plans.get(str(name))
        if plan is None:
            out.append(
                f"{where}: no SGLang backend of the policy with an engine block describes it"
            )
            continue
        keep = (
            "--model-path",
            "--speculative-draft-model-path",
            "--speculative-dspark-sps-table-path",
            "--mem-fraction-static",
        )
        out += differences(where, server_command(plan), argv[3:], keep)
    return out
