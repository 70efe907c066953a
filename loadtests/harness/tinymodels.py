"""Tiny llama-architecture GGUF models with random weights, for a real engine on loopback.

    target, draft = tiny_pair(cache_dir)          # two paths, written once per content hash

Nothing is downloaded: the weights come from a seeded generator, the vocabulary (SentencePiece
style, with byte fallback) covers ASCII code-like text and ChatML's two control tokens, and the
chat template is ChatML. The draft is the target's first `draft_layers` blocks; the target's
later blocks are scaled down so that they nudge rather than rewrite the residual stream, which
makes the draft agree with the target often enough for speculative decoding to pay off.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path

import gguf
import numpy as np

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_SPACE = "\u2581"  # SentencePiece's visible space
# Words common in code and prose; each is added with all its prefixes, because the SentencePiece
# merge only reaches a piece through pieces that are themselves in the vocabulary.
_WORDS = (
    "def return if else elif for while in not and or import from class self None True False "
    "print len range int str list dict value key data result name test assert with as try "
    "except raise lambda yield the is of to a an that this it"
).split()
_SYMBOLS = ("()", "):", "==", "!=", "+=", "->", "[]", "{}", "''", '""', "    ", "  ")
_CONTROL = ("<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>")
UNK, BOS, EOS, IM_START, IM_END = range(len(_CONTROL))


@dataclass(frozen=True)
class TinySpec:
    """Everything that decides a model's bytes (the cache key is a hash of it)."""

    seed: int = 0
    n_layer: int = 4
    draft_layers: int = 1
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    n_ctx: int = 1024
    # Residual scale of the target's blocks past the draft's: the smaller, the closer they agree
    # (0.2: ~4 tokens per target step at n_max 8 and temperature 0; 0.05 accepts nearly all).
    tail_scale: float = 0.2
    # Logit spread: large enough that temperature-0 choices are not near ties.
    logit_scale: float = 4.0


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types, in id order."""
    tokens: list[str] = list(_CONTROL)
    types = [gguf.TokenType.UNKNOWN] + [gguf.TokenType.CONTROL] * (len(_CONTROL) - 1)
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    pieces: list[str] = [_SPACE if c == " " else c for c in map(chr, range(0x21, 0x7F))]
    pieces.insert(0, _SPACE)
    for word in _WORDS:
        spaced = _SPACE + word
        pieces += [spaced[:k] for k in range(2, len(spaced) + 1)]
        pieces += [word[:k] for k in range(2, len(word) + 1)]
    pieces += [s.replace(" ", _SPACE) for s in _SYMBOLS]
    unique = list(dict.fromkeys(pieces))
    tokens += unique
    types += [gguf.TokenType.NORMAL] * len(unique)
    # Longer pieces win the merge; the rest only need a defined order.
    scores = [0.0] * (len(_CONTROL) + 256) + [float(len(p)) for p in unique]
    return tokens, scores, [int(t) for t in types]


def _weights(spec: TinySpec, n_vocab: int, normal_from: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(spec.seed)
    e, kv = spec.n_embd, spec.n_embd // spec.n_head * spec.n_head_kv

    def mat(rows: int, cols: int, scale: float = 1.0) -> np.ndarray:
        m: np.ndarray = rng.standard_normal((rows, cols), dtype=np.float32)
        return m * np.float32(scale / np.sqrt(cols))

    out: dict[str, np.ndarray] = {
        "token_embd.weight": mat(n_vocab, e, np.sqrt(e)),
        "output_norm.weight": np.ones(e, np.float32),
    }
    head = mat(n_vocab, e, spec.logit_scale)
    # Control and byte tokens are never the greedy choice: output text stays printable ASCII and
    # a stream is not cut short by a random end-of-turn.
    head[:normal_from] = 0.0
    out["output.weight"] = head
    for i in range(spec.n_layer):
        tail = 1.0 if i < spec.draft_layers else spec.tail_scale
        out |= {
            f"blk.{i}.attn_norm.weight": np.ones(e, np.float32),
            f"blk.{i}.attn_q.weight": mat(e, e),
            f"blk.{i}.attn_k.weight": mat(kv, e),
            f"blk.{i}.attn_v.weight": mat(kv, e),
            f"blk.{i}.attn_output.weight": mat(e, e, tail),
            f"blk.{i}.ffn_norm.weight": np.ones(e, np.float32),
            f"blk.{i}.ffn_gate.weight": mat(spec.n_ff, e),
            f"blk.{i}.ffn_up.weight": mat(spec.n_ff, e),
            f"blk.{i}.ffn_down.weight": mat(e, spec.n_ff, tail),
        }
    return out


def _write(path: Path, spec: TinySpec, n_layer: int, name: str) -> None:
    tokens, scores, types = vocabulary()
    normal_from = types.index(int(gguf.TokenType.NORMAL))
    weights = _weights(spec, len(tokens), normal_from)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(tmp, "llama")
    writer.add_name(name)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(spec.n_ctx)
    writer.add_embedding_length(spec.n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(spec.n_ff)
    writer.add_head_count(spec.n_head)
    writer.add_head_count_kv(spec.n_head_kv)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(UNK)
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(IM_END)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(False)
    writer.add_chat_template(CHATML_TEMPLATE)
    for tensor, data in weights.items():
        if not tensor.startswith("blk.") or int(tensor.split(".")[1]) < n_layer:
            writer.add_tensor(tensor, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(path)  # atomic: a concurrent reader sees the whole file or none


def spec_hash(spec: TinySpec) -> str:
    """The spec, this writer's source and the gguf version: whatever could change the bytes."""
    digest = hashlib.sha256(json.dumps(asdict(spec), sort_keys=True).encode())
    digest.update(Path(__file__).read_bytes())
    digest.update(version("gguf").encode())
    return digest.hexdigest()[:16]


def tiny_pair(cache_dir: Path | str, spec: TinySpec | None = None) -> tuple[Path, Path]:
    """(target, draft) GGUF paths under `cache_dir`, written unless already there."""
    spec = spec or TinySpec()
    if not 0 < spec.draft_layers < spec.n_layer:
        raise ValueError("the draft needs at least one block and fewer than the target")
    root = Path(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    digest = spec_hash(spec)
    target = root / f"tiny-target-{digest}.gguf"
    draft = root / f"tiny-draft-{digest}.gguf"
    if not target.exists():
        _write(target, spec, spec.n_layer, "tiny-target")
    if not draft.exists():
        _write(draft, spec, spec.draft_layers, "tiny-draft")
    return target, draft


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cache_dir", nargs="?", default="~/.cache/specrouter/tinymodels")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for path in tiny_pair(Path(args.cache_dir).expanduser(), TinySpec(seed=args.seed)):
        print(path)


if __name__ == "__main__":
    main()
