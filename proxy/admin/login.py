"""The dashboard's login: a POST form trades an admin or dashboard token for a session.

The token travels only in the form's body, never in a URL (browser history, proxy logs); the
cookie holds a random server-side session id (proxy/admin/sessions.py), HttpOnly,
SameSite=Strict, Secure when the admin listener serves TLS, expiring with the session.
"""

from __future__ import annotations

import html
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from proxy import auth
from proxy.admin.identity import Denied, admin_auth

COOKIE = "specrouter_dashboard"
_PATH = "/dashboard"  # the cookie goes to the dashboard's own routes only
_MAX_FORM_BYTES = 4096


def viewer(request: Request) -> str:
    """The token name behind a dashboard request (its session, or a bearer token), or Denied."""
    checker = admin_auth(request)
    name = checker.sessions.name(request.cookies.get(COOKIE))
    return name if name is not None else checker.identify(request, checker.dashboard)


def login_form(message: str, status: int, headers: dict[str, str] | None = None) -> Response:
    page = f"""<!doctype html><meta charset=utf-8><title>specrouter</title>
<form method=post action=/dashboard/login style="font:16px system-ui;margin:20vh auto;width:22em">
<p>specrouter dashboard: admin or dashboard token</p>
<p id=message style="color:#b00">{html.escape(message)}</p>
<input name=token type=password autocomplete=current-password autofocus required
 style="width:100%;padding:.4em"> <button type=submit style="margin-top:.6em">log in</button>
</form>"""
    return Response(
        page.encode(),
        status_code=status,
        media_type="text/html",
        headers={"cache-control": "no-store", **(headers or {})},
    )


def refused(exc: Denied) -> Response:
    """The login form in place of a dashboard page: 401, or 429 with Retry-After."""
    wait = exc.response.headers.get("retry-after")
    if wait is None:
        return login_form("", 401)
    return login_form(
        f"too many failed attempts from this address: retry in {wait}s", 429, {"retry-after": wait}
    )


async def _form_token(request: Request) -> str | None:
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > _MAX_FORM_BYTES:
            return None
    values = parse_qs(body.decode("utf-8", "replace"), max_num_fields=4).get("token", [])
    return values[0] if values and values[0] else None


def login_routes() -> list[BaseRoute]:
    async def login(request: Request) -> Response:
        checker = admin_auth(request)
        wait = checker.retry_after(request)
        if wait is not None:
            return refused(Denied(Response(headers={"retry-after": str(wait)})))
        token = await _form_token(request)
        name = auth.token_name(token, checker.dashboard)
        if name is None:
            if token is not None:
                checker.failed(request)
            return login_form("wrong token", 401)
        response = RedirectResponse(_PATH, status_code=303)
        response.set_cookie(
            COOKIE,
            checker.sessions.open(name),
            path=_PATH,
            max_age=int(checker.sessions.lifetime_s),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    async def logout(request: Request) -> Response:
        admin_auth(request).sessions.close(request.cookies.get(COOKIE))
        response = RedirectResponse(_PATH, status_code=303)
        response.delete_cookie(
            COOKIE,
            path=_PATH,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    return [
        Route("/dashboard/login", login, methods=["POST"]),
        Route("/dashboard/logout", logout, methods=["POST"]),
    ]
