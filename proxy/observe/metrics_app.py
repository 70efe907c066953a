"""The optional metrics listener (`--metrics-listen`): `/metrics` alone, for Prometheus, on
loopback, so scraping needs neither the admin listener nor its token."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from proxy.gateway import Gateway


def create_metrics_app(gw: Gateway) -> Starlette:
    async def metrics(_: Request) -> Response:
        return Response(generate_latest(gw.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return Starlette(routes=[Route("/metrics", metrics)])
