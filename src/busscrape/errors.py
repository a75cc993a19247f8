"""The error tree. Each class says what happens to the message that raised it.

::

    BusscrapeError
    ├── RetryableError ............ nak with a delay; redelivered until max_deliver, then dead-lettered
    │   ├── NavigationTimeout         the page or a step did not finish in time
    │   ├── PageNetworkError          DNS, connection refused/reset, TLS …
    │   ├── BrowserCrashed            the tab or the whole browser died (relaunched first)
    │   ├── RetryableStatus           429 / 5xx per policy; honours Retry-After
    │   ├── StorageUnavailable        NATS, a bucket, the object store or S3 not answering: an
    │   │                             outage, which spends no attempt in the worker
    │   ├── ExtractionStalled         the extractor's process timed out or died (it is replaced)
    │   └── ShuttingDown              the worker is stopping; handed back without delay
    ├── PermanentError ............ dead-lettered at once with the reason, never retried
    │   ├── MessageDecodeError        the payload is not a valid message (not JSON, schema, version)
    │   ├── InvalidTask               a decoded task that cannot run (bad steps, evaluate disabled …)
    │   ├── PolicyBlocked             the network policy refused a URL (scheme, non-public address)
    │   ├── PermanentStatus           an HTTP status policy says is final (404 …)
    │   ├── LimitExceeded             page, HAR, steps, screenshot or message over a configured limit
    │   │   └── PayloadTooLarge         a message or KV value over what NATS takes (never a retry)
    │   ├── ArtifactUnusable          an artifact expired from the object store or fails its sha256
    │   ├── ExtractionFailed          a required field is missing, or the extractor raised
    │   └── StorageRefused            the archive refused an object for what it is (a name too long)
    ├── ConfigurationError ........ the process exits at start with a fix-it message (exit code 2)
    │   ├── NatsUnavailable           cannot connect to NATS
    │   ├── StreamsMissing            a stream, consumer or bucket is not there: run `streams apply`
    │   ├── StreamConflict            a change JetStream cannot make (retention, storage …)
    │   ├── BinaryNotFound            no nats-server or Chromium on this machine
    │   └── AuthenticationFailed      NATS or S3 refused the credentials (exit code 3)
    └── InputError ................ a bad input line for the dispatcher: reported, never published

``reason`` is a short stable code (``timeout``, ``http_404``, ``blocked_private_address`` …)
that dead letters, metrics and ``busscrape dlq list --reason`` use.
"""

from __future__ import annotations

# Exit codes, documented in docs/exit-codes.md and `busscrape --help`.
EXIT_OK = 0
EXIT_PARTIAL = 1  # some input rejected under --strict, some publishes failed, tasks dead-lettered
EXIT_CONFIG = 2  # cannot connect, streams missing, bad settings
EXIT_AUTH = 3  # credentials refused
EXIT_INTERRUPTED = 130  # SIGINT / Ctrl-C


def said(exc: BaseException) -> str:
    """What an exception says, or its type when it says nothing (a timeout's text is empty; an
    exception object itself is always true, so ``exc or …`` never reaches the type)."""
    return str(exc) or type(exc).__name__


class BusscrapeError(Exception):
    """Base of every error busscrape raises on purpose."""

    reason = "error"

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if reason is not None:
            self.reason = reason

    def __str__(self) -> str:
        return self.message


# -- retry later ------------------------------------------------------------------------------


class RetryableError(BusscrapeError):
    """Nak the message with a delay; the next delivery may succeed."""

    reason = "retryable"

    def __init__(self, message: str, *, reason: str | None = None, retry_after: float | None = None):
        super().__init__(message, reason=reason)
        self.retry_after = retry_after
        """Seconds the origin asked us to wait (Retry-After), if it said."""


class NavigationTimeout(RetryableError):
    reason = "timeout"


class PageNetworkError(RetryableError):
    reason = "network_error"


class BrowserCrashed(RetryableError):
    reason = "browser_crashed"


class RetryableStatus(RetryableError):
    reason = "http_status"


class StorageUnavailable(RetryableError):
    """Something the task needs from outside the page did not answer: NATS, a bucket, the object
    store, S3 (no responders, a timeout, a leader election, a disconnect), or the worker's own
    network changed under a navigation. An outage, not the page's failure: in the worker it
    spends no attempt (``worker.outages``)."""

    reason = "storage_unavailable"

    def __init__(self, message: str, *, reason: str | None = None, retry_after: float | None = None,
                 what: str = "NATS") -> None:
        super().__init__(message, reason=reason, retry_after=retry_after)
        self.what = what
        """What was unavailable: a stream or bucket name, ``S3``, ``NATS``, or ``network`` (the
        worker's own network changed under a navigation)."""


class ExtractionStalled(RetryableError):
    """The extraction process did not answer in time (``extraction_timeout``) or died
    (``extraction_crashed``); it was replaced, and the task goes to another attempt."""

    reason = "extraction_timeout"


class ShuttingDown(RetryableError):
    """Handed back to the queue at once so another worker takes it."""

    reason = "shutting_down"


# -- dead-letter now ----------------------------------------------------------------------------


class PermanentError(BusscrapeError):
    """Dead-letter the message with the reason; retrying cannot help."""

    reason = "permanent"


class MessageDecodeError(PermanentError):
    """A payload that is not a valid message. ``reason`` says which way it is wrong."""

    reason = "malformed_message"


class InvalidTask(PermanentError):
    reason = "invalid_task"


class PolicyBlocked(PermanentError):
    reason = "blocked_by_policy"


class PermanentStatus(PermanentError):
    reason = "http_status"


class LimitExceeded(PermanentError):
    reason = "limit_exceeded"


class PayloadTooLarge(LimitExceeded):
    """A message or KV value larger than the server takes (its ``max_payload``, or the stream's
    ``max_msg_size`` / the bucket's ``max_value_size``). Sending it again cannot help, so it is
    never one of ``bus.retry.TRANSIENT`` (nats-py's own ``MaxPayloadError`` is a
    ``nats.errors.Error``, and would be): ``bus.payloads`` raises this instead, before the write."""

    reason = "payload_too_large"


class ArtifactUnusable(PermanentError):
    reason = "artifact_unusable"


class ExtractionFailed(PermanentError):
    """The page does not give the extractor's record: a required field is missing (the message names
    it), or the extractor raised on it. Rendering the same page again gives the same answer."""

    reason = "extraction_failed"


class StorageRefused(PermanentError):
    """The storage refused an object for what it is, not for how it is doing (a name it cannot
    hold, an object too large): the same object will be refused again."""

    reason = "storage_refused"


# -- exit at start ------------------------------------------------------------------------------


class ConfigurationError(BusscrapeError):
    """The process cannot start as configured; ``message`` says how to fix it."""

    reason = "configuration"
    exit_code = EXIT_CONFIG


class NatsUnavailable(ConfigurationError):
    reason = "nats_unavailable"


class SeedsUnchecked(ConfigurationError):
    """A crawl that obeys robots.txt could not read a seed's: nothing was queued, the crawl
    cannot start yet (the same command again starts it once the site answers)."""

    reason = "robots_unavailable"


class StreamsMissing(ConfigurationError):
    reason = "streams_missing"


class StreamConflict(ConfigurationError):
    reason = "stream_conflict"


class BinaryNotFound(ConfigurationError):
    reason = "binary_not_found"


class AuthenticationFailed(ConfigurationError):
    reason = "authentication_failed"
    exit_code = EXIT_AUTH


# -- bad input ----------------------------------------------------------------------------------


class InputError(BusscrapeError):
    """A rejected input line. ``reason`` is one of the dispatcher's rejection codes."""

    reason = "invalid_input"
