"""`specrouter serve`: the gateway process (public listener + admin listener, one loop)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import ssl
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from policies.compiled import CompiledPolicy, compile_policy
from policies.schema import PolicyError, load_policy
from proxy.admin.app import create_admin_app
from proxy.admin.dashboard import dashboard_routes
from proxy.admin.policy_api import policy_routes
from proxy.admin.policy_store import PolicyStore
from proxy.backends.health import HealthMonitor
from proxy.certs import server_context
from proxy.gateway import Gateway
from proxy.memory import Trimmer, tune_allocator
from proxy.observe.accesslog import access_sink
from proxy.observe.metrics_app import create_metrics_app
from proxy.observe.requestlog import RequestLog
from proxy.operator import Operator, OperatorError, load_operator
from proxy.ops.deploy.plan import deployed_kv_tokens
from proxy.relay.app import PublicApp
from proxy.safety import UnsafeSettings, check_startup
from proxy.servers import bind, make_server, url_of
from proxy.settings import Settings, is_loopback, split_hostport

if TYPE_CHECKING:
    from proxy.observe.otel import Telemetry

log = logging.getLogger("specrouter")


def _default(name: str) -> str:
    """A setting's default, as help says it (settings.py is its one source)."""
    value = Settings.model_fields[name].default
    return f"default {value:g}" if isinstance(value, float) else f"default {value}"


def parse_args(argv: list[str]) -> Settings:
    p = argparse.ArgumentParser(prog="specrouter serve", description=__doc__)
    p.add_argument("--config", type=Path, help=f"the policy file ({_default('config')})")
    p.add_argument("--listen", help="public host:port (default 0.0.0.0:8443)")
    p.add_argument("--admin-listen", help="admin host:port (default 127.0.0.1:9443)")
    p.add_argument("--tls-cert", type=Path, help="server certificate chain (PEM)")
    p.add_argument("--tls-key", type=Path, help="its private key (PEM)")
    p.add_argument(
        "--insecure-http",
        action="store_true",
        default=None,
        help="plain HTTP on the public listener (loopback only)",
    )
    p.add_argument(
        "--admin-token",
        action="append",
        metavar="[NAME=]TOKEN",
        help="an admin token (repeatable); the audit log records its NAME (default: admin)",
    )
    p.add_argument(
        "--admin-tls",
        action="store_true",
        default=None,
        help="serve the admin listener over TLS (same certificate)",
    )
    p.add_argument(
        "--admin-client-ca", type=Path, help="require admin client certificates signed by this CA"
    )
    p.add_argument("--dashboard-token", help="read-only token for the dashboard")
    p.add_argument(
        "--scrape-token", help="read-only token /metrics on the admin listener then requires"
    )
    p.add_argument(
        "--dashboard-session",
        dest="dashboard_session_s",
        type=float,
        help="seconds a dashboard login lasts (default 43200: 12 h)",
    )
    p.add_argument(
        "--auth-failures-per-minute",
        type=int,
        help="failed authentications per source and minute before 429 (default 10; 0: no limit)",
    )
    p.add_argument(
        "--operator-file",
        type=Path,
        help="operator-defined repair actions, engine secrets and engine hosts",
    )
    p.add_argument(
        "--metrics-listen",
        help="host:port of a plain-HTTP /metrics listener for Prometheus (loopback)",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        help=f"request log, policy versions, audit log ({_default('state_dir')})",
    )
    p.add_argument(
        "--access-log",
        action="store_true",
        default=None,
        help="one line per finished request on stderr (no prompt or completion)",
    )
    p.add_argument(
        "--otlp-endpoint",
        help="OTLP/HTTP collector base URL (http://host:4318): OpenTelemetry GenAI spans and "
        "metrics, and `traceparent` sent to engines (default: off)",
    )
    p.add_argument(
        "--otlp-metrics-interval",
        dest="otlp_metrics_interval_s",
        type=float,
        help="seconds between exports of the GenAI metrics (default 10)",
    )
    flush_s, pull_s = (
        Settings.model_fields[f].default for f in ("session_flush_s", "session_pull_s")
    )
    p.add_argument(
        "--redis-url",
        help="redis://host:port/db: client limits and the session table shared by replicas "
        "(a session's row reaches the others within flush + pull interval: "
        f"{flush_s + pull_s:g} s by default)",
    )
    p.add_argument("--redis-prefix", help="prefix of the gateway's Redis keys (default specrouter)")
    p.add_argument(
        "--session-flush-interval",
        dest="session_flush_s",
        type=float,
        help=f"seconds between sends of local session changes to Redis (default {flush_s:g})",
    )
    p.add_argument(
        "--session-pull-interval",
        dest="session_pull_s",
        type=float,
        help=f"seconds between reads of other replicas' session changes (default {pull_s:g})",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        help=f"larger request bodies get 413 ({_default('max_body_bytes')})",
    )
    p.add_argument(
        "--first-byte-timeout",
        dest="first_byte_timeout_s",
        type=float,
        help="seconds an engine may take to its first output (its head, then a token: the prefill)"
        f" ({_default('first_byte_timeout_s')})",
    )
    p.add_argument(
        "--idle-timeout",
        dest="idle_timeout_s",
        type=float,
        help=f"seconds between two chunks after the first output ({_default('idle_timeout_s')})",
    )
    p.add_argument(
        "--header-timeout",
        dest="header_timeout_s",
        type=float,
        help=f"seconds a client has to send its request head: 408 after "
        f"({_default('header_timeout_s')})",
    )
    p.add_argument(
        "--body-timeout",
        dest="body_timeout_s",
        type=float,
        help=f"seconds a client has to send its request body: 408 after "
        f"({_default('body_timeout_s')})",
    )
    p.add_argument(
        "--scrape-interval",
        dest="scrape_interval_s",
        type=float,
        help=f"seconds between reads of each engine's /metrics and /health "
        f"({_default('scrape_interval_s')})",
    )
    p.add_argument("--relay", choices=("push", "pull"), help="stream relay (default push)")
    p.add_argument(
        "--drain-timeout",
        dest="drain_timeout_s",
        type=float,
        help="on SIGTERM, seconds streams in flight may still run (default 20)",
    )
    args = {k: v for k, v in vars(p.parse_args(argv)).items() if v is not None}
    return Settings(**args)


def load_compiled(path: Path, operator: Operator | None = None) -> CompiledPolicy:
    return compile_policy(load_policy(path, (operator or Operator()).context))


def tls_context(settings: Settings) -> ssl.SSLContext | None:
    host, _ = split_hostport(settings.listen)
    if settings.tls_cert and settings.tls_key:
        return server_context(settings.tls_cert, settings.tls_key)
    if settings.insecure_http:
        if not is_loopback(host):
            raise SystemExit("specrouter: --insecure-http is for loopback listeners only")
        return None
    raise SystemExit(
        "specrouter: no TLS certificate (--tls-cert/--tls-key); "
        "pass --insecure-http to serve plain HTTP on loopback"
    )


def admin_tls_context(settings: Settings) -> ssl.SSLContext | None:
    if not (settings.admin_tls or settings.admin_client_ca):
        return None
    if not (settings.tls_cert and settings.tls_key):
        raise SystemExit("specrouter: the admin listener's TLS needs --tls-cert/--tls-key")
    return server_context(settings.tls_cert, settings.tls_key, settings.admin_client_ca)


class GatewayProcess:
    """Owns the servers and the signals: HUP reloads certificate and policy, TERM drains."""

    def __init__(
        self, settings: Settings, policy: CompiledPolicy, operator: Operator | None = None
    ) -> None:
        self.settings = settings
        self.gw = Gateway(settings, policy, operator)
        self.gw.kv_of = deployed_kv_tokens  # session-aware admission's last word on KV
        self.monitor = HealthMonitor(self.gw)
        self.ssl = tls_context(settings)
        self.admin_ssl = admin_tls_context(settings)
        self.store = PolicyStore(
            self.gw.policy,
            settings.config,
            settings.state_dir,
            settings.document_limits(),
            events=self.gw.events,
        )
        self._tasks: set[asyncio.Task[Any]] = set()
        self.telemetry: Telemetry | None = None

    def reload(self) -> None:
        if self.ssl is not None and self.settings.tls_cert and self.settings.tls_key:
            try:
                # New handshakes use the renewed certificate; open connections keep theirs.
                for ctx in (self.ssl, self.admin_ssl):
                    if ctx is not None:
                        ctx.load_cert_chain(str(self.settings.tls_cert), str(self.settings.tls_key))
                log.warning("reloaded TLS certificate %s", self.settings.tls_cert)
            except (OSError, ssl.SSLError) as exc:
                log.error("certificate reload failed, keeping the current one: %s", exc)
        self._spawn(self.store.poll(force=True))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _end_streams_after(self, seconds: float) -> None:
        """SIGTERM: streams in flight get `seconds` to finish, then an error event each."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while self.gw.watches and loop.time() < deadline:
            await asyncio.sleep(0.05)
        for watch in list(self.gw.watches.values()):
            watch.close_upstream("the gateway is shutting down")

    async def _watch_policy_file(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            try:
                await self.store.poll()
            except Exception:  # one bad edit must not end the watch: later edits still apply
                log.exception("policy file watch: the edit could not be read; watching on")

    async def run(self) -> None:
        s = self.settings
        pub_host, pub_port = split_hostport(s.listen)
        adm_host, adm_port = split_hostport(s.admin_listen)
        per_source, per_network = s.max_connections_per_source, s.max_connections_per_network
        pub_sock = bind(pub_host, pub_port, per_source=per_source, per_network=per_network)
        adm_sock = bind(adm_host, adm_port, per_source=per_source, per_network=per_network)
        drain_s = self.settings.drain_timeout_s
        # uvicorn's own deadline comes after ours, so streams end with an error event, not a cut.
        public = make_server(
            PublicApp(self.gw),
            ssl_context=self.ssl,
            graceful_s=int(drain_s) + 5,
            header_timeout_s=s.header_timeout_s,
            handshake_timeout_s=s.tls_handshake_timeout_s,
            max_connections=s.max_connections,
            keep_alive_s=s.keep_alive_s,
            keep_alive_unauthenticated_s=s.keep_alive_unauthenticated_s,
        )
        routes = [
            *policy_routes(self.gw, self.store),
            *dashboard_routes(self.gw, self.monitor, self.store),
        ]
        admin = make_server(
            create_admin_app(self.gw, routes), graceful_s=5, ssl_context=self.admin_ssl
        )
        servers = [(public, pub_sock), (admin, adm_sock)]
        if s.metrics_listen is not None:
            servers.append(
                (
                    make_server(create_metrics_app(self.gw), graceful_s=1),
                    bind(*split_hostport(s.metrics_listen)),
                )
            )
        loop = asyncio.get_running_loop()

        def stop() -> None:
            if self.gw.draining:
                for server, _ in servers:
                    server.force_exit = True  # a second signal: now
                return
            self.gw.draining = True
            for server, _ in servers:
                server.should_exit = True
            self._spawn(self._end_streams_after(drain_s))

        loop.add_signal_handler(signal.SIGHUP, self.reload)
        loop.add_signal_handler(signal.SIGTERM, stop)
        loop.add_signal_handler(signal.SIGINT, stop)
        self.requestlog = RequestLog(
            self.settings.state_dir / "requests.sqlite3",
            dropped_counter=self.gw.metrics.requestlog_dropped,
        )
        self.gw.sinks.append(self.requestlog.sink)
        if self.settings.access_log:
            self.gw.sinks.append(access_sink)
        if self.settings.otlp_endpoint:
            # Imported only when on: the SDK, protobuf and requests add ~0.1 s to every start.
            from proxy.observe.otel import Telemetry

            self.telemetry = Telemetry(
                self.settings.otlp_endpoint,
                self.gw.policy,
                metrics_interval_s=self.settings.otlp_metrics_interval_s,
            )
            self.gw.begin = self.telemetry.begin
            self.gw.sinks.append(self.telemetry.sink)
        await self.requestlog.start()
        self.monitor.start()
        self.gw.start()
        self._spawn(self._watch_policy_file())
        # Freed memory back to the system after bursts (proxy/memory.py).
        self._spawn(Trimmer(lambda: not self.gw.in_flight).run())
        scheme = "http" if self.ssl is None else "https"
        admin_scheme = "http" if self.admin_ssl is None else "https"
        metrics = "".join(f" metrics {url_of(sock, 'http')}" for _, sock in servers[2:])
        print(
            f"specrouter listening on {url_of(pub_sock, scheme)} "
            f"admin {url_of(adm_sock, admin_scheme)}{metrics}",
            flush=True,
        )
        try:
            await asyncio.gather(*(server.serve([sock]) for server, sock in servers))
        finally:
            for task in list(self._tasks):
                task.cancel()
            await self.monitor.stop()
            await self.requestlog.stop()
            await self.gw.aclose()
            if self.telemetry is not None:
                await _stop_telemetry(self.telemetry)


async def _stop_telemetry(telemetry: Telemetry) -> None:
    """Export what is pending, within a bound: a collector that is down does not hold the exit.
    A daemon thread of its own, since the loop's executor is waited for at exit."""
    done = threading.Event()

    def stop() -> None:
        telemetry.shutdown()
        done.set()

    threading.Thread(target=stop, name="otel-shutdown", daemon=True).start()
    if not await asyncio.to_thread(done.wait, telemetry.shutdown_s):
        log.warning("OpenTelemetry: the collector did not take the last export in time")


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    settings = parse_args(argv)
    tune_allocator()  # large buffers reused, given back by the Trimmer after bursts
    try:
        check_startup(settings)
        operator = load_operator(settings.operator_file)
    except (UnsafeSettings, OperatorError) as exc:
        print(f"specrouter: refusing to start: {exc}", file=sys.stderr)
        return 2
    try:
        policy = load_compiled(settings.config, operator)
    except PolicyError as exc:
        print(f"specrouter: invalid config {settings.config}:\n{exc}", file=sys.stderr)
        return 2
    process = GatewayProcess(settings, policy, operator)
    try:
        import uvloop

        uvloop.run(process.run())
    except ImportError:
        asyncio.run(process.run())
    return 0
