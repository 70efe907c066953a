"""The policy document's pydantic models, one module per part of the YAML.

    admission   admission: the queue's timeout, session-aware admission
    base        PolicyError, the strict base model, shared field patterns and defaults checks
    backends    backends: engines, their speculative configuration, guarded repair
    kv_events   a vLLM backend's KV cache events: the gateway's endpoint, the engine's replay
    context     what the operator lets a policy name (actions, secrets, engine hosts)
    rules       a route's rules (load, content, sampling, canary, client, guard, health)
    routes      routes: models, variants, defaults, clamps, rules
    clients     clients: keys, defaults, limits
    sessions    sessions: stickiness of a session to the engine holding its prefix
    fairness    fairness: the vLLM priority of admitted sessions' requests
    deployment  engine launch settings (vLLM release, max-model-len, parsers) and memory knobs
    document    the whole document (backends, routes, clients, admission, guard, health,
                deployment)
    references  the cross-reference checks the models alone cannot make

Parsing and loading are in policies.loading; policies.schema gathers the public names.
"""
