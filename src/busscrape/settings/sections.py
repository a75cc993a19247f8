"""The sections of the settings, one model each (``BUSSCRAPE_<SECTION>__<FIELD>``).

Every field has a docstring: ``busscrape config`` prints it and docs/configuration.md's table is
made from it (``reference``). Defaults are for a small machine and the embedded default;
docs/operations.md says what to raise in production.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    SerializationInfo,
    field_serializer,
    field_validator,
    model_validator,
)

from busscrape.settings.lists import CommaList, SwitchList
from busscrape.units import Duration, Size

__all__ = [
    "ApiSettings",
    "ArchiveSettings",
    "BrowserSettings",
    "DispatchSettings",
    "ExtractSettings",
    "IngesterSettings",
    "NatsSettings",
    "NetworkPolicySettings",
    "ProxySettings",
    "S3Settings",
    "SearchSettings",
    "StreamSettings",
    "TelemetrySettings",
    "WorkerSettings",
]

# ``scheme://userinfo@rest`` (the userinfo ends at the last @ before the path).
_URL_USERINFO = re.compile(r"^(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<userinfo>[^/]*)@(?P<rest>[^@]*)$", re.I)


class _Section(BaseModel):
    # Defaults in human form ("14d", "8GiB") are written Field("14d", validate_default=True): the
    # validator turns them into the field's type, and that argument tells a type checker so.
    model_config = ConfigDict(extra="forbid", validate_default=True)


class NatsSettings(_Section):
    """How to reach NATS. Credentials come only from here (env or files), never from flags."""

    url: str | None = None
    """Server URL(s), comma-separated (``nats://host:4222``, ``tls://…``). Unset: ``busscrape run``
    and ``busscrape demo`` start an embedded nats-server; the daemons fall back to
    ``nats://127.0.0.1:4222``. Credentials in it (``nats://user:pass@host``, ``nats://token@host``)
    are moved to ``user``/``password`` or ``token``, where they are masked."""
    user: str | None = None
    """User name for user/password authentication."""
    password: SecretStr | None = None
    """Password for user/password authentication."""
    token: SecretStr | None = None
    """Token for token authentication."""
    creds_file: Path | None = None
    """A ``.creds`` file (user JWT + nkey seed, as ``nsc generate creds`` writes it) for
    decentralised (operator/JWT) authentication."""
    nkey_seed_file: Path | None = None
    """A file holding a user nkey seed (``SU…``, one line) for nkey authentication."""
    tls_ca_file: Path | None = None
    """CA bundle (PEM) used to verify the server's certificate (turns TLS on)."""
    tls_cert_file: Path | None = None
    """Client certificate (PEM) for mutual TLS (with ``tls_key_file``; turns TLS on)."""
    tls_key_file: Path | None = None
    """Client key (PEM) for mutual TLS."""
    tls_hostname: str | None = None
    """Server name to verify in the certificate when it differs from the URL's host."""
    connect_timeout: Duration = 5.0
    """How long to wait for the first connection before giving up."""
    request_timeout: Duration = 10.0
    """Timeout of JetStream API requests and synchronous publishes."""
    server_binary: str | None = None
    """Path of the nats-server binary for the embedded server (default: found on PATH)."""
    server_memory: Size = Field("1GiB", ge=64 * 2**20, validate_default=True)
    """Memory the embedded nats-server is given: its Go runtime's soft limit (``GOMEMLIMIT``) is
    90% of it, as compose, the Kubernetes manifests and the NATS Helm chart set it from the
    container's limit (a ``GOMEMLIMIT`` in the environment wins)."""
    monitor_url: str | None = None
    """The server's HTTP monitoring endpoint (``http://nats:8222``). When set, ``busscrape status``
    reads the workers' lag from its ``/jsz`` exactly as KEDA's nats-jetstream scaler does;
    unset, it asks the JetStream API (same numbers on a single server)."""
    monitor_account: str = "$G"
    """The account whose ``/jsz`` details hold the streams (``$G``: the default account, as in
    KEDA's ``account`` trigger field)."""

    @model_validator(mode="before")
    @classmethod
    def _credentials_out_of_url(cls, data: Any) -> Any:
        # The URL is shown (`busscrape config`, error messages); a secret inside it would be too.
        if not isinstance(data, dict) or not isinstance(data.get("url"), str) or "@" not in data["url"]:
            return data
        data = dict(data)
        urls = []
        for url in data["url"].split(","):
            match = _URL_USERINFO.match(url.strip())
            if match is None:
                urls.append(url.strip())
                continue
            user, colon, password = match["userinfo"].partition(":")
            # What the variables say wins over what the URL says.
            if colon:
                if data.get("user") is None:
                    data["user"] = user
                if data.get("password") is None:
                    data["password"] = password
            elif data.get("token") is None:
                data["token"] = user
            urls.append(match["scheme"] + match["rest"])
        data["url"] = ",".join(urls)
        return data

    def server_urls(self) -> list[str]:
        """The configured server URLs, or the local default."""
        if not self.url:
            return ["nats://127.0.0.1:4222"]
        return [u.strip() for u in self.url.split(",") if u.strip()]


class StreamSettings(_Section):
    """The knobs that ``streams/*.toml`` refer to as ``{streams.<name>}``."""

    definitions_dir: Path | None = None
    """Folder of stream definitions to apply instead of the bundled ``streams/``."""
    replicas: int = Field(1, ge=1, le=5)
    """Replicas of every stream and bucket (3 on a clustered production server)."""
    tasks_max_age: Duration = Field("14d", validate_default=True)
    """How long an unprocessed task may wait in TASKS before it is discarded."""
    duplicate_window: Duration = Field("10m", validate_default=True)
    """How long ``Nats-Msg-Id`` de-duplication remembers a publish (TASKS, RESULTS, DEADLETTER, ARTIFACTS)."""
    results_max_age: Duration = Field("7d", validate_default=True)
    """How long results stay in RESULTS (the ingester normally takes them in seconds)."""
    results_max_bytes: Size = Field("8GiB", validate_default=True)
    """Upper bound on RESULTS size; -1 for none. Results carry references, not page bytes; what
    RESULTS holds is the ingesters' backlog (``results_keep_acked``), so this is how long an
    ingester or archive outage it absorbs (docs/operations.md has the figures).
    When it is full, workers pause (back-pressure) until the ingesters catch up."""
    results_keep_acked: Duration = Field("1h", validate_default=True)
    """How long a result stays in RESULTS once every durable consumer of it has acknowledged it
    (for readers that follow the stream without one); then the ingesters purge it."""
    deadletter_max_age: Duration = Field("90d", validate_default=True)
    """How long dead letters are kept for ``busscrape dlq``."""
    recrawl_window: Duration = Field("30d", validate_default=True)
    """Longest recrawl window the SEEN bucket can hold (``--recrawl-after`` may be shorter)."""
    artifacts_ttl: Duration = Field("8d", validate_default=True)
    """Safety-net TTL of the ARTIFACTS object store; longer than ``results_max_age``."""
    attempts_ttl: Duration = Field("14d", validate_default=True)
    """How long a task's attempt history is kept."""
    folder_lease_ttl: Duration = Field("30s", ge=2, validate_default=True)
    """How long an ingester's lease on an archive folder lasts unrenewed (it renews it while it
    writes): what a killed ingester's folder waits before another one may write it."""
    status_ttl: Duration = Field("30d", validate_default=True)
    """How long the STATUS bucket remembers what happened to a task."""
    worker_ack_wait: Duration = Field("60s", validate_default=True)
    """Redelivery delay of a task whose worker went silent (workers heartbeat well inside it)."""
    worker_max_deliver: int = Field(5, ge=1)
    """Deliveries of one task before it is dead-lettered."""
    worker_max_deferrals: int = Field(100_000, ge=0)
    """Deliveries that do not reach the page (a task deferred because its host was at its limit,
    or one that met an outage) one task may have on top of ``worker_max_deliver``: the consumer's
    own ``max_deliver`` is the sum, while the worker counts only the attempts that reached the page."""
    host_lease_ttl: Duration = Field("15s", ge=2, validate_default=True)
    """How long a worker's hold on a host slot lasts unrenewed (it renews every third): what a
    killed worker's slot waits before the fleet may use it again."""
    worker_max_ack_pending: int = Field(20_000, ge=1)
    """Tasks in flight across the whole worker fleet."""
    def worker_deliveries(self) -> int:
        """The workers consumer's ``max_deliver``: attempts plus deferrals."""
        return self.worker_max_deliver + self.worker_max_deferrals

    ingester_ack_wait: Duration = Field("120s", validate_default=True)
    """Redelivery delay of a result whose ingester went silent."""
    max_msg_size: Size = Field("1MiB", validate_default=True)
    """Largest message accepted by TASKS and RESULTS; page bytes travel in ARTIFACTS."""
    compression: Literal["s2", "none"] = "s2"
    """Store compression of TASKS, SEEN and STATUS (``s2`` or ``none``): their messages are JSON
    that repeats itself from task to task: ``s2`` took a queued task from 1,187 B (``/jsz``) to
    328 B on disk (docs/operations.md: capacity planning) for a little server CPU. Set when a stream is made: a
    change to an existing one is applied to its configuration, but measured on nats-server 2.15
    the file store keeps writing as before (``streams apply --recreate`` an empty one)."""


class DispatchSettings(_Section):
    """``busscrape dispatch``."""

    window: int = Field(4096, ge=1)
    """Publishes in flight before waiting for acknowledgements."""
    max_url_length: int = Field(2048, ge=16)
    """Longest URL accepted (after normalisation)."""
    strip_tracking: bool = False
    """Drop tracking parameters (``utm_*``, ``fbclid``, …) before de-duplication."""
    tracking_params: CommaList = [
        "utm_*", "fbclid", "gclid", "dclid", "gbraid", "wbraid", "msclkid", "mc_cid", "mc_eid",
        "yclid", "igshid", "_ga", "_gl", "_hsenc", "_hsmi", "mkt_tok", "oly_anon_id", "oly_enc_id",
        "vero_id", "rb_clickid", "s_cid", "ref_src",
    ]
    """Parameter names (``*`` wildcard) that ``strip_tracking`` removes, comma-separated
    (``utm_*,ref``) or a JSON array."""
    sort_query: bool = False
    """Sort query parameters so that ``?b=1&a=2`` and ``?a=2&b=1`` are one URL."""
    recrawl_after: Duration = Field("7d", validate_default=True)
    """A URL dispatched again within this window is skipped as already seen (1s up to
    ``streams.recrawl_window``, the longest the SEEN bucket keeps a key)."""
    publish_retries: int = Field(3, ge=0)
    """Retries of a publish that failed or timed out before it is counted as failed."""
    publish_outage_wait: Duration = Field("2m", validate_default=True)
    """How long a publish NATS does not take (no PubAck, ``503 no responders`` while a stream
    elects a leader or a node restarts) keeps being retried, beyond ``publish_retries``: an
    outage shorter than this costs the dispatch time, not URLs."""
    drain_timeout: Duration = Field("5s", validate_default=True)
    """On SIGINT/SIGTERM, how long PubAcks still in flight are waited for (the rest: unconfirmed)."""
    sitemap_max_urls: int = Field(100_000, ge=1)
    """Seeds a crawl takes from its sitemaps (``--sitemaps``); the crawl's seed record counts
    those left out (``sitemaps.cut.urls``)."""
    sitemap_max_files: int = Field(1000, ge=1)
    """Requests made to read one crawl's sitemaps (robots.txt, index files, gzip ones and the
    known sitemap paths tried included); those not made are counted in the seed record
    (``sitemaps.cut.files``)."""
    sitemap_max_bytes: Size = Field("50MiB", validate_default=True)
    """Most bytes read of one sitemap file (the sitemaps protocol allows 50 MB uncompressed); a
    longer one is read up to here and named in the seed record (``sitemaps.truncated``)."""


class BrowserSettings(_Section):
    """The Chromium the workers drive."""

    executable_path: Path | None = None
    """Chromium binary. Default: Playwright's own if installed, else a system Chromium."""
    headless: bool = True
    """Run without a window."""
    extra_args: SwitchList = []
    """More Chromium command-line switches, comma-separated (``--foo,--window-size=1280,800``: a
    comma starts a new switch only before a dash) or a JSON array."""
    no_sandbox: bool | None = None
    """Pass ``--no-sandbox`` (default: only when running as root, where Chromium needs it)."""

    @field_validator("extra_args")
    @classmethod
    def _no_feature_lists(cls, args: list[str]) -> list[str]:
        # Chromium keeps only the last --disable-features / --enable-features: one here would
        # replace Playwright's own lists (HttpsUpgrades off, CDPScreenshotNewSurface on, ...).
        for arg in args:
            if arg.split("=", 1)[0] in ("--disable-features", "--enable-features"):
                raise ValueError(f"{arg!r}: Chromium keeps only the last {arg.split('=', 1)[0]}, so this one would "
                                 "replace the list Playwright passes; busscrape cannot merge them")
        return args


class WorkerSettings(_Section):
    """``busscrape worker``."""

    name: str = Field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    """Name recorded in results and logs."""
    concurrency: int = Field(4, ge=1, le=256)
    """Browser pages rendering at once (a worker fetches only when one is free)."""
    navigation_timeout: Duration = Field("30s", validate_default=True)
    """Default navigation timeout of a task (a task may set its own)."""
    task_timeout: Duration = Field("120s", validate_default=True)
    """Hard limit on one task from start to result, steps included."""
    grace_period: Duration = Field("30s", validate_default=True)
    """On the first SIGTERM, how long in-flight tasks may finish before they are handed back."""
    retry_statuses: str = "408,425,429,500-599"
    """HTTP statuses that are retried (then dead-lettered when retries run out)."""
    dead_statuses: str = "400-499"
    """HTTP statuses that dead-letter at once (unless also in ``retry_statuses``)."""
    retry_base_delay: Duration = Field("2s", validate_default=True)
    """First retry delay; doubles each attempt, with jitter, capped by ``retry_max_delay``."""
    retry_max_delay: Duration = Field("5m", validate_default=True)
    """Longest retry delay (a larger ``Retry-After`` is capped to this)."""
    outage_budget: Duration = Field("6h", gt=0, validate_default=True)
    """How long one task may keep meeting an outage (NATS, a bucket, the object store or S3 not
    answering), from the first delivery that met one, before it is dead-lettered
    ``outage_exceeded``. Outages spend no attempt; this is what keeps a task from waiting for
    ever. Keep it well under ``streams.tasks_max_age``."""
    isolation: Literal["tab", "context"] = "tab"
    """``tab``: each slot reuses one context and page, wiped between tasks (cookies, storage,
    cache, history: see busscrape/worker/browser/tabs.py), the faster; ``context``: a fresh context per task
    (docs/performance.md compares them)."""
    tab_max_uses: int = Field(100, ge=1)
    """Tasks one reused tab serves before it is replaced by a new one."""
    tab_wipe_delay: Duration = Field("500ms", validate_default=True)
    """How long a used tab waits, its scripts paused, before it is wiped, while other tabs are
    ready and no task waits for one: Chromium's clean-up then does not compete for the CPU with
    the upload and archiving of the task just rendered. 0: wipe at once."""
    recycle_after_tasks: int = Field(500, ge=1)
    """Relaunch the browser after this many tasks, to shed leaked memory."""
    recycle_rss: Size = Field("3GiB", validate_default=True)
    """Relaunch the browser when Chromium's processes use more than this."""
    host_concurrency: int = Field(2, ge=1)
    """Pages open on one host at once across the whole worker fleet (leases in the HOSTS bucket)."""
    host_delay: Duration = 0.0
    """Minimum time between two page starts at one host across the whole fleet."""
    fleet_politeness: bool = True
    """Enforce the host limits below across the fleet (NATS KV round trips per page); false: no
    per-host limits at all (for crawls whose hosts are far more than the fleet's pages in flight)."""
    host_jitter: Duration = 0.0
    """A random extra gap, 0 to this, added to ``host_delay`` after each start at a host."""
    host_rules: Path | None = None
    """A politeness file (TOML, ``[[host]]`` tables of ``glob``, ``concurrency``, ``delay``, ``jitter``):
    per-host limits by glob, the first match wins (docs/politeness.md)."""
    sessions_file: Path | None = None
    """The sessions file (TOML, ``[[session]]`` tables: ``name`` glob, ``login_url``, ``login_steps``,
    ``check_selector``, ``check_url``, ``ttl``): how a task's ``options.session`` logs in."""
    host_busy_retry: Duration = Field("500ms", gt=0, validate_default=True)
    """How soon a task whose host is at its ``host_concurrency`` comes back (nak'ed with this delay,
    jittered ±50%, a deferral: no attempt, no browser slot)."""
    cool_default: Duration = Field("10s", ge=0, validate_default=True)
    """How long a 429 or 503 without ``Retry-After`` cools its host for the whole fleet (0: not at all)."""
    allow_evaluate: bool = False
    """Allow the ``evaluate`` step (runs task-supplied JavaScript in the page)."""
    max_page_bytes: Size = Field("32MiB", validate_default=True)
    """Largest page accepted (its Content-Length, then its rendered HTML); larger ones dead-letter
    with ``page_too_large``."""
    max_har_bytes: Size = Field("100MB", validate_default=True)
    """Largest HAR accepted; response bodies are dropped first, then the task fails."""
    max_warc_bytes: Size = Field("100MB", validate_default=True)
    """Most bytes of payload (bodies, the DOM, screenshots) one page's WARC holds; what comes
    after is recorded without its body (``WARC-Truncated: length``)."""
    archive_session_cookies: Literal["masked", "kept"] = "masked"
    """What the HAR and WARC of a session's page keep of its cookies (``Cookie`` and
    ``Set-Cookie`` headers, which hold the session's login): ``masked``, their values replaced by
    ``[masked]`` (safe to share the archive; a replay is logged out), or ``kept`` (as on the
    wire, as Browsertrix keeps them: the replay is logged in, and the archive holds a token
    that may still open the account). Pages without a session keep their cookies either way;
    the login itself is never recorded."""
    warc_revisits: Literal["page", "worker"] = "page"
    """What a WARC ``revisit`` record may refer to instead of storing a body again: ``page``, a
    response earlier in the same page's WARC (every page's WARC, and any WACZ of some of the
    pages, stands alone); ``worker``, also one in a page this worker archived before (smaller
    WARCs, but a page's WARC replays only beside the WARC holding the original, so a WACZ of a
    subset of the pages may miss bodies)."""
    max_warc_body_bytes: Size = Field("20MiB", validate_default=True)
    """Most bytes of one response body in a WARC; a longer body is cut (``WARC-Truncated: length``)."""
    max_screenshot_height: int = Field(4096, ge=256)
    """Full-page screenshots are cut at this many CSS pixels (about five screens): a very long page
    costs no more than a page this tall (docs/performance.md has the figures)."""
    max_steps: int = Field(100, ge=1)
    """Most steps a task may carry."""
    reaper: bool = True
    """Also run the dead-delivery reaper (moves tasks that ran out of deliveries)."""
    stray_chunk_interval: Duration = Field("5m", validate_default=True)
    """How often this worker looks for artifact chunks that no object names any more (left by
    kills and outages; purged when seen twice in a row). Never less than 4 × ``nats.request_timeout``
    (a put's placeholder meta may be resent that long after its first chunks). 0: never (the
    ARTIFACTS TTL still collects them)."""
    max_tasks: int | None = None
    """Exit after this many tasks (bounded runs and tests)."""
    exit_when_idle: Duration | None = None
    """Exit when no task arrived for this long."""


class ExtractSettings(_Section):
    """Extractors (``extractors/*.toml``): where they are, and how a worker runs them."""

    dir: Path = Path("extractors")
    """Folder of extractor files, one ``<name>.toml`` each, loaded and checked at start (an invalid one
    stops the process with the file, the field and the reason)."""
    processes: int = Field(1, ge=1, le=64)
    """Extraction processes per worker: extractors run beside the event loop, never in it, so a slow
    or crashing extractor stalls no render and kills no worker."""
    timeout: Duration = Field("10s", gt=0, validate_default=True)
    """Longest one extraction may take; then its process is replaced and the task retried
    (``extraction_timeout``)."""
    max_memory: Size = Field("1GiB", ge=64 * 1024 * 1024, validate_default=True)
    """Address space of one extraction process (a page that makes an extractor allocate more fails the
    extraction, not the machine)."""
    max_record_bytes: Size = Field("256KiB", ge=1024, validate_default=True)
    """Largest extracted record (as JSON) a result carries; a larger one dead-letters the task as
    ``record_too_large`` (results must fit in RESULTS' ``max_msg_size``)."""


class NetworkPolicySettings(_Section):
    """Where pages may connect. By default only public addresses."""

    allow: CommaList = []
    """CIDRs (``127.0.0.2/32``) and ``host:port`` pairs opened despite being non-public,
    comma-separated (``127.0.0.2/32,intranet:443``) or a JSON array."""


class ProxySettings(_Section):
    """Upstream proxies (``net/upstream.py``, ``net/proxies.py``): pools, rotation, health, routes."""

    pools: dict[str, list[str]] = {}
    """Named pools of proxy URLs (``http://``, ``https://``, ``socks5://``, credentials in the URL),
    as JSON: ``{"main": ["http://user:pass@10.0.0.5:3128", "socks5://10.0.0.6:1080"]}``. Shown
    without credentials everywhere (``busscrape config`` too)."""
    pool_files: dict[str, Path] = {}
    """Pools read from files, one proxy URL a line (``#`` comments), as JSON ``{"name": "path"}``."""
    routes: dict[str, str] = {}
    """Host glob → pool, first match wins, as JSON: ``{"*.example.com": "main"}``."""
    default_pool: str | None = None
    """The pool of hosts no route names (none: they go direct)."""
    rotation: Literal["round_robin", "random", "sticky_host", "sticky_session"] = "round_robin"
    """How a pool's next proxy is chosen: in turn, at random, the same one per host, or per session
    (tasks without a session then go in turn)."""
    bench_after: int = Field(3, ge=1)
    """Consecutive failures (the proxy unreachable, or refusing the tunnel) after which a proxy is benched."""
    bench_for: Duration = Field("60s", gt=0, validate_default=True)
    """How long a benched proxy is left out before it is tried again."""

    @field_serializer("pools")
    def _masked(self, pools: dict[str, list[str]], info: SerializationInfo) -> dict[str, list[str]]:
        if (info.context or {}).get("reveal_secrets"):
            return pools
        from busscrape.net.upstream import masked

        return {name: [masked(url) for url in urls] for name, urls in pools.items()}


class S3Settings(_Section):
    """S3 for the archive. The fixed-key form (MinIO): setting the endpoint selects it. An
    ``s3://`` archive location (``BUSSCRAPE_ARCHIVE__URL``, ``--archive``) uses these settings too,
    with AWS's own credential chain when no keys are set here."""

    endpoint: str | None = None
    """``host:port`` of the S3 endpoint, or a URL (``https://minio:9000``)."""
    access_key: SecretStr | None = None
    """Access key id (fixed keys; unset: AWS's credential chain, ``AWS_PROFILE``, web identity …)."""
    secret_key: SecretStr | None = None
    """Secret access key."""
    bucket: str = "busscrape"
    """Bucket (created if missing) when the endpoint selects S3."""
    region: str = "us-east-1"
    """Region name sent with requests."""
    secure: bool = False
    """Use TLS (https)."""
    ca_file: Path | None = None
    """CA bundle (PEM) to verify the endpoint's certificate (default: the system's CAs); needs TLS
    (``secure`` or an ``https://`` endpoint)."""
    part_size: Size = Field("16MiB", ge=5 * 2**20, le=5 * 2**30, validate_default=True)
    """Objects larger than this are uploaded in parts of this size (multipart, on every object
    store: S3, GCS, Azure; 5MiB to 5GiB). Each object being archived holds at most one part in memory."""


class ArchiveSettings(_Section):
    """Where results are archived."""

    url: str | None = None
    """Archive location: ``s3://bucket/prefix``, ``gs://bucket/prefix``, ``az://container/prefix``
    or a folder (unset: the S3 endpoint's bucket when ``BUSSCRAPE_S3__ENDPOINT`` is set, else
    ``dir``). Credentials come from each cloud's standard environment (docs/storage.md)."""
    dir: Path | None = None
    """Local archive folder when no S3 endpoint is set (default: ``<state_dir>/archive``)."""
    prefix: str = ""
    """Key prefix inside the bucket or folder."""
    compress: bool = True
    """Store HTML, HAR and text gzip-compressed (``page.html.gz`` …, readable with zcat)."""
    gzip_level: int = Field(1, ge=1, le=9)
    """zlib level of that compression: 1 is several times faster than 6 for files about a third
    larger (docs/performance.md has the figures)."""


class IngesterSettings(_Section):
    """``busscrape ingester``."""

    name: str = Field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    """Name recorded in logs."""
    concurrency: int = Field(8, ge=1, le=256)
    """Results archived at once."""
    upload_concurrency: int = Field(8, ge=1, le=64)
    """Objects uploaded at once across all results."""
    retry_base_delay: Duration = Field("1s", validate_default=True)
    """First redelivery delay of a result that could not be stored; doubles per delivery, with jitter."""
    retry_max_delay: Duration = Field("60s", validate_default=True)
    """Longest redelivery delay while the storage is unreachable."""
    grace_period: Duration = Field("30s", validate_default=True)
    """On the first SIGTERM, how long in-flight results may finish before they are handed back."""
    max_results: int | None = None
    """Exit after this many results (bounded runs and tests)."""
    exit_when_idle: Duration | None = None
    """Exit when no result arrived for this long."""


class SearchSettings(_Section):
    """The full-text index the ingester feeds and ``busscrape search`` / ``GET /search`` read."""

    backend: Literal["sqlite", "postgres", "off"] = "sqlite"
    """``sqlite`` (FTS5, one local file: the embedded default), ``postgres`` (tsvector + GIN: production,
    several ingesters), or ``off``."""
    sqlite_path: Path | None = None
    """The SQLite index file (default: ``<state_dir>/search.sqlite3``, beside the default archive folder)."""
    postgres_dsn: SecretStr | None = None
    """``postgresql://user:password@host:5432/db`` for the ``postgres`` backend (needs ``busscrape[postgres]``)."""
    postgres_config: str = Field("simple", pattern=r"^[a-z_][a-z0-9_]*$")
    """PostgreSQL text-search configuration (``simple``: no stemming, any language; ``english`` …). It applies
    to pages indexed from then on and to every query, so choose it before the index fills."""
    max_text_bytes: Size = Field("1MiB", ge=1024, validate_default=True)
    """How much of each page's visible text is indexed (the archive keeps all of it)."""
    queue: int = Field(1000, ge=1)
    """Pages waiting to be indexed in one ingester; when full, archiving waits for the index."""
    timeout: Duration = Field("10s", validate_default=True)
    """Longest wait for one index write or search before it counts as failed."""


class ApiSettings(_Section):
    """``busscrape api``: the HTTP API."""

    host: str = "127.0.0.1"
    """Address to listen on (``0.0.0.0`` for every interface)."""
    port: int = Field(8080, ge=0, le=65535)
    """Port to listen on; 0 picks a free one."""
    token: SecretStr | None = None
    """Bearer token every request but ``/healthz`` and ``/openapi.json`` must carry (unset: no auth)."""
    max_body_bytes: Size = Field("1MiB", ge=1024, validate_default=True)
    """Largest request body accepted (413 above it)."""
    max_tasks: int = Field(1000, ge=1)
    """Most tasks one ``POST /tasks`` may carry."""
    max_search_results: int = Field(100, ge=1, le=1000)
    """Most results one search returns (``limit`` above it is refused)."""


class TelemetrySettings(_Section):
    """Logs, metrics and health endpoints (tracing follows the standard ``OTEL_*`` variables)."""

    log_format: Literal["auto", "json", "console"] = "auto"
    """``json`` lines, ``console`` (pretty), or ``auto``: pretty on a terminal, JSON otherwise."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Lowest level logged."""
    http_host: str = "0.0.0.0"
    """Address the daemons' ``/healthz``, ``/readyz`` and ``/metrics`` listen on."""
    http_port: int | None = 9464
    """Port of that server; 0 picks a free one, ``none`` turns it off. Left at the default, a daemon
    that finds it taken (a worker and an ingester on one host) takes a free one and logs it
    (``health.port_taken``, ``health.listening``); a port set here that is taken is exit 2."""
