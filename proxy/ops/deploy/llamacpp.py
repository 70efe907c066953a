"""llama.cpp engines in the rendered stack: a `llama-server` service per backend of kind
`llamacpp` that has an `engine:` block and a loopback URL, its command line from the policy, and
the check of a compose file's llama-server command lines against the build's flag table
(llamacpp_flags/, read from llama.cpp's source by `python -m proxy.ops.deploy.llamacpp_flagtable`).

Rendered, not run: the tests' tiny models have no MTP tensors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from policies.spec.backends import BackendSpec
from policies.spec.document import PolicyDocument
from proxy.ops.deploy import local_engine
from proxy.ops.deploy.compose_read import as_list
from proxy.ops.deploy.llamacpp_flagtable import SPEC_TYPE_PREFIX
from proxy.ops.deploy.local_engine import (
    LocalEngine,
    command_lines,
    differences,
    local_engines,
)
from proxy.ops.deploy.plan import BACKEND_LABEL, DeployError, secret_env

BUILD = "b11434"  # the build whose source the table was read from
TABLE = Path(__file__).resolve().parent / "llamacpp_flags" / f"{BUILD}.txt"
ENTRYPOINT = "llama-server"
IMAGE_VAR = "LLAMACPP_IMAGE"  # an image with llama-server of BUILD or later: the operator's
API_KEY_ENV = "LLAMA_API_KEY"  # llama-server reads --api-key from it

# A llama.cpp backend's speculative method is llama.cpp's --spec-type name (vLLM's names for the
# same thing are taken too) -> that name, and whether a drafter file is passed. MTP takes none:
# the heads are in the target's file, and passing them as --model-draft crashed the source
# documents' server. Types not listed (eagle3, dflash: sidecar files) are not rendered.
SPEC_TYPES: Mapping[str, tuple[str, bool]] = {
    "draft-mtp": ("draft-mtp", False),
    "mtp": ("draft-mtp", False),
    "draft-simple": ("draft-simple", True),
    "draft_model": ("draft-simple", True),
    "ngram-simple": ("ngram-simple", False),
    "ngram-mod": ("ngram-mod", False),
}


LlamaPlan = LocalEngine


@cache
def _table() -> tuple[frozenset[str], ...]:
    return local_engine.read_table(TABLE, SPEC_TYPE_PREFIX)


def flags() -> frozenset[str]:
    return _table()[0]


def spec_types() -> frozenset[str]:
    return _table()[1]


def rendered(backend: BackendSpec) -> bool:
    """A llama.cpp backend the stack runs: the policy gave it launch settings."""
    return local_engine.rendered(backend, "llamacpp")


def llama_plans(doc: PolicyDocument) -> list[LlamaPlan]:
    return local_engines(doc, "llamacpp", "llama-server")


def server_command(plan: LlamaPlan) -> list[str]:
    """`llama-server` arguments (after the entrypoint), only flags of the table's build."""
    spec = plan.spec
    args = [
        f"--model=${{{plan.model_var}:-/models/{spec.served_model_name}.gguf}}",
        f"--alias={spec.served_model_name}",
        f"--host={plan.host}",
        f"--port={plan.port}",
        f"--parallel={spec.max_concurrency}",
        "--metrics",
    ]  # the gateway scrapes llamacpp: counters (running, drafts, accepted)
    if spec.engine.max_model_len is not None:
        # --ctx-size is shared by the slots: each gets ctx-size / parallel tokens
        args.append(f"--ctx-size={spec.engine.max_model_len * spec.max_concurrency}")
    if spec.engine.tool_call_parser is not None:
        args.append("--jinja")  # tool calls are parsed from the model's own chat template
    s = spec.speculative
    if s is not None:
        if s.method not in SPEC_TYPES:
            raise DeployError(
                f"backend {plan.backend!r}: speculative method {s.method!r} has no "
                f"llama.cpp rendering (known: {', '.join(SPEC_TYPES)})"
            )
        spec_type, drafter = SPEC_TYPES[s.method]
        args.append(f"--spec-type={spec_type}")
        if drafter:
            args.append(
                f"--model-draft=${{{plan.drafter_var}:-/models/drafters/{plan.backend}.gguf}}"
            )
        args.append(f"--spec-draft-n-max={s.num_speculative_tokens}")
    problems = unknown(args)
    if problems:
        raise DeployError(f"backend {plan.backend!r}: {'; '.join(problems)}")
    return args


def unknown(args: Sequence[str]) -> list[str]:
    """What the table's llama-server would refuse among `args`: flags it lacks, spec types it
    does not know."""
    out: list[str] = []
    table, types = flags(), spec_types()
    for i, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        name, eq, value = arg.partition("=")
        if name not in table:
            out.append(f"llama-server {BUILD} has no {name}")
        elif name == "--spec-type":
            value = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            out += [
                f"llama-server {BUILD} has no --spec-type {t}"
                for t in value.split(",")
                if t not in types
            ]
    return out


def service_lines(plan: LlamaPlan) -> list[str]:
    spec = plan.spec
    lines = [
        f"  {plan.service}:",
        f"    # llama.cpp engine for backend {plan.backend!r}, served as "
        f"{spec.served_model_name!r}, {spec.max_concurrency} slots",
        f"    image: ${{{IMAGE_VAR}:?set {IMAGE_VAR} in .env}}",
        f"    entrypoint: [{ENTRYPOINT}]",
        "    command:",
    ]
    lines += command_lines(server_command(plan))
    if spec.api_key:
        var = secret_env(spec.api_key)
        lines += ["    environment:", f"      {API_KEY_ENV}: ${{{var}:?set {var} in .env}}"]
    lines += [
        "    labels:",
        f"      {BACKEND_LABEL}: {plan.backend}",
        "    network_mode: host",
        "    volumes:",
        "      - ${MODELS_DIR:-/models}:/models:ro",
        "    restart: unless-stopped",
        "",
    ]
    return lines


def env_lines(doc: PolicyDocument) -> list[str]:
    plans = llama_plans(doc)
    if not plans:
        return []
    lines = [
        "",
        f"# llama.cpp engines: an image with llama-server of build {BUILD} or later",
        f"{IMAGE_VAR}=",
    ]
    for plan in plans:
        lines.append(f"{plan.model_var}=/models/{plan.spec.served_model_name}.gguf")
        s = plan.spec.speculative
        if s is not None and SPEC_TYPES.get(s.method, ("", False))[1]:
            lines.append(f"{plan.drafter_var}=/models/drafters/{plan.backend}.gguf")
    return lines


def check_services(doc: PolicyDocument, compose: Mapping[str, Any]) -> list[str]:
    """Each llama-server service's flags the build lacks, and where it differs from the policy
    (alias, port, slots, speculative type and depth)."""
    services = compose.get("services")
    if not isinstance(services, dict):
        return []
    plans = {p.service: p for p in llama_plans(doc)}
    out: list[str] = []
    for name, service in services.items():
        if not isinstance(service, dict):
            continue
        argv = as_list(service.get("entrypoint")) + as_list(service.get("command"))
        if not argv or Path(argv[0]).name != ENTRYPOINT:
            continue
        where = f"service {name} (llama-server)"
        out += [f"{where}: {p}" for p in unknown(argv[1:])]
        plan = plans.get(str(name))
        if plan is None:
            out.append(
                f"{where}: no llama.cpp backend of the policy with an engine block describes it"
            )
            continue
        out += differences(where, server_command(plan), argv[1:], ("--model",))
    return out
