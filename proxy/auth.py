"""Client and admin authentication: bearer keys, stored and compared as SHA-256 digests."""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

C = TypeVar("C")
# Credentials that named a client, kept with it (`Clients`): a deployment has a handful of keys;
# the bound only caps what spellings of valid keys (whitespace, case of `Bearer`) could grow.
KNOWN_CREDENTIALS = 256

# `NAME=TOKEN` names a token; anything else is a token named by the caller's default.
_NAMED = re.compile(r"([A-Za-z][A-Za-z0-9_.-]{0,63})=([^=].*)", re.DOTALL)


def hash_key(key: str) -> str:
    """The form a key is stored in (policy `key_sha256`): hex SHA-256 of its UTF-8 bytes."""
    return hashlib.sha256(key.encode()).hexdigest()


def header_text(value: bytes) -> str:
    """A header value as the text the client meant: UTF-8 (as keys are stored, `hash_key`),
    latin-1 where it is not UTF-8. Decoded as latin-1 alone, a non-ASCII key could never
    match its own digest."""
    try:
        return value.decode()
    except UnicodeDecodeError:
        return value.decode("latin-1")


def bearer(authorization: bytes | None) -> str | None:
    """The token of an `Authorization: Bearer TOKEN` header, or None."""
    if not authorization:
        return None
    scheme, _, token = header_text(authorization).partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def client_key(authorization: bytes | None, x_api_key: bytes | None) -> str | None:
    """The key a client presents: `Authorization: Bearer KEY` or, as the Anthropic SDKs send it,
    `x-api-key: KEY`. None when neither, or when both are sent with different keys (ambiguous:
    refused rather than guessed)."""
    token = bearer(authorization)
    api_key = header_text(x_api_key).strip() if x_api_key else None
    if token is not None and api_key and not hmac.compare_digest(token.encode(), api_key.encode()):
        return None
    return token or api_key or None


def named_token(value: str, default: str) -> tuple[str, str]:
    """(name, token) of a `NAME=TOKEN` setting; a bare token (base64 padding included) is
    named `default`."""
    match = _NAMED.fullmatch(value)
    return (match.group(1), match.group(2)) if match else (default, value)


def token_name(token: str | None, digests: Mapping[str, str]) -> str | None:
    """The name whose digest the token matches, comparing against every one (no early exit,
    so the time taken says nothing about which name, if any, matched)."""
    if token is None:
        return None
    presented = hash_key(token)
    found = None
    for name, digest in digests.items():
        if hmac.compare_digest(presented, digest) and found is None:
            found = name
    return found


class Clients(Generic[C]):
    """The client a request's credential headers name, by `lookup(key_sha256)`, remembered per
    credential for the policy it was found in: a kept-alive agent sends the same header on every
    request, and its parse and SHA-256 are then done once, not per request. Only credentials that
    name a client are kept (a wrong key is hashed every time, as the throttle counts it)."""

    __slots__ = ("_owner", "_known")

    def __init__(self) -> None:
        self._owner: object = None
        self._known: dict[tuple[bytes | None, bytes | None], C] = {}

    def find(
        self,
        owner: object,
        lookup: Callable[[str], C | None],
        authorization: bytes | None,
        x_api_key: bytes | None,
    ) -> C | None:
        """`owner`: what `lookup` reads (the policy); another one forgets what was kept."""
        if owner is not self._owner:
            self._owner, self._known = owner, {}
        credential = (authorization, x_api_key)
        found = self._known.get(credential)
        if found is not None:
            return found
        key = client_key(authorization, x_api_key)
        found = None if key is None else lookup(hash_key(key))
        if found is not None:
            if len(self._known) >= KNOWN_CREDENTIALS:
                self._known.clear()
            self._known[credential] = found
        return found
