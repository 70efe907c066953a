"""A simulated vLLM backend whose speculative decoding behaves like the measured GB10.

`specrouter sim` (see `cli.py`) serves vLLM's OpenAI-compatible API byte for byte (`wire.py`),
driven by a continuous-batching engine with per-profile step times and draft acceptance
(`engine.py`, `profiles.py`), vLLM's Prometheus metrics (`metrics.py`) and faults on demand
(`faults.py`). `--engine sglang` speaks SGLang's chat and completions bytes and `/metrics`
families instead (`sglang_wire.py`, `sglang_api.py`), and its Anthropic Messages and Responses
bytes (`sglang_typed_wire.py`, `sglang_typed_api.py`).
"""
