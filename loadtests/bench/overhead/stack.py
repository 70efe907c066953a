"""The processes under test: the pacer, the gateway in front of it, a bare relay (Starlette +
aiohttp, no parsing), nginx when installed, and (`baseline`) a second gateway run from another
checkout of this repository, so a change is measured beside the code it replaces in one run."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from loadtests.bench.overhead.nginx import NGINX_CONF, find_nginx
from loadtests.harness.launch import SERVE_READY, Child, cli, serve_args
from loadtests.harness.ports import free_port
from loadtests.harness.procfs import child_pids
from proxy import auth
from proxy.certs import CertFiles, make_local_ca

BENCH_KEY = "sk-bench-overhead"
ADMIN_TOKEN = "bench-admin-token-of-thirty-two-chars"  # 32+: the gateway refuses less
MODEL = "pacer"
TARGETS = ("direct", "gateway", "baseline", "relay", "relay_json", "nginx")
# Targets only the agents' rounds measure (agents.py): the bare relay that parses the body and
# writes it back, the allowance of the overhead goals.
AGENTS_ONLY = frozenset({"relay_json"})


def _tree(pid: int) -> Callable[[], list[int]]:
    return lambda: [pid, *child_pids(pid)]


@dataclass
class Arm:
    name: str
    port: int
    tls: ssl.SSLContext | None
    auth: bytes  # extra request header lines
    pids: Callable[[], list[int]]  # the processes whose CPU and memory are the target's cost


def bench_policy(pacer_port: int) -> dict[str, Any]:
    """One route, one backend (the pacer), one client: the gateway's policy in the benchmarks."""
    return {
        "schema": 1,
        "backends": {
            MODEL: {
                "url": f"http://127.0.0.1:{pacer_port}",
                "kind": "vllm",
                "task": "generate",
                "served_model_name": MODEL,
                "max_concurrency": 4096,
            }
        },
        "routes": {
            "bench": {"models": [MODEL], "task": "generate", "variants": [MODEL], "defaults": {}}
        },
        "clients": [{"name": "bench", "key_sha256": auth.hash_key(BENCH_KEY)}],
    }


class Stack:
    """Pacer, gateway and (when installed) nginx on loopback; everything stopped on exit."""

    def __init__(
        self,
        *,
        nginx: bool = True,
        relay: bool = True,
        workdir: Path | None = None,
        otlp: bool = False,
        baseline: Path | None = None,
        engine_echo: bool = True,
    ) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="specrouter-overhead-")
        self.dir = workdir or Path(self._tmp.name)
        self.want_nginx = nginx
        self.want_relay = relay
        # The gateway exports OpenTelemetry to a receiver process of its own on loopback.
        self.want_otlp = otlp
        # Another checkout's gateway (its `proxy` package first on the path), same policy.
        self.baseline_checkout = baseline
        # The pacer echoes x-request-id as the deploy's vLLM does (engine connections reused).
        self.engine_echo = engine_echo
        self.baseline: Child | None = None
        self.baseline_module = ""  # the `proxy/__init__.py` it runs, as it reported it
        self.otlp: Child | None = None
        self.children: list[Child] = []
        self.targets: dict[str, Arm] = {}
        self.pacer: Child | None = None
        self.gateway: Child | None = None
        self.nginx: Child | None = None
        self.nginx_skipped = ""
        self.certs: CertFiles | None = None

    def __enter__(self) -> Stack:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        for child in reversed(self.children):
            with contextlib.suppress(Exception):
                child.stop()
        self.children.clear()
        self._tmp.cleanup()

    def _spawn(self, child: Child) -> Child:
        self.children.append(child)
        return child.start()

    def _start(self) -> None:
        self.certs = certs = make_local_ca(self.dir / "tls")
        client_tls = ssl.create_default_context(cafile=str(certs.ca_cert))
        self.pacer = self._spawn(
            Child(
                "pacer",
                [sys.executable, "-m", "loadtests.bench.pacer", "--port", "0"]
                + ([] if self.engine_echo else ["--no-request-id-echo"]),
                ready=re.compile(r"pacer listening on http://127\.0\.0\.1:(\d+)"),
                detach=True,
            )
        )
        assert self.pacer.match is not None
        pacer_port = int(self.pacer.match.group(1))
        pacer_pid = self.pacer.pid
        self.targets["direct"] = Arm("direct", pacer_port, None, b"", lambda: [pacer_pid])

        policy = bench_policy(pacer_port)
        policy_path = self.dir / "policy.yaml"
        policy_path.write_text(yaml.safe_dump(policy, sort_keys=False))
        extra: tuple[str, ...] = ()
        if self.want_otlp:
            self.otlp = self._spawn(
                Child(
                    "otlp",
                    [sys.executable, "-m", "loadtests.harness.otlp"],
                    ready=re.compile(r"otlp receiver on (http://127\.0\.0\.1:\d+)"),
                    detach=True,
                )
            )
            assert self.otlp.match is not None
            extra = ("--otlp-endpoint", self.otlp.match.group(1))
        args = serve_args(policy_path, self.dir / "state", ADMIN_TOKEN, certs=certs, extra=extra)
        self.gateway = self._spawn(
            Child("gateway", cli("serve", *args), ready=SERVE_READY, detach=True)
        )
        assert self.gateway.match is not None
        gw_pid = self.gateway.pid
        bearer = b"authorization: Bearer " + BENCH_KEY.encode() + b"\r\n"
        gw_port = int(self.gateway.match.group(1).rsplit(":", 1)[1])
        self.targets["gateway"] = Arm("gateway", gw_port, client_tls, bearer, lambda: [gw_pid])
        if self.baseline_checkout is not None:
            self._start_baseline(self.baseline_checkout, policy_path, certs, client_tls, bearer)
        if self.want_relay:  # the bare relay (bare_relay.py): the floor of the Python stack
            self._start_relay("relay", pacer_port, certs, client_tls, bearer)
            self._start_relay("relay_json", pacer_port, certs, client_tls, bearer, "--json")
        if self.want_nginx:
            self._start_nginx(pacer_port, certs, client_tls, bearer)

    def _start_relay(
        self,
        name: str,
        pacer_port: int,
        certs: CertFiles,
        client_tls: ssl.SSLContext,
        bearer: bytes,
        *extra: str,
    ) -> None:
        upstream = f"http://127.0.0.1:{pacer_port}"
        args = ["--upstream", upstream, "--cert", str(certs.cert), "--key", str(certs.key), *extra]
        relay = self._spawn(
            Child(
                name,
                [sys.executable, "-m", "loadtests.bench.overhead.bare_relay", *args],
                ready=re.compile(r"bare relay listening on https://127\.0\.0\.1:(\d+)"),
                detach=True,
            )
        )
        assert relay.match is not None
        pid = relay.pid
        self.targets[name] = Arm(name, int(relay.match.group(1)), client_tls, bearer, lambda: [pid])

    def _start_baseline(
        self,
        checkout: Path,
        policy_path: Path,
        certs: CertFiles,
        client_tls: ssl.SSLContext,
        bearer: bytes,
    ) -> None:
        """`specrouter serve` from `checkout`, by this interpreter (this environment's
        dependencies): `-P` keeps the working directory off the path, PYTHONPATH puts the
        checkout first, so its `proxy` package is the one imported."""
        root = checkout.resolve()
        if not (root / "proxy" / "cli.py").is_file():
            raise RuntimeError(f"--baseline-gateway {checkout}: no proxy/cli.py there")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(root)}
        where = subprocess.run(
            [sys.executable, "-P", "-c", "import proxy; print(proxy.__file__)"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        if not Path(where).resolve().is_relative_to(root):
            raise RuntimeError(f"the baseline imports {where}, not the checkout {root}")
        self.baseline_module = where
        args = serve_args(policy_path, self.dir / "state-baseline", ADMIN_TOKEN, certs=certs)
        cmd = [sys.executable, "-P", "-m", "proxy.cli", "serve", *args]
        self.baseline = child = self._spawn(
            Child("baseline", cmd, ready=SERVE_READY, env=env, detach=True)
        )
        assert child.match is not None
        pid = child.pid
        port = int(child.match.group(1).rsplit(":", 1)[1])
        self.targets["baseline"] = Arm("baseline", port, client_tls, bearer, lambda: [pid])

    def _start_nginx(
        self, pacer_port: int, certs: CertFiles, client_tls: ssl.SSLContext, bearer: bytes
    ) -> None:
        binary = find_nginx()
        if binary is None:
            self.nginx_skipped = "no nginx binary (apt-get install nginx-light to compare)"
            return
        d = self.dir / "nginx"
        d.mkdir(exist_ok=True)
        for attempt in range(5):
            port = free_port()
            user = "user root;" if os.geteuid() == 0 else ""
            (d / "nginx.conf").write_text(
                NGINX_CONF.format(
                    d=d, user=user, upstream=pacer_port, port=port, cert=certs.cert, key=certs.key
                )
            )
            child = Child("nginx", [binary, "-p", str(d), "-c", str(d / "nginx.conf")], detach=True)
            self.children.append(child)
            child.start()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and child.alive():
                with (
                    contextlib.suppress(OSError),
                    socket.create_connection(("127.0.0.1", port), timeout=0.5),
                ):
                    break
                time.sleep(0.05)
            if child.alive():
                master = child.pid
                self.nginx = child
                self.targets["nginx"] = Arm("nginx", port, client_tls, bearer, _tree(master))
                return
            self.children.remove(child)
            if attempt == 4:
                self.nginx_skipped = "nginx did not start: " + "".join(child.output[-5:])
