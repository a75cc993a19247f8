"""``busscrape api``: queue tasks, follow them and search the archive over HTTP (aiohttp).

::

    POST /tasks             one or many URLs (or task specs), through the dispatcher: 202 + outcome per task
    POST /crawls            start (or resume) a crawl (``busscrape crawl``'s options): 202 + its id
    GET  /crawls/{crawl_id} the crawl's progress: links by outcome and depth, pages archived and dead
    GET  /tasks/{task_id}   the task's history (STATUS merged with SEEN, ``task_history``)
    GET  /tasks?url=…       the same, for the task a URL becomes
    GET  /search?q=…        ranked full-text search of the archived pages (``api.search``);
                            ``&host= &since= &crawl= &status= &where=price<100`` (repeatable) filter,
                            without ``q`` too (the newest first); ``&offset=`` pages on
    GET  /healthz           up, and whether NATS is connected
    GET  /openapi.json      the OpenAPI 3.1 document (``api_schema``)

Every error is JSON and, with ``BUSSCRAPE_API__TOKEN`` set, every request but ``/healthz`` and
``/openapi.json`` needs ``Authorization: Bearer <token>`` (``api.answers``). Bodies are limited
to ``BUSSCRAPE_API__MAX_BODY_BYTES``: a declared length above it is refused before a byte is
read, a chunked body as soon as it passes it.

``ApiServer`` is an async context manager with ``run()`` and ``stop()``, like the daemons: the
first stop ends ``run()``; leaving the context stops listening and gives requests in flight
``SHUTDOWN_GRACE`` seconds to finish.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import orjson
import structlog
from aiohttp import web
from pydantic import ValidationError

from busscrape.api.answers import ApiError, Bearer, errors, reply, unavailable_as_503
from busscrape.api.schema import (
    MAX_URL_PARAM,
    CrawlProgress,
    CrawlRequest,
    CrawlStarted,
    Health,
    TaskRequest,
    TasksAccepted,
    openapi_document,
)
from busscrape.api.search import Searching
from busscrape.bus import names, provision, topology
from busscrape.bus.connection import Bus
from busscrape.bus.retry import TRANSIENT
from busscrape.dispatch.identity import task_id_for_url
from busscrape.dispatch.intake import submit
from busscrape.errors import BusscrapeError, ConfigurationError, InputError
from busscrape.model.messages import describe_validation_error
from busscrape.settings import Settings
from busscrape.status.history import TASK_ID, HistoryReader, TaskHistory

if TYPE_CHECKING:
    from busscrape.api.console import Console
    from busscrape.crawl.spec import CrawlSpec

log = structlog.get_logger("busscrape.api")

SHUTDOWN_GRACE = 5.0
MAX_REQUEST_LINE = 256 * 1024


class ApiServer:
    """The HTTP API on ``settings.api.host:port`` (``port`` is the bound one once entered)."""

    def __init__(self, bus: Bus, settings: Settings) -> None:
        self.bus = bus
        self.settings = settings
        self.host = settings.api.host
        self.port = settings.api.port
        self.history = HistoryReader(bus.js)
        self.document = openapi_document(settings)
        self.token = settings.api.token.get_secret_value().encode() if settings.api.token else None
        self.searching = Searching(settings)
        self._runner: web.AppRunner | None = None
        self._stopping = asyncio.Event()
        self._entered = False
        self._seeding: set[asyncio.Future[None]] = set()
        """Crawls whose seeds are being read from their sitemaps (``_seed_later``)."""
        self._console: Console | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    async def __aenter__(self) -> ApiServer:
        if self._entered:
            raise RuntimeError("an ApiServer can be entered only once")
        self._entered = True
        await provision.require(self.bus.js, topology.load(self.settings), names.API_NEEDS)
        # aiohttp refuses a request line over 8 KB in plain text, before any handler: a 1,000-character
        # query of 4-byte characters is 12 KB percent-encoded. Longer lines are let through to be
        # refused with a JSON reason by the parameters' own limits.
        app = web.Application(client_max_size=self.settings.api.max_body_bytes,
                              middlewares=[errors, Bearer(self.token).middleware],
                              handler_args={"max_line_size": MAX_REQUEST_LINE})
        app.router.add_post("/tasks", self.create_tasks)
        app.router.add_get("/tasks", self.find_task)
        app.router.add_get("/tasks/{task_id}", self.get_task)
        app.router.add_post("/crawls", self.create_crawl)
        app.router.add_get("/crawls/{crawl_id}", self.get_crawl)
        app.router.add_get("/search", self.search)
        app.router.add_get("/healthz", self.health)
        app.router.add_get("/openapi.json", self.openapi)
        from busscrape.api.console import Console

        self._console = Console(self)
        self._console.install(app)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_GRACE)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            raise ConfigurationError(f"cannot listen on {self.host}:{self.port} ({exc.strerror or exc}); choose "
                                     "another with --host/--port or BUSSCRAPE_API__HOST/__PORT") from None
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        log.info("api.listening", host=self.host, port=self.port, auth=self.token is not None,
                 search=self.settings.search.backend)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for job in self._seeding:  # a crawl left unseeded is seeded by the same POST again
            job.cancel()
        await asyncio.gather(*self._seeding, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()
        if self._console is not None:
            await self._console.close()
        await self.searching.close()
        log.info("api.stopped")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> int:
        """Serve until ``stop()``."""
        await self._stopping.wait()
        return 0

    # -- tasks --------------------------------------------------------------------------------

    async def create_tasks(self, request: web.Request) -> web.Response:
        body = await self._json_body(request)
        try:
            wanted = TaskRequest.model_validate(body, strict=True)
        except ValidationError as exc:
            raise ApiError(400, "invalid_request", describe_validation_error(exc)) from None
        if wanted.given() != 1:
            raise ApiError(400, "invalid_request", "give exactly one of url, urls or tasks")
        items = wanted.items()
        if len(items) > self.settings.api.max_tasks:
            raise ApiError(400, "too_many_tasks", f"{len(items)} tasks; at most {self.settings.api.max_tasks} "
                                                  "a request (BUSSCRAPE_API__MAX_TASKS)")
        try:
            intake = await submit(self.bus, self.settings, items, labels=wanted.labels, force=wanted.force)
        except ConfigurationError as exc:
            raise ApiError(503, exc.reason, exc.message) from None
        except TRANSIENT as exc:
            raise ApiError(503, "bus_unavailable", f"NATS did not answer ({exc!r}); sending the same request "
                                                   "again is safe") from None
        counts = intake.counts
        log.info("api.tasks", **counts)
        if counts["failed"]:
            raise ApiError(503, "bus_unavailable", f"NATS did not confirm {counts['failed']} task(s); sending the "
                                                   "same request again is safe", tasks=intake.outcomes)
        if counts["rejected"] == len(items):
            reasons = {o.reason for o in intake.outcomes}
            raise ApiError(400, reasons.pop() if len(reasons) == 1 else "invalid_tasks",  # type: ignore[arg-type]
                           "; ".join(f"{o.index}: {o.reason} ({o.detail})" for o in intake.outcomes[:5]),
                           tasks=intake.outcomes)
        return reply(TasksAccepted(tasks=intake.outcomes, queued=counts["queued"],
                                   already_seen=counts["already_seen"], duplicate=counts["duplicate"],
                                   rejected=counts["rejected"]), 202)

    # -- crawls -------------------------------------------------------------------------------

    async def create_crawl(self, request: web.Request) -> web.Response:
        body = await self._json_body(request)
        try:
            wanted = CrawlRequest.model_validate(body)
        except ValidationError as exc:
            raise ApiError(400, "invalid_request", describe_validation_error(exc)) from None
        return reply(await self.start_crawl(wanted), 202)

    async def start_crawl(self, wanted: CrawlRequest) -> CrawlStarted:
        """Start (or resume) the crawl ``wanted`` asks for: ``POST /crawls`` and the console's form."""
        from busscrape.crawl.progress import unseeded
        from busscrape.crawl.run import make_spec, seeding_needed, start_crawl

        try:
            spec = make_spec(self.settings, wanted.seeds, **wanted.model_dump(exclude={"seeds"}))
            if await seeding_needed(self.bus, self.settings, spec):
                # Reading a site's sitemaps may take minutes: not inside the request.
                self._seed_later(spec)
                log.info("api.crawl", crawl_id=spec.crawl_id, seeding=True)
                return CrawlStarted(crawl_id=spec.crawl_id, seeds={}, seeding=True)
            seeded = await start_crawl(self.bus, self.settings, spec)
        except ValidationError as exc:
            raise ApiError(400, "invalid_request", describe_validation_error(exc)) from None
        except InputError as exc:
            raise ApiError(400, exc.reason, exc.message) from None
        except BusscrapeError as exc:  # the CRAWLS bucket missing, robots.txt unreachable …
            raise ApiError(503, exc.reason, exc.message) from None
        except TRANSIENT as exc:
            raise ApiError(503, "bus_unavailable", f"NATS did not answer ({exc!r}); sending the same request "
                                                   "again is safe") from None
        log.info("api.crawl", crawl_id=spec.crawl_id, **seeded.get("counts", {}))
        nothing = unseeded(len(seeded.get("queued") or ()), seeded.get("skipped") or [])
        if nothing is not None:  # stored all the same: the same request once the policy allows resumes it
            raise ApiError(422, "crawl_seed_skipped", f"crawl {spec.crawl_id}: {nothing[1]}")
        return CrawlStarted(crawl_id=spec.crawl_id, seeds=seeded.get("counts", {}))

    def _seed_later(self, spec: CrawlSpec) -> None:
        """Queue a crawl's seeds from its sitemaps after the answer; a failure is logged, and the
        same ``POST /crawls`` again reads them again (its rules are stored, its seeds are not)."""
        from busscrape.crawl.run import start_crawl

        async def seed() -> None:
            try:
                seeded = await start_crawl(self.bus, self.settings, spec)
            except Exception as exc:  # a daemon never dies of one crawl's sitemaps
                log.warning("api.crawl_seeding_failed", crawl_id=spec.crawl_id, error=repr(exc)[:500])
                return
            log.info("api.crawl_seeded", crawl_id=spec.crawl_id, **seeded.get("counts", {}))

        job = asyncio.ensure_future(seed())
        self._seeding.add(job)
        job.add_done_callback(self._seeding.discard)

    async def get_crawl(self, request: web.Request) -> web.Response:
        return reply(await self.crawl_progress(request.match_info["crawl_id"]))

    async def crawl_progress(self, crawl_id: str) -> CrawlProgress:
        """``GET /crawls/{crawl_id}`` and the console's crawl page."""
        from busscrape.crawl.run import crawl_status
        from busscrape.crawl.spec import CRAWL_ID

        if not CRAWL_ID.fullmatch(crawl_id):
            raise ApiError(400, "invalid_crawl_id", "a crawl id is 16 lower-case hex characters")
        with unavailable_as_503("CRAWLS"):
            summary = await crawl_status(self.bus, crawl_id)
        if summary is None:
            raise ApiError(404, "not_found", f"no crawl {crawl_id}")
        return CrawlProgress(**summary.as_dict())

    async def _json_body(self, request: web.Request) -> Any:
        limit = self.settings.api.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise ApiError(413, "body_too_large", f"{request.content_length} bytes; at most {limit} "
                                                  "(BUSSCRAPE_API__MAX_BODY_BYTES)")
        if request.content_type != "application/json":
            raise ApiError(415, "unsupported_media_type", "send the body as application/json")
        raw = await request.read()  # aiohttp stops a chunked body past client_max_size (413)
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise ApiError(400, "invalid_json", f"the body is not JSON: {exc}") from None

    async def get_task(self, request: web.Request) -> web.Response:
        task_id = request.match_info["task_id"]
        if not TASK_ID.match(task_id):
            raise ApiError(400, "invalid_task_id", "a task id is 32 lower-case hex characters")
        return reply(await self.task_history(task_id, task_id))

    async def find_task(self, request: web.Request) -> web.Response:
        url = request.query.get("url")
        if url is None:
            raise ApiError(400, "invalid_request", "give ?url=… (or ask for /tasks/{task_id})")
        if len(url) > MAX_URL_PARAM:
            raise ApiError(400, "too_long", f"url is longer than {MAX_URL_PARAM} characters")
        try:
            task_id = task_id_for_url(url, self.settings)
        except InputError as exc:
            raise ApiError(400, exc.reason, exc.message) from None
        return reply(await self.task_history(task_id, url))

    async def task_history(self, task_id: str, asked: str) -> TaskHistory:
        with unavailable_as_503("STATUS or SEEN"):
            found = await self.history.read(task_id)
        if found is None:
            raise ApiError(404, "not_found", f"no task {task_id} ({asked}) is queued or remembered")
        return found

    # -- search -------------------------------------------------------------------------------

    async def search(self, request: web.Request) -> web.Response:
        return reply(await self.searching.find(request.query))

    # -- the rest -----------------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        up = self.bus.nc.is_connected
        return reply(Health(status="ok" if up else "unavailable", nats=up), 200 if up else 503)

    async def openapi(self, request: web.Request) -> web.Response:
        return web.json_response(self.document, dumps=lambda d: orjson.dumps(d).decode())

