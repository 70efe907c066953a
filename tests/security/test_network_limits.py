"""Limits by network, counted in process (the listeners stay on loopback, so IPv6 networks are
replayed here): connections per address and per /24 or /64 (proxy/accept.py), and the failed
authentication throttle, whose network count never refuses a right key (proxy/throttle.py).
"""

from __future__ import annotations

import pytest

from proxy.accept import SourceCap
from proxy.throttle import NETWORK_FACTOR, AuthThrottle, network_of

V6 = "2001:db8:0:7"  # one host's /64


def _admitted(cap: SourceCap, sources: list[str]) -> list[bool]:
    return [cap.admit(s) for s in sources]


@pytest.mark.parametrize(
    ("same_net", "other_net"),
    [
        ([f"10.1.2.{i}" for i in range(1, 10)], "10.1.3.1"),
        ([f"{V6}::{i:x}" for i in range(1, 10)], "2001:db8:0:8::1"),
        ([f"::ffff:10.1.2.{i}" for i in range(1, 10)], "::ffff:10.1.3.1"),  # dual-stack
    ],
    ids=["ipv4-24", "ipv6-64", "ipv4-mapped"],
)
def test_addresses_of_one_network_cannot_fill_the_listener(
    same_net: list[str], other_net: str
) -> None:
    """The finding: idle connections from nine addresses of one /24 held every place (an
    IPv6 host has a /64). Nine addresses under their own limit of 4 stop at the network's 10."""
    cap = SourceCap(4, 10)
    admitted = _admitted(cap, [s for s in same_net for _ in range(4)])
    assert sum(admitted) == 10 and cap.refused == 26
    assert cap.admit(other_net)  # another network: its own count
    cap.release(same_net[0])  # a place given back is the network's again
    assert cap.admit(same_net[8]) and not cap.admit(same_net[8])


def test_an_address_keeps_its_own_limit_under_the_network_limit() -> None:
    cap = SourceCap(4, 10)
    assert _admitted(cap, ["10.1.2.1"] * 5) == [True] * 4 + [False]
    for _ in range(4):
        cap.release("10.1.2.1")
    assert cap.open == {}  # nothing kept for sources with nothing open


def test_network_of_groups_ipv4_mapped_addresses_by_their_ipv4_network() -> None:
    assert network_of("::ffff:192.0.2.7") == network_of("192.0.2.9") == "net:192.0.2.0/24"
    assert network_of(f"{V6}::1") == network_of(f"{V6}:ffff::2") == f"net:{V6}::/64"
    assert network_of("not an address") is None


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("net", ["10.9.8", f"{V6}:"], ids=["ipv4-24", "ipv6-64"])
def test_others_failures_on_a_network_never_refuse_a_right_key(net: str) -> None:
    """The finding: 80 failures from nine addresses of a /24 locked every address of it out,
    a client with the right key included (the same throttle guards the admin listener and the
    dashboard's login). The network's count now refuses only addresses that failed themselves."""
    clock = Clock()
    throttle = AuthThrottle(10, listener="public", clock=clock)
    limit = 10 * NETWORK_FACTOR
    attackers = [f"{net}.{i}" if "." in net else f"{net}:{i:x}" for i in range(1, 10)]
    for n in range(limit):  # 80 failures, under 10 from each of nine addresses
        throttle.failed(attackers[n % 9])
    fresh = f"{net}.200" if "." in net else f"{net}:c8"
    assert throttle.retry_after(fresh) is None  # a right key from it is checked, and served
    assert all(1 <= (throttle.retry_after(a) or 0) <= 60 for a in attackers)
    throttle.failed(fresh)  # its one guess, wrong: now it waits too
    assert throttle.retry_after(fresh) is not None
    clock.now += 61  # the window passed: everyone may try again
    assert all(throttle.retry_after(a) is None for a in [*attackers, fresh])


def test_an_address_over_its_own_limit_is_refused_whatever_its_network() -> None:
    throttle = AuthThrottle(10, listener="admin", clock=Clock())
    for _ in range(10):
        throttle.failed("10.9.9.1")
    assert throttle.retry_after("10.9.9.1") is not None
    assert throttle.retry_after("10.9.9.2") is None
