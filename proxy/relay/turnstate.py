"""`x-codex-turn-state`: a token the gateway issues and Codex echoes within one turn.

Codex keeps the first `x-codex-turn-state` response header of a turn and sends it back on every
later request of that turn, never into the next turn (checked with Codex 0.171.0 as a custom
provider over HTTP: docs/sessions.md). The gateway issues one naming the engine that answered,
and a request carrying a valid one stays on that engine while it can serve (policies/engine.py,
reason `turn-state`), whatever the session table says, on any replica.

    token = "v1." + engine (base64url) + "." + issued (unix seconds) + "." + mac
    mac   = HMAC-SHA256(secret, "v1" | client | session key | engine | issued), 16 bytes hex

The client's name and the session key are in the MAC, not in the token: a token copied to
another client or another session does not verify, nor does one past `MAX_AGE_S`, one longer
than `MAX_TOKEN_BYTES` or one naming an engine the request's route does not have (removed since
it was issued). A token that does not verify is ignored (the request is placed as without one)
and logged as `refused`.

The secret: `SPECROUTER_TURN_STATE_SECRET` (32 characters or more, of at least 8 distinct ones:
checked at start, proxy/safety.py, since one token allows an offline guess; the same on every
replica; a variable, not a flag, so that it does not show in the process list); else, with `--redis-url`, one random secret the replicas agree on through Redis
(proxy/backends/session_share.py: the first to start sets it); else a random one per process.
Until a shared secret is known nothing is issued or honoured.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from typing import Final

HEADER: Final = b"x-codex-turn-state"
MAX_TOKEN_BYTES: Final = 256
MAX_AGE_S: Final = 3600.0  # a turn longer than an hour gets placed again
_VERSION: Final = b"v1"


class TurnState:
    def __init__(self, secret: bytes | None) -> None:
        self.secret = secret  # None: not known yet (a shared one is on its way)

    @classmethod
    def from_settings(cls, configured: str | None, shared: bool) -> TurnState:
        if configured:
            return cls(configured.encode())
        return cls(None if shared else secrets.token_bytes(32))

    def issue(self, client: str, session: str, engine: str, now: float) -> bytes | None:
        if self.secret is None or not engine:
            return None
        name = base64.urlsafe_b64encode(engine.encode()).rstrip(b"=")
        issued = str(int(now)).encode()
        mac = self._mac(client, session, engine.encode(), issued)
        return b".".join((_VERSION, name, issued, mac))

    def verify(self, token: bytes | None, client: str, session: str, now: float) -> str | None:
        """The engine a valid token names, else None (the caller checks that its route has
        it: proxy/relay/app.py)."""
        if self.secret is None or not token or len(token) > MAX_TOKEN_BYTES:
            return None
        parts = token.split(b".")
        if len(parts) != 4 or parts[0] != _VERSION or not parts[2].isdigit():
            return None
        try:
            engine = base64.urlsafe_b64decode(parts[1] + b"=" * (-len(parts[1]) % 4))
        except (binascii.Error, ValueError):
            return None
        if not hmac.compare_digest(parts[3], self._mac(client, session, engine, parts[2])):
            return None
        if not 0 <= now - int(parts[2]) <= MAX_AGE_S:
            return None
        try:
            return engine.decode()
        except UnicodeDecodeError:
            return None

    def _mac(self, client: str, session: str, engine: bytes, issued: bytes) -> bytes:
        assert self.secret is not None
        h = hmac.new(self.secret, digestmod=hashlib.sha256)
        for part in (_VERSION, client.encode(), session.encode(), engine, issued):
            h.update(len(part).to_bytes(4, "big"))  # length-prefixed: no two tuples alike
            h.update(part)
        return h.hexdigest()[:32].encode()
