"""The Grafana dashboard checked for real: every panel's PromQL through a real Prometheus.

Debian's `prometheus` runs on loopback and scrapes the real gateway's admin /metrics every
second, while the gateway serves simulated streaming load from two simulated vLLM engines
(faults, a client disconnect and an admission queue included, so that error and queue panels
have series). Then each query of each panel must parse and return data.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from loadtests.harness.gateway import GatewayServer, coder_policy
from loadtests.harness.ports import free_port
from loadtests.harness.sim import SimServer
from proxy.certs import CertFiles

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "specrouter.json"
DATASOURCES = DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yaml"
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
SERVED = "qwen3.8-27b"
DFLASH, MTP = "coder-dflash7", "coder-mtp3"

needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None or PROMTOOL is None,
    reason="Debian's prometheus is installed by `make test` (scripts/system-deps.sh)",
)

# Grafana's variables, as the test evaluates them: every variable matches everything.
_GRAFANA_VARS = {"$__rate_interval": "1m", "$__range": "1m", "$__interval": "5s"}


def panel_queries(dashboard: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(panel title, refId, expression) for every query of every panel, rows' panels included."""
    out: list[tuple[str, str, str]] = []
    stack = list(dashboard["panels"])
    while stack:
        panel = stack.pop(0)
        stack.extend(panel.get("panels", []))
        for target in panel.get("targets", []):
            out.append((panel["title"], target["refId"], target["expr"]))
    return out


def concrete(expr: str) -> str:
    for name, value in _GRAFANA_VARS.items():
        expr = expr.replace(name, value)
    expr = re.sub(r"\$\{\w+(:\w+)?\}|\$\w+", ".*", expr)
    assert "$" not in expr, expr
    return expr


# -- the dashboard's structure (no Prometheus needed) ----------------------------------------------


def test_dashboard_json_is_well_formed() -> None:
    dash = json.loads(DASHBOARD.read_text())
    uid = yaml.safe_load(DATASOURCES.read_text())["datasources"][0]["uid"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert {"route", "variant", "canary", "baseline"} <= variables
    for panel in dash["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == uid, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            used = set(re.findall(r"\$(\w+)", target["expr"])) - {"__rate_interval", "__range"}
            assert used <= variables, (panel["title"], used)
    # The panels the dashboard must have, by the metrics they read.
    exprs = " ".join(e for _, _, e in panel_queries(dash))
    for needle in (
        "specrouter_ttft_seconds_bucket",
        "specrouter_itl_seconds_bucket",
        "specrouter_spec_accepted_tokens_total",
        "specrouter_spec_steps_total",
        "specrouter_backend_spec_accepted_tokens_total",
        "specrouter_backend_spec_accepted_tokens_per_pos_total",
        "specrouter_in_flight",
        "specrouter_queued",
        "specrouter_defaults_applied_total",
        "specrouter_upstream_errors_total",
        "specrouter_client_disconnects_total",
        "specrouter_decisions_total",
        'backend=~"$canary"',
        'backend=~"$baseline"',
        "specrouter_backend_kv_cache_usage",
        "specrouter_backend_prefix_cache_hits",
    ):
        assert needle in exprs, needle


# -- a real Prometheus ----------------------------------------------------------------------------


class Prometheus:
    def __init__(self, target: str) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="specrouter-prom-")
        self.dir = Path(self._tmp.name)
        self.config = self.dir / "prometheus.yml"
        self.config.write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "scrape_configs": [
                        {
                            "job_name": "specrouter",
                            "metrics_path": "/metrics",
                            "static_configs": [{"targets": [target]}],
                        }
                    ],
                }
            )
        )
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = self.dir / "prometheus.log"

    def __enter__(self) -> Prometheus:
        assert PROMETHEUS is not None
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={self.config}",
                    f"--storage.tsdb.path={self.dir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--storage.tsdb.retention.time=1h",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("prometheus exited:\n" + self.log.read_text())
            try:
                if httpx.get(self.url + "/-/ready", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.__exit__()
        raise RuntimeError("prometheus did not become ready:\n" + self.log.read_text())

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._tmp.cleanup()

    def query(self, expr: str) -> dict[str, Any]:
        resp = httpx.get(self.url + "/api/v1/query", params={"query": expr}, timeout=10)
        body: dict[str, Any] = resp.json()
        return body

    def wait_for(self, expr: str, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            body = self.query(expr)
            if body.get("status") == "success" and body["data"]["result"]:
                return
            time.sleep(0.2)
        raise AssertionError(f"no data for {expr} after {timeout} s")


def test_promtool_checks_the_deployed_config() -> None:
    if PROMTOOL is None:
        pytest.skip("promtool is installed by `make test` (scripts/system-deps.sh)")
    out = subprocess.run(
        [PROMTOOL, "check", "config", str(DEPLOY / "prometheus" / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.fixture
def loaded_stack(certs: CertFiles) -> Iterator[tuple[Prometheus, GatewayServer]]:
    with (
        SimServer(
            "dflash7-prob-block", served_model_name=SERVED, time_scale=0.05, spec_metrics="summary"
        ) as dflash,
        SimServer("mtp3", served_model_name=SERVED, time_scale=0.05, spec_metrics="summary") as mtp,
    ):
        policy = coder_policy(
            {DFLASH: dflash.url, MTP: mtp.url},
            rules=[{"name": "canary-mtp3", "kind": "canary", "use": MTP, "percent": 50}],
        )
        policy["backends"][MTP]["max_concurrency"] = 2  # so that some requests queue
        with (
            GatewayServer(policy, certs=certs) as gw,
            Prometheus(urlsplit(gw.admin).netloc) as prom,
        ):
            prom.wait_for('up{job="specrouter"} == 1')
            _drive(gw, dflash)
            yield prom, gw


def _stream(gw: GatewayServer, body: dict[str, Any], pin: str | None = None) -> None:
    headers = {"x-specrouter-variant": pin} if pin else {}
    with (
        gw.client() as c,
        c.stream(
            "POST",
            "/v1/chat/completions",
            headers=headers,
            json={"model": "coder", "stream": True, **body},
        ) as r,
    ):
        r.read()


def _drive(gw: GatewayServer, dflash: SimServer) -> None:
    messages = [{"role": "user", "content": "Write a Python function that parses a CSV line."}]
    # An upstream error retried on the other engine before the first byte.
    dflash.fault("http_500", count=1)
    with gw.client() as c:
        r = c.post(
            "/v1/chat/completions",
            headers={"x-specrouter-variant": DFLASH},
            json={"model": "coder", "messages": messages, "max_tokens": 8},
        )
        assert r.status_code in (200, 500, 502, 503), r.text
    dflash.clear_faults()
    # Streams on both variants, some without a temperature (the route's default applies),
    # four at once on the variant admitted two at a time (the others queue).
    jobs: list[tuple[dict[str, Any], str | None]] = []
    for i in range(4):
        jobs.append(({"messages": messages, "max_tokens": 60, "seed": i}, MTP))
        jobs.append(
            (
                {
                    "messages": messages,
                    "max_tokens": 60,
                    "seed": 10 + i,
                    **({"temperature": 0.7} if i % 2 else {}),
                },
                DFLASH if i % 2 else None,
            )
        )
    threads = [threading.Thread(target=_stream, args=(gw, body, pin)) for body, pin in jobs]
    for t in threads:
        t.start()
    # A client that goes away mid-stream.
    with (
        gw.client() as c,
        c.stream(
            "POST",
            "/v1/chat/completions",
            json={"model": "coder", "stream": True, "messages": messages, "max_tokens": 2000},
        ) as r,
    ):
        chunks = r.iter_raw()
        for _ in range(3):
            next(chunks)
    for t in threads:
        t.join(timeout=30)
        assert not t.is_alive()


@needs_prometheus
@pytest.mark.timeout(60)
def test_every_panel_query_parses_and_returns_data(
    loaded_stack: tuple[Prometheus, GatewayServer],
) -> None:
    prom, gw = loaded_stack
    started = time.monotonic()
    dash = json.loads(DASHBOARD.read_text())
    queries = panel_queries(dash)
    assert len(queries) >= 20
    # The load's last counters must have been scraped at least twice for rate() to see them.
    prom.wait_for("specrouter_client_disconnects_total")
    prom.wait_for("specrouter_upstream_errors_total")
    prom.wait_for('count_over_time(specrouter_requests_total{outcome="client_gone"}[1m]) > 2')
    failures: list[str] = []
    pending = {(title, ref): concrete(expr) for title, ref, expr in queries}
    deadline = time.monotonic() + 15
    while pending:
        for key, expr in list(pending.items()):
            body = prom.query(expr)
            if body.get("status") != "success":
                failures.append(f"{key[0]} [{key[1]}]: {body.get('error')}: {expr}")
                del pending[key]
            elif body["data"]["result"]:
                del pending[key]
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    failures += [f"{title} [{ref}]: no data: {expr}" for (title, ref), expr in pending.items()]
    assert not failures, "\n".join(failures) + "\n\ngateway metrics:\n" + gw.metrics()
    assert time.monotonic() - started < 40
