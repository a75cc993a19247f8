"""The HTTP API's request and response models, and the OpenAPI 3.1 document built from them.

The models are what the server validates and serialises, and the document's schemas are their
JSON Schemas, so the two cannot drift apart; limits that come from the settings (body size,
tasks per request, search results) are written into the document from the same settings the
server enforces. Request models are validated in strict mode: ``"true"`` is not a boolean and
``5`` is not a string, exactly as the document says.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from busscrape import __version__
from busscrape.dispatch.intake import TaskOutcome
from busscrape.model.messages import EXTRACTOR_NAME
from busscrape.search.index import CRAWL_ID, FILTER_PATTERN, MAX_FILTERS, MAX_OFFSET, MAX_QUERY_CHARS, SearchHit
from busscrape.settings import Settings
from busscrape.status.history import TaskHistory

TASK_ID_PATTERN = r"^[0-9a-f]{32}$"
MAX_URL_PARAM = 4096  # GET /tasks?url=: a URL as given, before normalisation (which caps it at max_url_length)
MAX_HOST_PARAM = 253  # the longest DNS name
MAX_SINCE_PARAM = 64
_ABSENT: Any = None
"""The default of a request field that may be left out but never sent as null: the model types it
without ``None`` (so the schema has no null), and pydantic leaves a default unvalidated."""


def _optional(*names: str) -> Any:
    """Drop ``default: null`` from properties that may be left out but may not be null."""

    def edit(schema: dict[str, Any]) -> None:
        for name in names:
            schema["properties"][name].pop("default", None)

    return edit


class TaskSpecIn(BaseModel):
    """One task with its own options, as a line of ``busscrape dispatch specs.jsonl`` (validated per task)."""

    model_config = ConfigDict(extra="allow", strict=True, title="TaskSpec")

    url: str
    steps: list[Any] | None = None
    """Page steps (click, fill, wait_for, scroll …); left out: none."""
    labels: dict[str, str] | None = None
    extractor: str | None = None
    """The extractor this task runs (``extractors/<name>.toml``); left out: the request's, or none.
    Checked with the task's other options, so a bad name rejects this task only."""


class TaskRequest(BaseModel):
    """Exactly one of ``url``, ``urls`` or ``tasks``; ``labels`` go on every task, ``force`` re-queues
    tasks already seen within the recrawl window."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=_optional("url", "urls", "tasks",
                                                                                       "labels", "extractor"))

    url: str = Field(default=_ABSENT)
    urls: list[str] = Field(default=_ABSENT, min_length=1)
    extractor: str = Field(default=_ABSENT, pattern=EXTRACTOR_NAME)
    """The extractor every task runs (``extractors/<name>.toml``), unless a task of ``tasks`` names its own."""
    tasks: list[TaskSpecIn] = Field(default=_ABSENT, min_length=1)
    labels: dict[str, str] = Field(default=_ABSENT)
    force: bool = False

    def items(self) -> list[dict[str, Any]]:
        """The tasks as JSONL specs (what the dispatcher reads)."""
        extra = {"extractor": self.extractor} if self.extractor is not None else {}
        if self.url is not None:
            return [{"url": self.url, **extra}]
        if self.urls is not None:
            return [{"url": u, **extra} for u in self.urls]
        return [{**extra, **{k: v for k, v in t.model_dump().items()
                             if v is not None or k not in ("steps", "labels", "extractor")}} for t in self.tasks]

    def given(self) -> int:
        """How many of url, urls, tasks the request holds (the document says exactly one)."""
        return sum(v is not None for v in (self.url, self.urls, self.tasks))


class CrawlRequest(BaseModel):
    """A crawl (``busscrape crawl``'s options): ``seeds`` at depth 0, links followed within ``scope``
    up to ``depth``, at most ``max_pages`` pages; ``steps``, ``options`` and ``labels`` apply to
    every page. The same request again names the same crawl (and resumes it)."""

    model_config = ConfigDict(extra="forbid")

    seeds: list[str] = Field(min_length=1, max_length=1000)
    scope: Literal["page", "prefix", "host", "domain", "any"] = "host"
    include: list[str] = []
    exclude: list[str] = []
    depth: int = Field(3, ge=0, le=1000)
    max_pages: int | None = Field(None, ge=1)
    robots: Literal["obey", "ignore"] = "obey"
    robots_agent: str | None = None
    follow: str | None = None
    """CSS selector of the links to follow (default ``a[href], area[href], link[rel=next][href]``)."""
    sitemaps: bool = False
    sitemap_since: datetime | None = None
    steps: list[Any] = []
    options: dict[str, Any] = {}
    """Task options of every page (as a JSONL task spec's ``options``)."""
    labels: dict[str, str] = {}


class CrawlStarted(BaseModel):
    """``POST /crawls`` (202): the crawl's id and what its seeds became."""

    crawl_id: str
    seeds: dict[str, int]
    seeding: bool = False
    """True when the seeds are still being read from the sitemaps (``--sitemaps``): that goes on
    after the answer, and ``GET /crawls/{crawl_id}`` says when it is done (``seeding``)."""


class CrawlProgress(BaseModel):
    """``GET /crawls/{crawl_id}``: every discovered link in one outcome, in total and per depth."""

    crawl_id: str
    links: dict[str, int]
    by_depth: dict[int, dict[str, int]]
    pages_followed: int
    not_followed: dict[str, int]
    archived: int
    dead: int
    done_by_depth: dict[int, dict[str, int]] = {}
    """Queued pages ``archived`` and ``dead``, by the depth they were queued at."""
    budget_used: int
    skipped: list[dict[str, str]]
    seeds_redirected: dict[str, str] = {}
    """Seed → where it redirected (the crawl's scope took that in)."""
    seeds_skipped: list[dict[str, str]] = []
    """Seeds not queued, with the reason (``blocked``: the network policy; asking again re-checks them)."""
    max_pages: int | None = None
    """The crawl's page budget (``budget_used`` counts against it), or none."""
    seeding: bool = False
    """The seeds are still being read from the crawl's sitemaps (nothing is queued yet)."""


class TasksAccepted(BaseModel):
    """What became of every task of a ``POST /tasks`` (202)."""

    tasks: list[TaskOutcome]
    queued: int
    already_seen: int
    duplicate: int
    rejected: int


class ErrorDetail(BaseModel):
    reason: str
    """A stable code: ``invalid_json``, ``invalid_request``, ``unauthorized``, ``invalid_query`` …"""
    message: str


class ErrorBody(BaseModel):
    """Every error answer."""

    error: ErrorDetail
    tasks: list[TaskOutcome] | None = None
    """``POST /tasks`` only: what became of each task when none could be queued, or a publish failed."""


class SearchResults(BaseModel):
    query: str
    """The text searched for; empty when the filters alone chose the pages (newest first)."""
    backend: str
    results: list[SearchHit]
    offset: int = 0
    """How many results in the query's order came before these (``offset``)."""
    more: bool = False
    """Whether more results follow: ask again with ``offset`` + the number of results."""


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    nats: bool


MODELS: tuple[type[BaseModel], ...] = (TaskRequest, TasksAccepted, ErrorBody, SearchResults, TaskHistory, Health,
                                       CrawlRequest, CrawlStarted, CrawlProgress)


def _json(ref: str, description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": {"$ref": ref}}}}


def _errors(*codes: int) -> dict[str, Any]:
    meaning = {400: "Invalid request", 401: "Missing or wrong bearer token", 404: "Not found",
               413: "Request body too large", 415: "Body is not JSON",
               422: "Nothing to crawl: no seed could be queued (crawl_seed_skipped)", 503: "Unavailable"}
    return {str(c): _json("#/components/schemas/ErrorBody", meaning[c]) for c in codes}


def openapi_document(settings: Settings) -> dict[str, Any]:
    """The OpenAPI document of the API as configured (auth and limits from ``settings``)."""
    from pydantic.json_schema import models_json_schema

    api = settings.api
    _, top = models_json_schema([(m, "validation" if m in (TaskRequest, CrawlRequest) else "serialization")
                                     for m in MODELS],
                                ref_template="#/components/schemas/{model}")
    schemas = top["$defs"]
    for name in ("urls", "tasks"):
        schemas["TaskRequest"]["properties"][name]["maxItems"] = api.max_tasks
    schemas["TaskRequest"]["oneOf"] = [{"required": [name]} for name in ("url", "urls", "tasks")]
    auth = ["401"] if api.token is not None else []
    secured: dict[str, Any] = {"security": [{"bearer": []}]} if api.token is not None else {}
    history = _json("#/components/schemas/TaskHistory", "Every generation of the task, oldest first")
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "busscrape", "version": __version__,
                 "description": "Queue pages to scrape, follow each task, and search what was archived."},
        "paths": {
            "/tasks": {
                "post": {
                    "operationId": "createTasks", "summary": "Queue one or many URLs (validated as dispatch does)",
                    "requestBody": {"required": True, "content": {"application/json": {
                        "schema": {"$ref": "#/components/schemas/TaskRequest"}}}},
                    "responses": {"202": _json("#/components/schemas/TasksAccepted", "What became of each task"),
                                  **_errors(400, *map(int, auth), 413, 415, 503)},
                    **secured,
                },
                "get": {
                    "operationId": "findTask", "summary": "The history of the task a URL becomes (default options)",
                    "parameters": [{"name": "url", "in": "query", "required": True,
                                    "schema": {"type": "string", "maxLength": MAX_URL_PARAM}}],
                    "responses": {"200": history, **_errors(400, *map(int, auth), 404, 503)},
                    **secured,
                },
            },
            "/tasks/{task_id}": {
                "get": {
                    "operationId": "getTask", "summary": "Every transition of a task",
                    "parameters": [{"name": "task_id", "in": "path", "required": True,
                                    "schema": {"type": "string", "pattern": TASK_ID_PATTERN}}],
                    "responses": {"200": history, **_errors(400, *map(int, auth), 404, 503)},
                    **secured,
                },
            },
            "/search": {
                "get": {
                    "operationId": "search",
                    "summary": "Search the archived pages: best first, or newest first by filters alone",
                    "parameters": [
                        {"name": "q", "in": "query", "description": "The query, the same on every backend: words "
                         "(all of them), \"a phrase\", a or b, -word (excluded). Without it, the filters (at least "
                         "one) list every page they keep, newest first",
                         "schema": {"type": "string", "maxLength": MAX_QUERY_CHARS}},
                        {"name": "host", "in": "query", "schema": {"type": "string", "maxLength": MAX_HOST_PARAM}},
                        {"name": "since", "in": "query", "description": "A date, a time (ISO 8601) or an age "
                         "such as 7d", "schema": {"type": "string", "maxLength": MAX_SINCE_PARAM}},
                        {"name": "where", "in": "query", "description": "A condition on the extracted record's "
                         "field: FIELD<VALUE with < <= > >= = != (a number compares as a number), e.g. price<100",
                         "style": "form", "explode": True,
                         "schema": {"type": "array", "maxItems": MAX_FILTERS,
                                    "items": {"type": "string", "minLength": 3, "maxLength": 270,
                                              "pattern": FILTER_PATTERN}}},
                        {"name": "limit", "in": "query",
                         "schema": {"type": "integer", "minimum": 1, "maximum": api.max_search_results,
                                    "default": 10}},
                        {"name": "crawl", "in": "query", "description": "Only the pages of this crawl",
                         "schema": {"type": "string", "pattern": CRAWL_ID.pattern}},
                        {"name": "status", "in": "query", "description": "Only the pages that answered this HTTP "
                         "status", "schema": {"type": "integer", "minimum": 100, "maximum": 599}},
                        {"name": "offset", "in": "query", "description": "Skip this many results (in the query's "
                         "order, which ends on the archive key: pages of results neither repeat nor skip); `more` "
                         "in the answer says whether another page follows",
                         "schema": {"type": "integer", "minimum": 0, "maximum": MAX_OFFSET, "default": 0}},
                    ],
                    "responses": {"200": _json("#/components/schemas/SearchResults", "Ranked results"),
                                  **_errors(400, *map(int, auth), 503)},
                    **secured,
                },
            },
            "/crawls": {
                "post": {
                    "operationId": "createCrawl", "summary": "Start (or resume) a crawl from seed URLs",
                    "requestBody": {"required": True, "content": {"application/json": {
                        "schema": {"$ref": "#/components/schemas/CrawlRequest"}}}},
                    "responses": {"202": _json("#/components/schemas/CrawlStarted", "The crawl's id"),
                                  **_errors(400, *map(int, auth), 413, 415, 422, 503)},
                    **secured,
                },
            },
            "/crawls/{crawl_id}": {
                "get": {
                    "operationId": "getCrawl", "summary": "A crawl's progress: links by outcome and depth",
                    "parameters": [{"name": "crawl_id", "in": "path", "required": True,
                                    "schema": {"type": "string", "pattern": "^[0-9a-f]{16}$"}}],
                    "responses": {"200": _json("#/components/schemas/CrawlProgress", "The crawl's progress"),
                                  **_errors(400, *map(int, auth), 404, 503)},
                    **secured,
                },
            },
            "/healthz": {
                "get": {"operationId": "health", "summary": "Whether the API and its NATS connection are up",
                        "security": [],
                        "responses": {"200": _json("#/components/schemas/Health", "Up"),
                                      "503": _json("#/components/schemas/Health", "NATS is not connected")}},
            },
        },
        "components": {"schemas": schemas},
    }
    if api.token is not None:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return doc
