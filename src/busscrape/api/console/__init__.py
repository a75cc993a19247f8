"""The web console ``busscrape api`` serves at ``/``: server-rendered pages over the API's own data.

::

    GET  /                              Overview: totals, streams, lag, workers' slots, rates, hosts cooling
    GET  /console/crawls                the crawls, and the form that starts one (POST, CSRF)
    GET  /console/crawls/{crawl_id}     one crawl's progress
    GET  /console/pages?q=…             search the archive (host, since, where, crawl, status)
    GET  /console/page?key=FOLDER       one archived page: screenshot, record, files, task history
    GET  /console/file?key=…&name=…     one of its files, as a download
    GET  /console/deadletters[?reason=] dead letters by reason; /console/deadletters/{seq} one letter
    GET  /console/replay?seq=|reason=   the confirmation; POST /console/replay replays (CSRF)
    GET|POST /console/login             the token, once, for a session cookie; POST /console/logout

Who may come in and the headers every page carries are ``guard``'s; the pages are ``views``'
and ``letters``'; a little script (``static/console.js``) refreshes the live parts of a page.
Jinja2 is imported with this package, which ``ApiServer`` imports when it starts (never for
``busscrape --help``).
"""

from __future__ import annotations

from importlib.resources import files
from typing import TYPE_CHECKING

import structlog
from aiohttp import web

from busscrape.api.answers import ApiError, owns
from busscrape.api.console.folders import Folders
from busscrape.api.console.guard import PAGE_HEADERS, Guard, Refused
from busscrape.api.console.letters import Letters
from busscrape.api.console.render import CONTEXT, page
from busscrape.api.console.views import Views

if TYPE_CHECKING:
    from busscrape.api.answers import Handler
    from busscrape.api.server import ApiServer

log = structlog.get_logger("busscrape.console")

PREFIX = "/console/"
LOGIN = "/console/login"
STATIC = {"console.css": "text/css", "console.js": "text/javascript"}
OPEN = frozenset({LOGIN, *(f"{PREFIX}static/{name}" for name in STATIC)})  # no session needed (with a token)
RETRY_UNAVAILABLE = 5
"""Seconds before a console page that got a 503 (the bus did not answer) loads itself again."""


class Console:
    """The console of one ``ApiServer``: its routes, its middleware, what it keeps open."""

    def __init__(self, server: ApiServer) -> None:
        self.server = server
        self.guard = Guard(server.token)
        self.folders = Folders(server.settings)
        self.views = Views(server, self.folders)
        self.letters = Letters(server)

    def install(self, app: web.Application) -> None:
        app.middlewares.insert(0, self.middleware)
        router = app.router
        router.add_get("/", self.views.overview)
        router.add_get(PREFIX + "crawls", self.views.crawls)
        router.add_post(PREFIX + "crawls", self.views.start_crawl)
        router.add_get(PREFIX + "crawls/{crawl_id}", self.views.crawl)
        router.add_get(PREFIX + "pages", self.views.pages)
        router.add_get(PREFIX + "page", self.views.page_view)
        router.add_get(PREFIX + "file", self.views.file)
        router.add_get(PREFIX + "deadletters", self.letters.listing)
        router.add_get(PREFIX + "deadletters/{seq}", self.letters.show)
        router.add_get(PREFIX + "replay", self.letters.confirm)
        router.add_post(PREFIX + "replay", self.letters.replay)
        router.add_get(LOGIN, self.login_form)
        router.add_post(LOGIN, self.login)
        router.add_post(PREFIX + "logout", self.logout)
        router.add_get(PREFIX + "static/{name}", self.static)

    async def close(self) -> None:
        await self.views.close()
        await self.folders.close()

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not owns(request.path):
            return await handler(request)
        try:
            if request.path in OPEN and self.guard.needs_login:
                request[CONTEXT] = {"csrf": "", "logout": False}
            else:
                session = self.guard.admit(request)
                request[CONTEXT] = {"csrf": self.guard.csrf_token(session), "logout": self.guard.needs_login}
                if request.method == "POST" and request.path != LOGIN:
                    form = await request.post()
                    self.guard.check_csrf(session, str(form.get("csrf", "")) or None)
            return await handler(request)
        except Refused as exc:
            if exc.status == 401:
                return page("login.html", 401, error=None, next=_next(request))
            return self._error(request, exc.status, exc.message)
        except ApiError as exc:
            return self._error(request, exc.status, f"{exc.reason}: {exc.message}")
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return self._error(request, exc.status, exc.reason)
        except Exception as exc:  # a bug: say so, keep serving
            log.exception("console.failed", path=request.path)
            return self._error(request, 500, f"{type(exc).__name__}: the console failed; see the server's log")

    @staticmethod
    def _error(request: web.Request, status: int, message: str) -> web.Response:
        # Unavailable is for now: a page that was only read comes back by itself once the bus answers.
        retry = RETRY_UNAVAILABLE if status == 503 and request.method == "GET" else None
        return page("error.html", status, status_code=status, message=message, retry=retry,
                    **request.get(CONTEXT, {"csrf": "", "logout": False}))

    # -- login --------------------------------------------------------------------------------

    async def login_form(self, request: web.Request) -> web.Response:
        if not self.guard.needs_login:
            raise web.HTTPSeeOther("/")
        return page("login.html", error=None, next=_next(request))

    async def login(self, request: web.Request) -> web.StreamResponse:
        if not self.guard.needs_login:
            raise web.HTTPSeeOther("/")
        form = await request.post()
        given, target = str(form.get("token", "")), _next(request, str(form.get("next", "")))
        if not given or not self.guard.token_matches(given):
            log.info("console.login_refused", remote=request.remote)
            return page("login.html", 401, error="that is not the API's token", next=target)
        response = web.Response(status=303, headers={"Location": target})
        self.guard.login(response, secure=request.secure)
        log.info("console.login", remote=request.remote)
        return response

    async def logout(self, request: web.Request) -> web.StreamResponse:
        response = web.Response(status=303, headers={"Location": LOGIN if self.guard.needs_login else "/"})
        self.guard.logout(response)
        return response

    async def static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in STATIC:
            raise Refused(404, "no such file")
        body = files("busscrape.api.console").joinpath("static", name).read_bytes()
        return web.Response(body=body, content_type=STATIC[name], charset="utf-8",
                            headers={**PAGE_HEADERS, "Cache-Control": "no-cache"})


def _next(request: web.Request, given: str | None = None) -> str:
    """Where the login form goes back to: a path of the console, never another site."""
    target = given if given is not None else request.path_qs
    if not target.startswith("/") or target.startswith("//") or "\\" in target or target == LOGIN:
        return "/"
    return target if owns(target.split("?", 1)[0]) else "/"
