"""Pure request-side edits: what the gateway sends upstream for a client's body.

The body is parsed once with orjson into a dict; only top-level keys the decision names are
set, so every field the gateway does not know passes through untouched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from policies.types import ContentSignals, Endpoint

# Endpoints whose streams carry vLLM's `stream_options` usage frames.
USAGE_ENDPOINTS: frozenset[Endpoint] = frozenset({"chat", "completions"})


@dataclass(frozen=True, slots=True)
class UsagePlan:
    """How the relay treats usage frames for one stream (see measure.StreamFilter)."""

    injected: bool = False
    strip_usage: bool = False
    drop_usage_chunk: bool = False


def plan_usage(body: dict[str, Any], endpoint: Endpoint, backend_kind: str) -> UsagePlan:
    """Ask vLLM for per-chunk usage when the client did not, so tokens per step are measured.

    Only for n == 1: with several choices vLLM moves `system_fingerprint` per choice and the
    per-request spec metrics are not reported anyway.
    """
    if endpoint not in USAGE_ENDPOINTS or body.get("stream") is not True:
        return UsagePlan()
    if backend_kind != "vllm" or body.get("n", 1) not in (1, None):
        return UsagePlan()
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        return UsagePlan()  # malformed: let the backend answer its own 400
    opts = opts or {}
    include = opts.get("include_usage") is True
    continuous = include and opts.get("continuous_usage_stats") is True
    if continuous:
        return UsagePlan()
    return UsagePlan(injected=True, strip_usage=True, drop_usage_chunk=not include)


def upstream_body(body: dict[str, Any], inject: dict[str, Any], served_model: str,
                  usage: UsagePlan) -> bytes:
    out = dict(body)
    out.update(inject)
    out["model"] = served_model
    if usage.injected:
        opts = dict(out.get("stream_options") or {})
        opts["include_usage"] = True
        opts["continuous_usage_stats"] = True
        out["stream_options"] = opts
    return orjson.dumps(out)


_FENCE = "```"
# A file path or a source file name: `src/app/main.py`, `./x`, `setup.cfg`.
_PATH = re.compile(r"(?:^|\s)(?:\.{0,2}/)?(?:[\w.-]+/)+[\w.-]+|\b[\w-]+\.(?:py|ts|tsx|js|rs|go|"
                   r"java|c|h|cc|cpp|hpp|md|toml|yaml|yml|json|sh|sql)\b")
_CODE_WORDS = ("code", "coding", "programm", "developer", "software", "repository")


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict)
                        and isinstance(p.get("text"), str))
    return ""


def content_signals(body: dict[str, Any], recent: int = 4) -> ContentSignals:
    """Cheap signals for the content classifier; reads at most the last few messages."""
    messages = body.get("messages")
    tools = bool(body.get("tools"))
    if not isinstance(messages, list):
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            prompt = ""
        return ContentSignals(tools_declared=tools, code_in_recent_messages=_FENCE in prompt)
    code = False
    system_code = False
    for msg in messages[-recent:]:
        if not isinstance(msg, dict):
            continue
        text = _text_of(msg.get("content"))
        if _FENCE in text or _PATH.search(text[-4000:]):
            code = True
            break
    if messages and isinstance(messages[0], dict) and messages[0].get("role") == "system":
        head = _text_of(messages[0].get("content"))[:2000].lower()
        system_code = any(w in head for w in _CODE_WORDS)
    return ContentSignals(tools_declared=tools, code_in_recent_messages=code,
                          system_prompt_mentions_code=system_code)
