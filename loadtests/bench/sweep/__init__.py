"""The sweep that decides: what a policy buys agent sessions on one GB10 and on two.

    python -m loadtests.bench.sweep [--quick] [--out .state/sweep]      # `make sweep`

Every configuration (configs.py) runs `specrouter replay`'s agent sessions (loadtests/replay/)
on simulated GB10s for each cell, agents x temperature, with repeats interleaved (each repeat
runs every configuration of a cell once, in a rotated order, before the next repeat), so slow
drift of this machine spreads over all of them. Every run starts its own simulators and gateway
on loopback, so no run inherits another's prefix cache. Output: sweep.json, sweep.md (the table
and a verdict per cell) and sweep.png (runner.py, table.py, verdict.py, plot.py).
"""
