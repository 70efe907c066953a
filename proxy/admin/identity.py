"""Who an admin-listener request comes from: the name of the token it presents (or of its
dashboard session), never what a request header claims. Failures are throttled per source.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from proxy import auth
from proxy.admin.sessions import Sessions
from proxy.relay.errors import error_body
from proxy.settings import Settings
from proxy.throttle import AuthThrottle, source_of


class Denied(Exception):
    """Answered with `response` (401, or 429 while the source is throttled)."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status_code)
        self.response = response


def _error(status: int, message: str, type_: str, headers: dict[str, str]) -> Response:
    return Response(
        error_body(status, message, type_=type_),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


class AdminAuth:
    """The admin listener's credentials: named admin tokens (everything), the dashboard token
    (the dashboard only), the scrape token (/metrics only), and dashboard sessions."""

    def __init__(self, settings: Settings) -> None:
        self.admin = {name: auth.hash_key(t) for name, t in settings.admin_tokens().items()}
        self.dashboard = dict(self.admin)
        if settings.dashboard_token:
            self.dashboard.setdefault("dashboard", auth.hash_key(settings.dashboard_token))
        self.scrape: dict[str, str] | None = None
        if settings.scrape_token:
            self.scrape = {**self.admin, "scrape": auth.hash_key(settings.scrape_token)}
        self.throttle = AuthThrottle(settings.auth_failures_per_minute, listener="admin")
        self.sessions = Sessions(settings.dashboard_session_s)

    def retry_after(self, request: Request) -> int | None:
        return self.throttle.retry_after(source_of(request.scope))

    def failed(self, request: Request) -> None:
        self.throttle.failed(source_of(request.scope))

    def identify(self, request: Request, digests: dict[str, str]) -> str:
        """The name of the bearer token among `digests`, or Denied."""
        wait = self.retry_after(request)
        if wait is not None:
            raise Denied(
                _error(
                    429,
                    f"too many failed authentications from this address: retry in {wait}s",
                    "RateLimitError",
                    {"retry-after": str(wait)},
                )
            )
        header = request.headers.get("authorization")
        name = auth.token_name(auth.bearer(header.encode("latin-1") if header else None), digests)
        if name is None:
            if header is not None:  # a guess; no credential at all is none
                self.failed(request)
            raise Denied(
                _error(
                    401,
                    "admin token required",
                    "AuthenticationError",
                    {"www-authenticate": "Bearer"},
                )
            )
        return name


def admin_auth(request: Request) -> AdminAuth:
    """The app's AdminAuth (create_admin_app puts it in the app's state)."""
    found: AdminAuth = request.app.state.admin_auth
    return found
