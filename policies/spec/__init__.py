"""The policy document's pydantic models, one module per part of the YAML.

    base        PolicyError, the strict base model, shared field patterns and defaults checks
    backends    backends: engines, their speculative configuration, guarded repair
    context     what the operator lets a policy name (actions, secrets, engine hosts)
    rules       a route's rules (load, content, sampling, canary, client, guard, health)
    routes      routes: models, variants, defaults, clamps, rules
    clients     clients: keys, defaults, limits
    document    the whole document (backends, routes, clients, admission, guard, health)
    references  the cross-reference checks the models alone cannot make

Parsing and loading are in policies.loading; policies.schema gathers the public names.
"""
