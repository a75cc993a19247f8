"""Who may see the console, and what a browser may do with its pages.

- **Token configured** (``BUSSCRAPE_API__TOKEN``): a request is let in with ``Authorization:
  Bearer <token>`` (as the API) or with the session cookie the login form sets once the token is
  typed in. The cookie holds an HMAC of the token, never the token: ``HttpOnly`` (no script reads
  it), ``SameSite=Strict`` (no other site's page sends it). Changing the token ends every session.
- **No token**: the console answers only a loopback peer, and only under a loopback ``Host``
  (``127.0.0.1:8080``, ``localhost:8080``): a page of another site that had its name resolve to
  127.0.0.1 (DNS rebinding) is refused, so it cannot read the console and its CSRF token.
- **Every change is a POST with a CSRF token** (replay, crawl start, logout): an HMAC, under a
  secret drawn when the server starts, of the session; another origin cannot read a console page,
  so it cannot learn it. A form posted from elsewhere is refused (403) before anything happens.
- **Headers**: every console page carries a Content-Security-Policy that allows scripts, styles
  and images from the console's own origin only (``script-src 'self'``, no inline code),
  ``object-src 'none'`` and ``frame-ancestors 'none'``; an archived file is served with
  ``Content-Disposition: attachment``, ``nosniff`` and a ``sandbox`` policy (``ARTIFACT_HEADERS``),
  so an archived page never runs as the console's origin.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets

from aiohttp import web

SESSION_COOKIE = "busscrape_session"
CSRF_FIELD = "csrf"
_SESSION_LABEL = b"busscrape-console-session"
_ANONYMOUS = "loopback"  # the session of every request when no token is configured

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "form-action 'self'; base-uri 'none'; object-src 'none'; frame-ancestors 'none'")
PAGE_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
ARTIFACT_HEADERS = {
    # Whatever the file holds, a browser that opens it runs nothing from it as this origin.
    "Content-Security-Policy": "default-src 'none'; sandbox",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "private, no-store",
}


class Refused(Exception):
    """A request the console does not serve: status and why (rendered as a page)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def is_loopback(address: str | None) -> bool:
    if not address:
        return False
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def loopback_host(host_header: str) -> bool:
    """Whether a ``Host`` header names this machine's loopback (with or without a port)."""
    host = host_header.strip().lower()
    if host.startswith("["):
        host = host[1:].split("]", 1)[0]
    elif host.count(":") == 1:
        host = host.rsplit(":", 1)[0]
    return host == "localhost" or host.endswith(".localhost") or is_loopback(host)


class Guard:
    """The console's checks, for one server: its token (or none) and this run's CSRF secret."""

    def __init__(self, token: bytes | None) -> None:
        self.token = token
        self._secret = secrets.token_bytes(32)
        self._session = hmac.new(token, _SESSION_LABEL, hashlib.sha256).hexdigest() if token else None

    @property
    def needs_login(self) -> bool:
        return self.token is not None

    def session_value(self) -> str:
        """The cookie the login form sets (only with a token)."""
        assert self._session is not None
        return self._session

    def token_matches(self, given: str) -> bool:
        assert self.token is not None
        return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), self.token)

    def admit(self, request: web.Request) -> str:
        """The request's session (what its CSRF token is bound to); ``Refused`` when it has none."""
        if self.token is None:
            if not is_loopback(request.remote):
                raise Refused(403, "this console has no token (BUSSCRAPE_API__TOKEN), so it answers only on loopback; "
                                   "set a token to open it to other machines")
            if not loopback_host(request.headers.get("Host", "")):
                raise Refused(403, "without a token (BUSSCRAPE_API__TOKEN) the console answers only to a loopback "
                                   "address or localhost in the Host header")
            return _ANONYMOUS
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and given.strip(" ") and self.token_matches(given.lstrip(" ")):
            return self.session_value()
        cookie = request.cookies.get(SESSION_COOKIE, "")
        if cookie and hmac.compare_digest(cookie.encode("utf-8", "surrogateescape"), self.session_value().encode()):
            return cookie
        raise Refused(401, "log in with the API token (BUSSCRAPE_API__TOKEN)")

    def csrf_token(self, session: str) -> str:
        return hmac.new(self._secret, session.encode(), hashlib.sha256).hexdigest()

    def check_csrf(self, session: str, given: str | None) -> None:
        if not given or not hmac.compare_digest(given.encode("utf-8", "surrogateescape"),
                                                self.csrf_token(session).encode()):
            raise Refused(403, "this form is not from this console (its CSRF token is missing or stale); reload the "
                               "page and submit it again")

    def login(self, response: web.StreamResponse, *, secure: bool) -> None:
        response.set_cookie(SESSION_COOKIE, self.session_value(), httponly=True, samesite="Strict", path="/",
                            secure=secure)

    @staticmethod
    def logout(response: web.StreamResponse) -> None:
        response.del_cookie(SESSION_COOKIE, path="/")
