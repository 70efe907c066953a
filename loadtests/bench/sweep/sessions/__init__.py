"""The sessions set of the sweep (`python -m loadtests.bench.sweep sessions run|plan|render`):
agent sessions at the source documents' context sizes on a simulated GB10, straight and through
the gateway with session-aware admission, at the documents' and the machine's KV budgets; and
two GB10s (gb10-pair.yaml against two identical engines). Resumable: every run is appended to
docs/sessions-sweep.jsonl; docs/sessions-sweep.md says how to continue and shows the figures.
"""
