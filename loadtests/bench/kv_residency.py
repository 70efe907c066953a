"""Each session's prefix as the session table estimates it (its last turn's prompt and output)
against what the engine's KV events say the engine holds (the gateway's index,
proxy/backends/kv_index.py), and what the session's next turn then finds cached: on the
simulator imitating vLLM 0.32.0 (its events tagged with the session), the KV-sessions
workload's text (loadtests/bench/kv_sessions.py), sessions taking turns one request at a time.

    python -m loadtests.bench.kv_residency [--kv-tokens 4064 16256] [--turns 3]

docs/sessions.md has the table.
"""

from __future__ import annotations

import argparse
from typing import Any

import httpx

from loadtests.bench.kv_sessions import MODEL, KvSession, KvWorkload, gateway_policy
from loadtests.bench.kv_sessions_engines import MAX_NUM_SEQS, SimEngine
from loadtests.harness.gateway import ADMIN_TOKEN, GatewayServer
from loadtests.harness.ports import free_port
from loadtests.harness.requestlog import logged_rows

CONTEXTS = (1300, 1300, 2000, 600)  # each session's own prefix, tokens


def _explained(gw: GatewayServer, key: str) -> dict[str, Any]:
    resp = httpx.post(
        gw.admin + "/admin/policy/explain",
        headers={"authorization": f"Bearer {ADMIN_TOKEN}"},
        json={"request": {"model": MODEL, "messages": []}, "session": key},
        timeout=10,
    )
    resp.raise_for_status()
    session: dict[str, Any] = resp.json()["session"]
    return session


def run(kv_tokens: int, turns: int) -> list[dict[str, Any]]:
    events, replay = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    config = {"enable_kv_cache_events": True, "endpoint": events, "replay_endpoint": replay}
    sessions = [KvSession(KvWorkload(context=c), i) for i, c in enumerate(CONTEXTS)]
    gen = KvWorkload().gen_tokens
    out: list[dict[str, Any]] = []
    with SimEngine(kv_tokens, 0.05, kv_events=config).fresh() as url:
        doc = gateway_policy(url, kv_tokens=kv_tokens, max_num_seqs=MAX_NUM_SEQS, admission=None)
        doc["backends"]["small-kv"]["kv_events"] = {"endpoint": events, "replay": replay}
        with GatewayServer(doc) as gw, gw.client() as c:
            c.timeout = 60

            def turn(n: int, s: KvSession) -> dict[str, Any]:
                rid = f"res-{kv_tokens}-{n}-{s.turns_left}"
                body = {
                    "model": MODEL,
                    "messages": s.messages,
                    "max_tokens": gen,
                    "min_tokens": gen,
                    "temperature": 0,
                }
                headers = {"x-session-id": f"res-{n}", "x-request-id": rid}
                r = c.post("/v1/chat/completions", json=body, headers=headers)
                r.raise_for_status()
                s.record(r.json()["choices"][0]["message"]["content"], gen)
                row: dict[str, Any] = logged_rows(gw.dir / "state", {rid}, timeout=5)[rid]
                return row

            last: dict[int, dict[str, Any]] = {}
            for _ in range(turns):
                for n, s in enumerate(sessions):
                    last[n] = turn(n, s)
            for n, s in enumerate(sessions):
                row = last[n]
                explained = _explained(gw, row["session"])
                following = turn(n, s)
                out.append(
                    {
                        "kv_tokens": kv_tokens,
                        "session": n,
                        "estimate": row["prompt_tokens"] + row["completion_tokens"],
                        "resident": explained["resident_tokens"],
                        "next_cached": following["cached_tokens"],
                        "next_cause": following["loss_cause"],
                    }
                )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kv-tokens", type=int, nargs="+", default=[4064, 16256])
    parser.add_argument("--turns", type=int, default=3)
    args = parser.parse_args()
    print("| KV tokens | session | estimated | resident | next turn cached | its loss cause |")
    print("|---|---|---|---|---|---|")
    for kv in args.kv_tokens:
        for r in run(kv, args.turns):
            print(
                f"| {r['kv_tokens']:,} | {r['session']} | {r['estimate']:,} | "
                f"{r['resident'] if r['resident'] is None else format(r['resident'], ',')} | "
                f"{r['next_cached']:,} | {r['next_cause'] or '-'} |"
            )


if __name__ == "__main__":
    main()
