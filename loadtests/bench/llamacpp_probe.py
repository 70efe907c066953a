"""`specrouter probe` of the tiny llama.cpp engines, direct and through the gateway (docs/backends.md
quotes its output).

    python -m loadtests.bench.llamacpp_probe [--runs 3] [--window 8] [--out DIR]

One speculative llama.cpp server (the tiny target and draft of loadtests/harness/tinymodels.py,
one thread, keyed) and one gateway in front of it. Both probes read the engine's own /metrics
(with its key), so the only difference between them is the path the requests take. Bounded to
about 3 minutes on a 2-core machine with the defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from loadtests.harness.gateway import CLIENT_KEY, GatewayServer
from loadtests.harness.llamacpp import LlamaCppServer
from loadtests.harness.tinymodels import tiny_pair
from loadtests.probe import command as probe
from proxy import auth
from proxy.certs import make_local_ca

ENGINE_KEY = "probe-engine-key"
KEY_ENV = "SPECROUTER_LLAMA_PROBE_KEY"


def _policy(url: str) -> dict[str, Any]:
    return {
        "schema": 1,
        "backends": {
            "tiny-spec": {
                "url": url,
                "kind": "llamacpp",
                "served_model_name": "tiny",
                "api_key": "engine-key",
                "max_concurrency": 1,
                "startup_s": 0,
                "speculative": {"method": "draft-simple", "num_speculative_tokens": 8},
            }
        },
        "routes": {"tiny": {"models": ["tiny"], "variants": ["tiny-spec"], "defaults": {}}},
        "clients": [{"name": "probe", "key_sha256": auth.hash_key(CLIENT_KEY)}],
    }


def _cells(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    cell = data["cells"][0]
    return {k: cell[k] for k in ("runs", "tok_s", "tokens_per_step", "itl_p50_ms") if k in cell}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3, help="measurement windows per path (3)")
    p.add_argument("--window", type=float, default=8.0, help="seconds per window (8)")
    p.add_argument("--out", type=Path, default=None, help="where the probe files go")
    args = p.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="llamacpp-probe-"))
    out.mkdir(parents=True, exist_ok=True)
    common = [
        "--model",
        "tiny",
        "--concurrency",
        "1",
        "--repeats",
        str(args.runs),
        "--temperatures",
        "0",
        "--window",
        str(args.window),
        "--warmup",
        "1",
        "--max-tokens",
        "2000",
        "--prefill-tokens",
        "0",
        "--no-plot",
        "--quiet",
        "--metrics-key",
        ENGINE_KEY,
    ]
    target, draft = tiny_pair(out / "models")
    certs = make_local_ca(out / "tls")
    os.environ[KEY_ENV] = ENGINE_KEY  # the gateway child inherits it
    with LlamaCppServer(target, draft=draft, n_max=8, api_key=ENGINE_KEY, ctx_size=4096) as engine:
        metrics = ["--metrics-url", f"{engine.url}/metrics"]
        rc = probe.main(
            [
                "--url",
                f"{engine.url}/v1",
                "--key",
                ENGINE_KEY,
                *metrics,
                "--out",
                str(out / "direct.json"),
                *common,
            ]
        )
        operator = {"secrets": {"engine-key": {"env": KEY_ENV}}}
        with GatewayServer(_policy(engine.url), certs=certs, operator=operator) as gw:
            rc |= probe.main(
                [
                    "--url",
                    gw.url,
                    "--key",
                    CLIENT_KEY,
                    *metrics,
                    "--ca-cert",
                    str(certs.ca_cert),
                    "--out",
                    str(out / "gateway.json"),
                    *common,
                ]
            )
    print(
        json.dumps(
            {
                "direct": _cells(out / "direct.json"),
                "gateway": _cells(out / "gateway.json"),
                "files": str(out),
            },
            indent=2,
        )
    )
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
