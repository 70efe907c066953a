"""The tiny models the real-vLLM tests serve, written locally (run by scripts/vllm.sh in the
vLLM venv, which has torch, transformers and tokenizers; nothing is downloaded).

    python scripts/vllm_models.py --out DIR    # DIR/target, DIR/draft (HF folders)

- A byte-level BPE tokenizer trained here on a corpus this file makes, carrying Qwen3's special
  and added tokens (<|im_start|>, <|im_end|>, <|endoftext|>, <think>, </think>, <tool_call>,
  </tool_call>, ...) and a ChatML chat template with tools (written here, Qwen3's layout).
- The target: a Qwen3-architecture model of 1.33 M parameters (4 layers, width 128), seeded. Random weights
  never repeat themselves, so a draft would never be accepted: the output layer is shaped into
  a near-bigram chain (token t's strongest successor is next[t], `next` a permutation made of
  cycles of 24 tokens), and the blocks' residual writes are scaled down, so greedy output
  follows the chain with the context nudging it. Cycles make the ngram proposer find matches.
- The draft: a perturbed copy of the target (the same tokenizer), so it agrees most of the time.
- 32,768 positions: the agents' prompts reach 10-20K tokens, and an engine served past its
  model's position range dies on a long prompt.

Deterministic: the same file writes the same models (scripts/vllm.sh caches them by its hash).
The target also serves as the embedding model (`--runner pooling --convert embed`).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

SEED = 1234
POSITIONS = 32768
CYCLE = 24
DRAFT_NOISE = 1.5  # the draft agrees on ~85 % of greedy steps: 3.3-3.9 tokens per step at 4
SPECIAL = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
# Qwen3's added tokens that are not special (parsers look them up by text).
ADDED = [
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
]
# ChatML as Qwen3 lays it out: tools in the system turn, tool results as user turns.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{ '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{ '# Tools\\n\\n<tools>' }}"
    "{%- for tool in tools %}{{ '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{ '\\n</tools><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{ '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' %}"
    "{{ '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- elif message.role != 'system' %}"
    "{{ '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.content is string %}{{ message.content }}"
    "{%- elif message.content %}{%- for part in message.content %}"
    "{%- if part.text is defined %}{{ part.text }}{%- endif %}{%- endfor %}"
    "{%- endif %}"
    "{%- for call in message.tool_calls or [] %}"
    "{{ '\\n<tool_call>\\n<function=' + call.function.name + '>\\n</function>\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)
_WORDS = (
    "def return if else elif for while in not and or import from class self None True False "
    "print len range int str list dict value key data result name test assert with as try "
    "except raise lambda yield the is of to a an that this it function write returns length "
    "file path read open line count error message request response model token stream"
).split()
_SYMBOLS = ["(", ")", ":", "=", "==", "+", "-", "[", "]", "{", "}", ",", ".", "\n", "    "]


def corpus() -> list[str]:
    rng = random.Random(SEED)
    lines = []
    for _ in range(3000):
        n = rng.randint(3, 12)
        parts = [
            rng.choice(_WORDS) if rng.random() < 0.7 else rng.choice(_SYMBOLS) for _ in range(n)
        ]
        lines.append(" ".join(parts))
    return lines


def write_tokenizer(out: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1024,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL[1:],
    )
    fast.add_special_tokens({"additional_special_tokens": SPECIAL[1:]})
    fast.add_tokens(ADDED)
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = POSITIONS
    fast.save_pretrained(out)
    return len(fast)


def write_models(out: Path) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    (out / "target").mkdir(parents=True)
    n_tokens = write_tokenizer(out / "target")
    vocab = (n_tokens + 63) // 64 * 64
    torch.manual_seed(SEED)
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=640,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=POSITIONS,
        tie_word_embeddings=False,
        torch_dtype="float32",
        bos_token_id=None,
        eos_token_id=_token_id(out / "target", "<|im_end|>"),
        pad_token_id=_token_id(out / "target", "<|endoftext|>"),
    )
    model = Qwen3ForCausalLM(config).eval()
    rng = random.Random(SEED)
    plain = _printable(out / "target", n_tokens)
    rng.shuffle(plain)
    successor = {}
    for start in range(0, len(plain), CYCLE):
        cycle = plain[start : start + CYCLE]
        for i, t in enumerate(cycle):
            successor[t] = cycle[(i + 1) % len(cycle)]
    with torch.no_grad():
        emb = model.model.embed_tokens.weight
        emb.copy_(torch.nn.functional.normalize(torch.randn_like(emb), dim=-1) * 4.0)
        head = model.lm_head.weight
        head.copy_(torch.randn_like(head) * 0.1)
        for t, nxt in successor.items():
            head[nxt] += emb[t] * 0.18
        for s in _special_ids(out / "target"):
            head[s] = 0.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(0.3)
            layer.mlp.down_proj.weight.mul_(0.3)
    model.save_pretrained(out / "target", safe_serialization=True)
    generator = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * param.std() * 0.15)
        # The draft's output layer disagrees with the target's now and then (DRAFT_NOISE).
        head = model.lm_head.weight
        head.add_(torch.randn(head.shape, generator=generator) * head.std() * DRAFT_NOISE)
    model.save_pretrained(out / "draft", safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        src = out / "target" / name
        if src.exists():
            (out / "draft" / name).write_bytes(src.read_bytes())
    extra = out / "target" / "chat_template.jinja"
    if extra.exists():
        (out / "draft" / extra.name).write_bytes(extra.read_bytes())


def _token_id(folder: Path, text: str) -> int:
    data = json.loads((folder / "tokenizer.json").read_text())
    for added in data["added_tokens"]:
        if added["content"] == text:
            return int(added["id"])
    raise KeyError(text)


def _printable(folder: Path, n_tokens: int) -> list[int]:
    """The tokens the chain walks: those that decode to printable ASCII (no control bytes, no
    half of a UTF-8 sequence), specials left out."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    special = _special_ids(folder)
    out = []
    for t in range(n_tokens):
        text = tok.decode([t])
        if t not in special and text and all(c == "\n" or " " <= c <= "~" for c in text):
            out.append(t)
    return out


def _special_ids(folder: Path) -> set[int]:
    data = json.loads((folder / "tokenizer.json").read_text())
    return {int(a["id"]) for a in data["added_tokens"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    write_models(args.out)


if __name__ == "__main__":
    main()
