"""The dispatcher's input, streamed: URL lists and JSONL task specs, plain or gzipped, file or stdin.

Two formats, one line each:

- a URL list: one URL per line; blank lines and ``#`` comments are skipped; every URL gets
  the command line's steps, options and labels (``TaskDefaults``);
- JSONL task specs: ``{"url": ..., "steps": [...], "labels": {...}, "artifacts": [...], ...}``
  where every ``TaskOptions`` field may appear at the top level; what a line leaves out comes
  from the defaults (labels and nested options such as ``viewport`` are merged key by key).

Gzip is recognised by its magic bytes, so ``urls.txt.gz``, ``specs.jsonl.gz`` and a gzipped
stdin all work. Lines are read by a daemon thread in batches, a few batches ahead, so memory
stays flat however large the input is and the event loop keeps serving PubAcks while the disk
(or a slow pipe) catches up. A line never crashes the reader: bytes that are not UTF-8, JSON
that does not parse, a spec that does not validate, a line over ``MAX_LINE_BYTES``, even a
truncated gzip stream, each become a ``Rejection`` with the line number and a reason code.
"""

from __future__ import annotations

import asyncio
import gzip
import io
import os
import select
import stat
import sys
import threading
import zlib
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Literal, NamedTuple

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from busscrape.errors import ConfigurationError
from busscrape.model.messages import TaskOptions, describe_validation_error
from busscrape.model.steps import Step, Steps
from busscrape.printable import visible

InputFormat = Literal["auto", "urls", "jsonl"]
Source = str | os.PathLike[str] | Iterable[str]
"""A path, ``-`` for stdin, or (from Python) any iterable of lines."""

REASONS = ("invalid_encoding", "invalid_json", "invalid_task", "line_too_long", "unreadable_input")
"""Rejection codes of the reader itself (URL problems add ``urls.REASONS``)."""

MAX_LINE_BYTES = 1024 * 1024
"""A longer line is skipped (read through, never held) and rejected as ``line_too_long``."""
TEXT_PREVIEW = 200
"""How much of a rejected line is reported."""
_GZIP_MAGIC = b"\x1f\x8b"
_JSONL_SUFFIXES = (".jsonl", ".ndjson", ".jsonl.gz", ".ndjson.gz")


@dataclass(frozen=True)
class TaskDefaults:
    """What every task gets unless its input line says otherwise (the command-line options)."""

    steps: tuple[Step, ...] = ()
    options: TaskOptions = field(default_factory=TaskOptions)
    labels: dict[str, str] = field(default_factory=dict)


class TaskSpec(NamedTuple):
    """One valid input line: a URL as written and how to render it (a tuple: one per line, made cheaply)."""

    line: int
    url: str
    steps: tuple[Step, ...]
    options: TaskOptions
    labels: dict[str, str]
    crawl: dict[str, Any] | None = None
    """A ``crawl`` block: the line's URL seeds a crawl with these rules (``crawl.spec.CrawlSpec``)."""


class Rejection(NamedTuple):
    """One input line that will not be published, and why."""

    line: int
    reason: str
    detail: str
    text: str
    """The start of the line (``TEXT_PREVIEW`` characters), undecodable bytes escaped."""

    def as_dict(self) -> dict[str, Any]:
        return self._asdict()


def preview(text: str | bytes) -> str:
    """The start of a line for a report: at most ``TEXT_PREVIEW`` characters, bytes and control
    characters escaped (a rejected line may be anything, escape sequences included)."""
    if isinstance(text, bytes):
        text = text[: TEXT_PREVIEW * 4].decode("utf-8", errors="backslashreplace")
    return visible(text[:TEXT_PREVIEW]) + ("…" if len(text) > TEXT_PREVIEW else "")


def detect_format(source: Source, requested: InputFormat = "auto") -> InputFormat:
    """``jsonl`` for ``*.jsonl`` / ``*.ndjson`` (gzipped or not); for any other name (and stdin)
    ``auto``: the parser decides on the first line (``LineParser``)."""
    if requested != "auto":
        return requested
    if isinstance(source, str | os.PathLike) and str(source).lower().endswith(_JSONL_SUFFIXES):
        return "jsonl"
    return "auto"


class _SpecLine(BaseModel):
    """The non-option fields of a JSONL line; everything else is a ``TaskOptions`` field."""

    model_config = ConfigDict(extra="allow", frozen=True)

    url: str = Field(min_length=1)
    steps: Steps | None = None
    labels: dict[str, str] | None = None
    crawl: dict[str, Any] | None = None


class LineParser:
    """Turns one raw line into a ``TaskSpec``, a ``Rejection``, or None (blank or comment)."""

    def __init__(self, fmt: InputFormat, defaults: TaskDefaults) -> None:
        self.format = fmt
        """``auto`` until the first line that is not blank or a comment: JSONL when it opens with
        ``{`` (no URL does), else a URL list (``zcat specs.jsonl.gz | busscrape dispatch -``)."""
        self.defaults = defaults
        self._option_defaults = defaults.options.model_dump()

    def __call__(self, number: int, raw: bytes | str) -> TaskSpec | Rejection | None:
        if isinstance(raw, bytes):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                return Rejection(number, "invalid_encoding", f"not UTF-8: {exc.reason} at byte {exc.start}",
                                 preview(raw))
        else:
            text = raw
        text = text.strip()
        if not text or text.startswith("#"):
            return None
        if self.format == "auto":
            self.format = "jsonl" if text.startswith("{") else "urls"
        if self.format == "urls":
            d = self.defaults
            return TaskSpec(number, text, d.steps, d.options, d.labels)
        return self._spec(number, text)

    def _spec(self, number: int, text: str) -> TaskSpec | Rejection:
        try:
            doc = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            return Rejection(number, "invalid_json", str(exc), preview(text))
        if not isinstance(doc, dict):
            return Rejection(number, "invalid_task", f"a JSON object is expected, not {type(doc).__name__}",
                             preview(text))
        try:
            line = _SpecLine.model_validate(doc)
            overrides = line.model_extra or {}
            options = self.defaults.options
            if overrides:
                merged = dict(self._option_defaults)
                for key, value in overrides.items():
                    base = merged.get(key)
                    merged[key] = {**base, **value} if isinstance(base, dict) and isinstance(value, dict) else value
                options = TaskOptions.model_validate(merged)
        except ValidationError as exc:
            return Rejection(number, "invalid_task", describe_validation_error(exc), preview(text))
        steps = self.defaults.steps if line.steps is None else line.steps
        labels = self.defaults.labels if line.labels is None else {**self.defaults.labels, **line.labels}
        if line.crawl is not None:
            from busscrape.crawl.spec import CrawlSpec

            try:  # checked here, with the line's number; the seed is normalised by the dispatcher
                CrawlSpec.model_validate({**line.crawl, "seeds": (line.url,)})
            except ValidationError as exc:
                return Rejection(number, "invalid_crawl", "crawl: " + describe_validation_error(exc), preview(text))
        return TaskSpec(number, line.url, steps, options, labels, line.crawl)


class _Pipe(io.RawIOBase):
    """A pipe or terminal that never blocks for long: the reader thread waits in ``select`` in
    short steps, so it notices ``close()``, and it says when it is about to wait (``on_idle``) so
    the lines it holds go out at once instead of sitting in a half-full batch.
    """

    def __init__(self, fd: int, stopped: Callable[[], bool], on_idle: Callable[[], None]) -> None:
        super().__init__()
        self._fd = fd
        self._stopped = stopped
        self._on_idle = on_idle

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def readinto(self, buffer: Any) -> int:
        if not select.select([self._fd], [], [], 0)[0]:
            self._on_idle()
            while not select.select([self._fd], [], [], 0.2)[0]:
                if self._stopped():
                    return 0  # closed by the consumer: end of input as far as we are concerned
        return os.readv(self._fd, [buffer])

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()


def _descriptor(source: str | os.PathLike[str]) -> int | None:
    """An own descriptor for the source (stdin is duplicated, so closing ours leaves it alone);
    None when stdin has no descriptor (replaced by an in-memory stream)."""
    if str(source) == "-":
        try:
            return os.dup(sys.stdin.fileno())
        except (AttributeError, OSError, ValueError):
            return None
    try:
        return os.open(source, os.O_RDONLY)
    except OSError as exc:
        raise ConfigurationError(f"cannot read the input {source}: {exc.strerror or exc}") from None


def _lines(stream: BinaryIO, limit: int) -> Iterator[tuple[int, bytes | None, bytes]]:
    """(number, line or None when over ``limit``, its start) for every line; CR LF tolerated."""
    number = 0
    while True:
        raw = stream.readline(limit)
        if not raw:
            return
        number += 1
        if number == 1 and raw.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark is not part of the URL
            raw = raw[3:]
        if len(raw) >= limit and not raw.endswith(b"\n"):
            head = raw[:TEXT_PREVIEW]
            while (more := stream.readline(limit)) and not more.endswith(b"\n"):
                pass
            yield number, None, head
            continue
        yield number, raw.rstrip(b"\r\n"), raw


class InputReader:
    """Reads a source in a background thread and hands out parsed lines in batches.

    ``async for batch in reader: ...``; ``close()`` stops the thread. Pipes and terminals are
    read through ``_Pipe``, so an idle stdin neither delays the lines already read nor keeps
    the thread (or interpreter shutdown) waiting.
    """

    def __init__(self, source: Source, parser: LineParser, *, batch_size: int = 512, ahead: int = 4,
                 max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self.source = source
        self.parser = parser
        self.batch_size = batch_size
        self.max_line_bytes = max_line_bytes
        self.bytes_total: int | None = None
        """Size of the input file when known (plain or compressed), for a progress bar."""
        self.bytes_read = 0
        """How far into that file the reader is."""
        self._room = threading.Semaphore(ahead)
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stream: Any = None
        self._owned = True
        self._batch: list[TaskSpec | Rejection] = []
        if isinstance(source, str | os.PathLike):
            # Opened here, in the caller, so a missing file is an error at start, not a rejected line.
            fd = _descriptor(source)
            mode = os.fstat(fd).st_mode if fd is not None else 0
            if fd is None:
                self._stream, self._owned = sys.stdin.buffer, False
            elif stat.S_ISDIR(mode):
                os.close(fd)
                raise ConfigurationError(f"the input {source} is a directory; give a file, or - for stdin")
            elif stat.S_ISREG(mode):
                self._stream = os.fdopen(fd, "rb")
                self.bytes_total = os.fstat(fd).st_size
            else:
                self._stream = io.BufferedReader(_Pipe(fd, lambda: self._closed, self._flush))

    def __aiter__(self) -> AsyncIterator[list[TaskSpec | Rejection]]:
        return self._batches()

    async def _batches(self) -> AsyncIterator[list[TaskSpec | Rejection]]:
        if self._thread is None:
            self._loop = asyncio.get_running_loop()
            self._thread = threading.Thread(target=self._produce, name="dispatch-input", daemon=True)
            self._thread.start()
        while True:
            item = await self._queue.get()
            self._room.release()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        """Stop reading: the thread notices within a line (or 0.2s on an idle pipe) and closes the input."""
        self._closed = True
        self._room.release()
        if self._thread is None:
            self._close_stream()

    def _close_stream(self) -> None:
        if self._stream is not None and self._owned:
            self._stream.close()

    def _produce(self) -> None:
        try:
            for item in self._items():
                if self._closed:
                    return
                self._batch.append(item)
                if len(self._batch) >= self.batch_size:
                    self._flush()
            self._flush()
        except BaseException as exc:  # reported to the consumer, which decides
            self._hand_over(exc)
        finally:
            self._close_stream()
            self._hand_over(None)

    def _flush(self) -> None:
        """Pass on the lines read so far (a full batch, the end, or a pipe about to wait)."""
        if self._batch:
            batch, self._batch = self._batch, []
            self._hand_over(batch)

    def _items(self) -> Iterator[TaskSpec | Rejection]:
        parse = self.parser
        if self._stream is None:
            for number, text in enumerate(self.source, 1):  # type: ignore[arg-type]
                if (item := parse(number, text)) is not None:
                    yield item
            return
        number = 0
        try:
            stream = self._stream
            if stream.peek(2)[:2] == _GZIP_MAGIC:
                stream = gzip.GzipFile(fileobj=stream, mode="rb")
            for number, line, head in _lines(stream, self.max_line_bytes):
                if line is None:
                    yield Rejection(number, "line_too_long", f"more than {self.max_line_bytes} bytes", preview(head))
                elif (item := parse(number, line)) is not None:
                    yield item
                if number % self.batch_size == 0:
                    self._note_position()
        except (OSError, EOFError, zlib.error) as exc:
            # A truncated or corrupt gzip, a failing disk: what was read stands, the rest cannot be.
            yield Rejection(number + 1, "unreadable_input", f"{type(exc).__name__}: {exc}", "")
        self._note_position()

    def _note_position(self) -> None:
        if self.bytes_total is None:
            return
        try:
            self.bytes_read = self._stream.tell()
        except (OSError, ValueError, AttributeError):
            pass

    def _hand_over(self, item: Any) -> None:
        """Queue an item for the event loop, waiting while ``ahead`` batches are unread."""
        while not self._room.acquire(timeout=0.5):
            if self._closed:
                return
        if self._closed and item is not None:
            return
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is gone: nobody is listening any more
            self._closed = True


def open_reader(source: Source, fmt: InputFormat = "auto", defaults: TaskDefaults | None = None,
                **kwargs: Any) -> InputReader:
    """An ``InputReader`` for ``source`` with the format detected from its name."""
    defaults = defaults or TaskDefaults()
    if isinstance(source, Path):
        source = str(source)
    return InputReader(source, LineParser(detect_format(source, fmt), defaults), **kwargs)
