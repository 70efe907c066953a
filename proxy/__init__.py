"""specrouter's gateway: TLS in front of vLLM engines, a per-request policy, a byte-exact relay.

The map (each folder one concern; a request's way through is ``relay/``, top to bottom):

    relay/      the public listener's request path: route, authenticate, decide, forward to an
                engine, relay its stream (push or pull), end it, measure it (its own docstring
                lists the modules in the order a request takes them)
    backends/   what the gateway knows about its engines: live state, health checks and states,
                admission queues, the sessions resident on each (session-aware admission),
                several engines per variant, guarded repair
    admin/      the admin listener: policy API and its store (versions, audit, rollback), status,
                the live dashboard and its static files
    record/     the request's record and measurement model, which relay/ writes and observe/
                reads (it imports neither)
    observe/    Prometheus metrics (every name defined once), the request log, statistics,
                OpenTelemetry GenAI spans and metrics (off unless --otlp-endpoint)
    ops/        offline commands: ``specrouter report``, ``demo``, ``deploy`` (plan, render,
                check), ``connect`` (an agent's settings for a gateway)

    cli.py      the ``specrouter`` command and its subcommands
    helptext.py their ``--help``: each option's default stated
    settings.py every server setting, once (flags, then SPECROUTER_* variables, then defaults)
    gateway.py  the state one gateway process shares between its listeners
    serve.py    ``specrouter serve``: listeners, signals (HUP reloads, TERM drains)
    servers.py  uvicorn on pre-bound sockets, with our guarded HTTP protocol
    accept.py   the listeners' accept loop: connections per source address and network
                capped before TLS
    drain_close.py a draining listener's TLS connections dropped once flushed, not held
                for a pooled client's `close_notify`
    plainhttp.py plain HTTP sent to the TLS listener: a 400 that says https, before any TLS
    body_budget.py request bodies' memory, bounded across the process and per client
    memory.py   memory given back to the system after large inputs (glibc's allocator)
    bounds.py   bounds on the numbers the gateway stores or counts (token counts, temperature)
    certs.py    the local CA and certificates for the demo and the tests
    auth.py     bearer keys: hashing and constant-time comparison
    throttle.py failed authentication throttled per source address and network
    safety.py   startup refusals: settings that would leave the admin API open
    operator.py the operator file: repair actions, engine secrets, the hosts engines may live on
    vllm_wire.py vLLM's wire facts (framing, error bodies, metric names), shared with the
                simulator, the probe and the soak

The policy itself (schema and the pure decision engine) lives in ``policies/``, which imports
nothing from here; the simulated GB10, the probe, the harness and the benchmarks in
``loadtests/``.
"""
