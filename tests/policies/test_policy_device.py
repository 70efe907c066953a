"""Backends declared on one device (`device:` per backend)."""

from __future__ import annotations

import copy

import pytest

from policies.schema import PolicyError, validate_policy
from policies.spec.backends import co_located
from tests.policies.test_policy_schema import BASE


def with_devices(**devices: str) -> dict[str, object]:
    doc = copy.deepcopy(BASE)
    for name, device in devices.items():
        doc["backends"][name]["device"] = device
    return doc


def test_backends_on_one_device() -> None:
    policy = validate_policy(with_devices(deep="gb10", mtp="gb10", emb="gb10-b"))
    assert policy.backends["deep"].device == "gb10"
    assert co_located(policy.backends) == {"gb10": ["deep", "mtp"]}


def test_no_device_is_a_device_of_its_own() -> None:
    policy = validate_policy(copy.deepcopy(BASE))
    assert policy.backends["deep"].device is None
    assert co_located(policy.backends) == {}


def test_device_name_is_checked() -> None:
    with pytest.raises(PolicyError) as caught:
        validate_policy(with_devices(deep="GB 10"))
    assert any("backends.deep.device" in e for e in caught.value.errors), caught.value.errors
