"""How the deployment launches the engines (`specrouter deploy` reads it; the gateway does not):
the vLLM release, per engine its context length and parsers, and the memory model's knobs."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from policies.spec.base import StrictModel

VLLM_VERSION = r"^\d+\.\d+\.\d+$"
PARSER_NAME = r"^[a-z0-9][a-z0-9_-]{0,63}$"
DEFAULT_VLLM_VERSION = "0.28.0"  # the release the GB10 runs

# The KV budgets a policy may name (proxy/ops/deploy/memory.py's KV_BUDGETS): "machine", the
# largest the memory model leaves the engine (the default), "documents", the source documents'
# 36 GiB.
KvBudgetName = Literal["machine", "documents"]

# vLLM's tool-call parsers for the Qwen3 coding models: qwen3_coder (its XML tool calls), and
# hermes (JSON inside <tool_call>) for checkpoints that emit that instead.
ToolCallParser = Literal["qwen3_coder", "qwen3_xml", "hermes"]


class EngineSpec(StrictModel):
    """One backend's engine launch settings beyond what routing needs."""

    vllm_version: Annotated[str, Field(pattern=VLLM_VERSION)] | None = None  # None: deployment's
    # --max-model-len; None: the checkpoint's own (262,144 for Qwen3.8-27B), which the engine's
    # KV cache must then hold.
    max_model_len: Annotated[int, Field(ge=256, le=4_194_304)] | None = None
    # --enable-auto-tool-choice --tool-call-parser: without it, `tool_choice: "auto"` is a 400.
    tool_call_parser: ToolCallParser | None = None
    reasoning_parser: Annotated[str, Field(pattern=PARSER_NAME)] | None = None  # e.g. qwen3


class DeploymentSpec(StrictModel):
    """Machine-wide settings; the memory figures left unset take the memory model's defaults
    (proxy/ops/deploy/memory.py says why they are what they are)."""

    vllm_version: Annotated[str, Field(pattern=VLLM_VERSION)] = DEFAULT_VLLM_VERSION
    reserved_gib: Annotated[float, Field(ge=0)] | None = None  # OS, gateway, monitoring
    embed_memory_share: Annotated[float, Field(gt=0, lt=1)] | None = None  # per embedder
    engine_overhead_gib: Annotated[float, Field(ge=0)] | None = None  # per coding engine
    # Per coding engine: at most this many GiB, or a named budget; None: "machine".
    kv_budget_gib: Annotated[float, Field(gt=0)] | KvBudgetName | None = None
