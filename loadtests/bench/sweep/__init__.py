"""The sweeps: one runner (`python -m loadtests.bench.sweep [SET]`, __main__.py), three sets of
configurations, each on simulated GB10s started afresh on loopback for every run.

- decide (decide.py; `make sweep`): what a policy buys agent sessions on one GB10 and on two.
  Every configuration (configs.py) runs `specrouter replay`'s agent sessions (loadtests/replay/)
  for each cell, agents x temperature, with repeats interleaved (each repeat runs every
  configuration of a cell once, in a rotated order, before the next repeat), so slow drift of
  this machine spreads over all of them. Output: sweep.json, sweep.md (the table and a verdict
  per cell) and sweep.png (table.py, verdict.py, paired.py, matched.py, plot.py; rerender.py
  rebuilds them from the JSON).
- sessions (sessions/): agent sessions at the source documents' context sizes, straight and
  through session-aware admission, resumable by stage into docs/sessions-sweep.jsonl.
- policy (policy.py): a policy against each of its variants alone, with the probe's streams.

runner.py holds the loop every set runs (one run at a time, each record kept as it ends,
failures recorded, a wall-time budget); launch.py starts one configuration (a simulator per
device, then the gateway on its policy). gb10-three.yaml and pair-block5.yaml are the former
policies these sets measured, kept beside them.
"""
