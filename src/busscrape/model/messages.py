"""The messages on the bus and their one codec.

Every message is a frozen pydantic model with a ``schema_version``. ``encode`` and ``decode``
(orjson underneath) are the only way messages become bytes and back; ``decode`` raises
``MessageDecodeError`` whose ``reason`` says how a payload is wrong (``not_json``,
``not_an_object``, ``unsupported_schema_version``, ``invalid_schema``) and whose message names
the fields.

``ScrapeTask``   dispatcher → TASKS → worker
``ScrapeResult`` worker → RESULTS → ingester; carries ``ArtifactRef`` claim checks, never bytes
``DeadLetter``   anyone → DEADLETTER; the reason, the attempt history and the task for replay
"""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime
from typing import Any, ClassVar, Final, Literal, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from busscrape.errors import MessageDecodeError
from busscrape.model.steps import Step, Steps, WaitUntil
from busscrape.units import Duration

SCHEMA_VERSION: Final = 1

ArtifactKind = Literal["html", "screenshot", "har", "text", "warc"]
DEFAULT_ARTIFACTS: tuple[ArtifactKind, ...] = ("html", "screenshot", "har", "text")
CRAWL_ARTIFACTS: tuple[ArtifactKind, ...] = (*DEFAULT_ARTIFACTS, "warc")
"""The artifacts of a crawl's tasks unless it says otherwise: a crawl is a web archive, so its
pages carry their WARC (``warc``) by default. The one place a crawl mode takes its default from."""
EXTRACTOR_NAME = r"^[a-z0-9][a-z0-9._-]{0,63}$"
"""An extractor's name: its file's name in ``extractors/`` without ``.toml``."""


# RFC 9110 field names; and what a field value must not hold (tab is allowed).
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
BROWSER_HEADERS = frozenset({"host", "content-length", "connection", "transfer-encoding", "keep-alive", "upgrade",
                             "te", "trailer", "proxy-connection", "proxy-authorization", "cookie2"})
"""Headers a task may not set: Chromium fails the navigation (ERR_INVALID_ARGUMENT) when one is."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Message(_Model):
    """Base of every bus message."""

    schema_version: Literal[1] = SCHEMA_VERSION

    omit_when_default: ClassVar[tuple[str, ...]] = ()
    """Fields ``encode`` leaves out while they hold their default (``decode`` puts it back)."""


def utcnow() -> datetime:
    return datetime.now(UTC)


# -- task ---------------------------------------------------------------------------------------


class Viewport(_Model):
    width: int = Field(1280, ge=200, le=4096)
    height: int = Field(800, ge=200, le=4096)


class ScreenshotOptions(_Model):
    format: Literal["png", "jpeg"] = "png"
    quality: int | None = Field(None, ge=1, le=100)
    """JPEG quality; only with ``format: jpeg``."""
    full_page: bool = False
    """Capture the whole page (cut at the worker's ``max_screenshot_height``) instead of the viewport.
    Off by default, as in Crawlee and Browsertrix: a full-page PNG costs 3–4× a viewport one."""


SCREENSHOT_EXTENTS = ("viewport", "full")


class TaskOptions(_Model):
    """How to render and what to capture. Part of a task's identity."""

    artifacts: tuple[ArtifactKind, ...] = DEFAULT_ARTIFACTS
    screenshot: ScreenshotOptions = ScreenshotOptions()
    """Also written ``"full"`` or ``"viewport"`` for the default format with that extent."""
    har_content: Literal["omit", "embed"] = "omit"
    """HAR response bodies: ``omit`` (headers and timings only) or ``embed`` (base64 in the HAR)."""
    wait_until: WaitUntil = "load"
    navigation_timeout: Duration | None = Field(None, gt=0, le=600)
    """Overrides the worker's navigation timeout."""
    viewport: Viewport = Viewport()
    user_agent: str | None = Field(None, min_length=1, max_length=512)
    headers: dict[str, str] = {}
    """Extra HTTP request headers, sent with every request of the page (third-party ones too)."""
    block_resources: tuple[Literal["image", "media", "font", "stylesheet"], ...] = ()
    """Resource types not to download (faster renders; screenshots lose them)."""
    extractor: str | None = Field(None, pattern=EXTRACTOR_NAME)
    """The extractor (``extractors/<name>.toml``) the worker runs on the rendered DOM; its record
    travels in the result and is archived as ``extracted.json``."""
    proxy: str | None = Field(None, min_length=1, max_length=512)
    """``direct``, the name of a proxy pool in the worker's settings, or a proxy URL without
    credentials (``http://10.0.0.5:3128``); none: the worker's routes decide (``net/proxies.py``)."""

    session: str | None = Field(None, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    """A session name: its cookies and storage persist across its tasks (the worker's sessions file
    says how it logs in), isolated from other sessions and from session-less tasks."""

    @field_validator("screenshot", mode="before")
    @classmethod
    def _screenshot_shorthand(cls, value: object) -> object:
        if isinstance(value, str):
            if value not in SCREENSHOT_EXTENTS:
                raise ValueError(f"screenshot {value!r}: write \"viewport\", \"full\" or an object "
                                 "({\"format\": …, \"quality\": …, \"full_page\": …})")
            return {"full_page": value == "full"}
        return value

    @field_validator("proxy")
    @classmethod
    def _no_credentials(cls, value: str | None) -> str | None:
        if value is not None and "://" in value and "@" in value.split("://", 1)[1].split("/", 1)[0]:
            raise ValueError("a task's proxy carries no credentials: name a pool from the worker's "
                             "BUSSCRAPE_PROXY__POOLS instead")
        return value

    # What Chromium refuses is refused here, where the task is built: otherwise every attempt of
    # the task would fail the same way in the worker.
    @field_validator("headers")
    @classmethod
    def _sendable_headers(cls, headers: dict[str, str]) -> dict[str, str]:
        for name, value in headers.items():
            if not _TOKEN.fullmatch(name):
                raise ValueError(f"header name {name!r} is not an HTTP token")
            if name.lower() in BROWSER_HEADERS:
                raise ValueError(f"header {name!r} is the browser's own to set; Chromium refuses a request "
                                 "that sets it")
            if _CONTROL.search(value):
                raise ValueError(f"header {name!r}: its value holds a control character")
        return headers

    @field_validator("user_agent")
    @classmethod
    def _sendable_user_agent(cls, value: str | None) -> str | None:
        if value is not None and _CONTROL.search(value):
            raise ValueError("user_agent holds a control character")
        return value


class CrawlRef(_Model):
    """Where a task stands in a crawl (``busscrape crawl``): its rules live in the CRAWLS bucket
    under ``crawl_id``; the task carries only its place in the link graph."""

    crawl_id: str = Field(pattern=r"^[0-9a-f]{16}$")
    depth: int = Field(0, ge=0)
    """Seeds are depth 0; a link found on a page of depth d is depth d + 1."""
    parent: str | None = Field(None, pattern=r"^[0-9a-f]{32}$")
    """The task id of the page the link was found on (None for a seed)."""
    seeds_redirected: int = Field(0, ge=0)
    """How many seeds had redirected (widening the crawl's scope) when this task was made: a
    worker whose copy of the scope knows fewer reads it again (``crawl.frontier``)."""


class ScrapeTask(Message):
    """One URL to render."""

    task_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    """Digest of the normalised URL, steps and options: the same work has the same id."""
    url: str
    """The normalised URL the worker navigates to."""
    original_url: str
    """The URL as written in the input."""
    steps: Steps = ()
    options: TaskOptions = TaskOptions()
    labels: dict[str, str] = {}
    """Free-form tags carried through to the result and the archive (``job``, ``customer``…)."""
    dispatched_at: datetime = Field(default_factory=utcnow)
    crawl: CrawlRef | None = None
    """Set on the tasks of a crawl: the page's links are followed (``crawl.frontier``)."""

    # A task is stored twice per queued URL (SEEN and TASKS) and kept in SEEN for the recrawl
    # window: the default options alone were 330 of its 576 bytes (issue #19). Only whole
    # fields are left out, so a task with any option set carries all of its options.
    omit_when_default: ClassVar[tuple[str, ...]] = ("steps", "options", "labels", "crawl")


def identity_tail(steps: tuple[Step, ...] | list[Step] = (), options: TaskOptions | None = None) -> bytes:
    """What a task's identity holds beside its URL, encoded once: the dispatcher reuses it for every
    URL that shares the steps and options."""
    options = options or TaskOptions()
    # Options added after ids were first given out count only once set: unset, they leave every
    # id as it was, so SEEN's recrawl window and every archived folder keep their meaning.
    unset = {name for name in LATER_OPTIONS if getattr(options, name) is None}
    encoded = orjson.dumps([[s.model_dump(mode="json") for s in steps], options.model_dump(mode="json", exclude=unset)],
                           option=orjson.OPT_SORT_KEYS)
    return b"," + encoded[1:]


LATER_OPTIONS = ("extractor", "proxy", "session")
"""TaskOptions fields that are part of a task's id only when set (see ``identity_tail``): a new
option goes here, or it changes the id of every task (``tests/model/test_messages.py`` pins them)."""


def task_key(url: str, steps: tuple[Step, ...] | list[Step] = (), options: TaskOptions | None = None, *,
             tail: bytes | None = None) -> str:
    """The stable identity of a piece of work: sha256 of URL + steps + options, 32 hex chars.

    The digest is of the canonical JSON ``[url, steps, options]`` (keys sorted); ``tail`` is that
    document without its URL, from ``identity_tail``, when the caller has it already. Labels are
    not part of it: the same page with other labels is the same work.
    """
    if tail is None:
        tail = identity_tail(steps, options)
    return hashlib.sha256(b"[" + orjson.dumps(url) + tail).hexdigest()[:32]


# -- result -------------------------------------------------------------------------------------


class ArtifactRef(_Model):
    """A claim check: where an artifact waits in the ARTIFACTS object store, and its digest."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,80}$")
    """File name in the archive (``page.html``, ``screenshot.png``, ``shot-<name>.png``, ``page.warc.gz``)."""
    kind: Literal["html", "screenshot", "har", "text", "warc", "extra_screenshot", "extracted"]
    """(``extracted`` names the archive's ``extracted.json``, written from the result itself.)"""
    object: str
    """Object name in the ARTIFACTS bucket."""
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    content_type: str
    nuid: str | None = None
    """Where the object's chunks are (``$O.ARTIFACTS.C.<nuid>``): lets the reader skip a lookup."""


class Extraction(_Model):
    """What the task's extractor made of the rendered page."""

    extractor: str
    version: int
    record: dict[str, Any]
    """Field name → value (JSON: decimals as strings of digits, dates in ISO 8601)."""
    warnings: tuple[str, ...] = ()
    """Values dropped on the way (``rating: 'five' does not read as int``)."""
    ms: float = 0.0
    """How long the extraction took, in its process."""


class ScrapeResult(Message):
    """A rendered page: metadata inline, bytes by reference."""

    task_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    task_seq: int = Field(ge=0)
    """Sequence of the task message in TASKS (distinguishes a re-dispatch of the same work)."""
    url: str
    original_url: str
    final_url: str
    status: int | None = None
    redirect_chain: tuple[str, ...] = ()
    response_headers: dict[str, str] = {}
    title: str = ""
    timings: dict[str, float] = {}
    """Milliseconds: ``navigation``, ``steps``, ``capture``, ``total`` and the page's own marks."""
    artifacts: tuple[ArtifactRef, ...] = ()
    labels: dict[str, str] = {}
    worker: str
    attempt: int = Field(ge=1)
    scraped_at: datetime
    blocked_requests: tuple[str, ...] = ()
    """Sub-requests the network policy refused (the page rendered without them)."""
    dispatched_at: datetime | None = None
    """When the task was dispatched (tells re-dispatches of one task id apart)."""
    extraction: Extraction | None = None
    """The task's extractor's record (tasks with an ``extractor`` only)."""
    crawl: CrawlRef | None = None
    """The task's place in its crawl (crawl tasks only); ``meta.json`` records it."""
    proxy: str | None = None
    """The upstream proxy the page went through, without credentials (none: direct)."""


# -- dead letter --------------------------------------------------------------------------------


class AttemptRecord(_Model):
    """One failed attempt, kept in the ATTEMPTS bucket between deliveries."""

    attempt: int = Field(ge=1)
    worker: str
    at: datetime
    reason: str
    error: str
    retryable: bool
    status: int | None = None


class MessageSource(_Model):
    """Where a dead-lettered message came from."""

    stream: str
    subject: str
    seq: int | None = None


class DeadLetter(Message):
    """A task or result that will not be retried, and why."""

    task_id: str | None = None
    stage: Literal["dispatch", "worker", "reaper", "ingester"]
    reason: str
    """Stable code: ``timeout``, ``http_404``, ``blocked_by_policy``, ``malformed_message`` …"""
    error: str
    url: str | None = None
    host: str | None = None
    attempts: tuple[AttemptRecord, ...] = ()
    task: ScrapeTask | None = None
    """The task itself, so ``busscrape dlq replay`` can queue it again."""
    result: ScrapeResult | None = None
    payload: str | None = None
    """The start of an undecodable payload (for poison messages)."""
    source: MessageSource | None = None
    dead_at: datetime = Field(default_factory=utcnow)
    truncated: tuple[str, ...] = ()
    """What was cut so that the letter fits in one message (``texts``, ``result``, ``task``,
    ``attempts``: see ``model.bounds``); ``source`` and the task id still name the task."""


# -- codec --------------------------------------------------------------------------------------

M = TypeVar("M", bound=Message)


def encode(message: Message) -> bytes:
    """The wire form of a message: compact JSON, without the ``omit_when_default`` fields that
    hold their defaults."""
    data = message.model_dump(mode="python", exclude_defaults=False)
    fields = type(message).model_fields
    for name in message.omit_when_default:
        if getattr(message, name) == fields[name].default:
            del data[name]
    return orjson.dumps(data)


def decode(kind: type[M], data: bytes | str) -> M:
    """Parse ``data`` as a ``kind`` message or raise ``MessageDecodeError`` saying what is wrong."""
    try:
        raw: Any = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise MessageDecodeError(
            f"{kind.__name__}: payload is not JSON ({exc}); starts with {preview(data)!r}",
            reason="not_json",
        ) from None
    if not isinstance(raw, dict):
        raise MessageDecodeError(
            f"{kind.__name__}: payload is JSON {type(raw).__name__}, not an object", reason="not_an_object"
        )
    version = raw.get("schema_version")
    if version != SCHEMA_VERSION:
        said = "missing" if version is None else repr(version)
        raise MessageDecodeError(
            f"{kind.__name__}: schema_version {said}; this busscrape reads version {SCHEMA_VERSION}",
            reason="unsupported_schema_version",
        )
    try:
        return kind.model_validate(raw)
    except ValidationError as exc:
        detail = describe_validation_error(exc)
        raise MessageDecodeError(f"{kind.__name__}: {detail}", reason="invalid_schema") from None


_SAYS_GOT = frozenset({"literal_error", "int_parsing", "float_parsing", "bool_parsing", "greater_than",
                       "greater_than_equal", "less_than", "less_than_equal"})


def describe_validation_error(exc: ValidationError, limit: int = 5) -> str:
    """``url: required; options.viewport.width: must be at least 320`` (first few errors), in a few
    words rather than pydantic's (``Field required``, ``Input should be …``)."""
    from busscrape.settings.problems import reason

    parts = []
    for err in exc.errors()[:limit]:
        where = ".".join(str(p) for p in err["loc"])
        why = "unknown field" if err["type"] == "extra_forbidden" else reason(err)
        if err["type"] in _SAYS_GOT and isinstance(err.get("input"), str | int | float):
            why += f" (got {err['input']!r})"  # an enumeration's or a number's: never free text, a header's
        parts.append(f"{where}: {why}" if where else why)  # no place: the whole input is wrong
    more = exc.error_count() - limit
    if more > 0:
        parts.append(f"… and {more} more")
    return "; ".join(parts)


def preview(data: bytes | str, limit: int = 120) -> str:
    """The start of a payload as text, for error messages and dead letters."""
    if isinstance(data, bytes):
        data = data[: limit * 4].decode("utf-8", errors="replace")
    return data[:limit] + ("…" if len(data) > limit else "")
