"""The public API's OpenAPI description, served at /openapi.json on the public listener."""

from __future__ import annotations

from typing import Any

import orjson

SPEC: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {"title": "specrouter public API", "version": "1"},
    "paths": {},
}


def spec_bytes() -> bytes:
    return orjson.dumps(SPEC)
