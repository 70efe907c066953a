"""What the per-turn prefix check costs a request: `python -m loadtests.bench.prefix_check
[--size BYTES] [--calls N]`.

For each API, an agent body (loadtests/bench/agent_body.py, 406 KiB by default) is the session's
previous turn, and the next turn is that body with one more exchange appended, as an agent sends
it; `Baselines.check` (proxy/backends/prefix.py) and the comparison it defers to the turn's end are
timed on the next turn, call by call, on the bytes `check_fields` wrote (as the request path
has them). Also the worst case the request path
meets: a change in the first item, and in the previous turn's last, each located and named (an
parse of the list and an encode of the items up to it). Prints the median and p99 in microseconds. A benchmark, not a test: the figures
depend on the machine (and its load).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from typing import Any

import orjson

from loadtests.bench.agent_body import Api, agent_body
from policies.types import Endpoint
from proxy.backends.prefix import Baselines
from proxy.relay.fields import DEFAULT_LIMITS, check_fields

_LIST = {"chat": "messages", "responses": "input", "messages": "messages"}
_ENDPOINT: dict[str, Endpoint] = {"chat": "chat", "responses": "responses", "messages": "messages"}


def _encoded(api: Api, body: dict[str, Any]) -> dict[str, Any]:
    encoded: dict[str, Any] = {}
    assert check_fields(_ENDPOINT[api], body, DEFAULT_LIMITS, encoded) is None
    return encoded


def _turns(api: Api, size: int) -> tuple[dict[str, Any], ...]:
    """(previous turn, next turn extending it, with its first message changed, with its last
    earlier message changed)."""
    prev = agent_body(api, size)
    items = prev[_LIST[api]]
    nxt = copy.deepcopy(prev)
    nxt[_LIST[api]] = [*items, *copy.deepcopy(items[-2:])]  # one more exchange
    changed = copy.deepcopy(nxt)
    first = changed[_LIST[api]][0]
    first["content"] = "changed: " + orjson.dumps(first.get("content")).decode()
    late = copy.deepcopy(nxt)
    last = late[_LIST[api]][len(items) - 1]
    last["content"] = "changed: " + orjson.dumps(last.get("content")).decode()
    return prev, nxt, changed, late


def timed(api: Api, size: int, calls: int) -> dict[str, tuple[float, float]]:
    prev, nxt, changed, late = _turns(api, size)
    out = {}
    cases = (("extends", nxt), ("first item changed", changed), ("last item changed", late))
    for name, body in cases:
        encoded = _encoded(api, body)
        b = Baselines()
        check = b.check("s", _ENDPOINT[api], prev, _encoded(api, prev))
        assert check is not None
        b.finished("s", check, "e", 100_000, 0)
        samples = []
        for _ in range(calls):
            t = time.perf_counter_ns()
            found = b.check("s", _ENDPOINT[api], body, encoded)
            assert found is not None
            _ = found.where  # the comparison itself, which the turn's end asks for
            samples.append((time.perf_counter_ns() - t) / 1000)
        samples.sort()
        out[name] = (statistics.median(samples), samples[int(0.99 * (len(samples) - 1))])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--size", type=int, default=406 * 1024)
    p.add_argument("--calls", type=int, default=300)
    args = p.parse_args()
    print(f"prefix check, {args.size:,}-byte agent bodies, {args.calls} calls each (us)")
    for api in ("chat", "responses", "messages"):
        for case, (p50, p99) in timed(api, args.size, args.calls).items():
            print(f"  {api:<10} {case:<22} median {p50:8.1f}  p99 {p99:8.1f}")


if __name__ == "__main__":
    main()
