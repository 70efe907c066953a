"""The public request path, module by module in the order a streaming request goes through it:

- app.py: routing, authentication, client limits, the body read, the policy decision.
- fields.py: the request fields, described once for the OpenAPI document and the checks.
- body_shape.py: the body's containers, nesting and integers, checked in C; the containers'
  JSON kept for the upstream body.
- models_list.py: GET /v1/models, each name's context window and the first-token limit.
- exchange.py: `Exchange`, the one object that carries the request along the path, its state
  grouped by the phase that writes it (`Arrival`, `Decided`, `EngineLink`, `StreamRelay` |
  `PlainBody`).
- context.py: `Services`, what the path uses of the gateway's shared state, typed (the
  gateway is one; the path does not import it).
- forward.py: attempts, admission, the engine lease, retries before the first byte, the
  response start, the continuation of a stream broken mid-answer.
- hold.py: session-aware admission: a session's turn goes, moves where that pays, or waits
  (pinged, first come first served) for its engine's KV cache.
- lease.py: `Lease`, a request's hold on one engine.
- deadlines.py: timeouts of one length on one timer (an engine's first byte, a last write).
- keepalive.py: the response headers and pings while no engine byte came (a route's
  `keepalive_s`).
- stream_core.py: one relayed event stream's logic without I/O (frames, its end, failures and
  their error events, the silence limit, pings); push.py and pull.py drive it.
- push.py | pull.py: the body relayed from the engine's read callback | by an async pull loop.
- ends.py: how a relayed event stream ends (its end event, the last bytes, the outcome).
- watch.py: `DisconnectWatch`, the client's leaving turned into an upstream abort.
- continuation.py: a stream broken mid-answer, finished by another variant: the filter and
  the plan (which engine next, what is resent, what the client has seen).
- engine_conn.py | upstream.py: kept-alive engine connections (push) | the aiohttp client
  (pull), both answering with an `UpstreamResponse`.
- measure.py: the stream filter, which reads (and trims) each relayed frame into the
  request's measurement (proxy/record/).
- events.py: readers of typed event streams (/v1/responses, /v1/messages) for the filter.
- llamacpp.py: llama.cpp's per-request figures, read from the bytes it sends anyway.
- sglang.py | sglang_stream.py: SGLang's per-request figures and what the gateway asked cut
  back out | its stream filter.
- sse.py, rewrite.py: event-stream framing; the upstream request body.
- adapt.py: named adaptations of the body for an engine that refuses part of it (counted).
- owned.py: the session vLLM tags a request's KV blocks with, the gateway's; the engine-
  steering `vllm_xargs` keys refused.

Beside the path: asgi.py (ASGI types and one-shot answers), ready.py (readiness), channel.py (`PushChannel`, the
client's connection for the push relay), errors.py (error bodies), required.py (the
Messages field the field list cannot require), limits.py (client rate limits), turnstate.py
(Codex's `x-codex-turn-state` tokens), tracecontext.py (the trace headers engines get, bounded),
openapi.py and openapi_schemas.py (the served API
description, its schemas).
"""
