"""Readiness: every route has a variant that is up (or not yet scraped), and no drain."""

from __future__ import annotations

from proxy.relay.context import Services


def readiness(gw: Services) -> tuple[bool, dict[str, bool]]:
    """(ready, per route: whether a variant is up). The public /readyz gives only the first;
    the per-route detail is the admin listener's (/admin/readyz)."""
    state = gw.live.snapshot()
    routes = {
        name: any(
            state.backends.get(b) is None or state.backends[b].health == "up"
            for b in route.variants
        )
        for name, route in gw.policy.current.document.routes.items()
    }
    return all(routes.values()) and not gw.draining, routes
