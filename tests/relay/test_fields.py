"""The public request fields: one description for the OpenAPI document and the gateway's checks."""

from __future__ import annotations

import pytest

from proxy.relay.app import ENDPOINTS
from proxy.relay.fields import FIELDS, check_fields
from proxy.relay.openapi import build_spec, spec


@pytest.mark.parametrize("endpoint", sorted(FIELDS))
@pytest.mark.parametrize(("body", "expected"), [
    ([], ("request body must be a JSON object", None)),
    (None, ("request body must be a JSON object", None)),
    ({}, ("`model` is required and must be a string", "model")),
    ({"model": ""}, ("`model` is required and must be a string", "model")),
    ({"model": 7}, ("`model` is required and must be a string", "model")),
    ({"model": None}, ("`model` is required and must be a string", "model")),
    ({"model": "coder"}, None),
    # Everything else is the backend's to judge.
    ({"model": "coder", "messages": 5, "n": "two"}, None),
])
def test_check_fields(endpoint, body, expected) -> None:
    assert check_fields(endpoint, body) == expected


def test_the_document_covers_the_route_table_with_the_same_fields() -> None:
    doc = spec()
    assert doc is spec()  # built once
    schemas = doc["components"]["schemas"]
    for path, endpoint in ENDPOINTS.items():
        ref = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        body = schemas[ref["$ref"].rsplit("/", 1)[1]]
        assert list(body["properties"]) == [f.name for f in FIELDS[endpoint]]
        assert body["required"] == [f.name for f in FIELDS[endpoint] if f.required]
        assert body["properties"]["model"] == {**FIELDS[endpoint][0].schema()}
        assert body["properties"]["model"]["minLength"] == 1
    # A route table without an endpoint describes no such path.
    partial = build_spec({"/v1/embeddings": "embeddings"})
    assert "/v1/chat/completions" not in partial["paths"]
    assert "ChatCompletionRequest" not in partial["components"]["schemas"]
