"""Extractions beside the worker's event loop: in child processes that may hang or die.

An extractor is the user's declaration, but the page is anyone's: a hostile page can make lxml
work for seconds, a regular expression backtrack for minutes, a parser allocate gigabytes or
crash. None of that may block the loop that renders the other pages or kill the worker. So every
extraction runs in an ``ExtractionPool`` process (spawned on the first extraction, never forked
from the loop; address space capped by ``extract.max_memory``), loaded once with the registry's
extractors::

    the extractor returns ─────────────────► its Outcome (record, missing fields, warnings)
    the extractor raises ──────────────────► ExtractionFailed (permanent: the same page raises again)
    no answer within extract.timeout ──────► the processes are killed (new ones start for the next);
                                              ExtractionStalled(extraction_timeout): retried
    the process died (segfault, OOM kill) ─► the same; ExtractionStalled(extraction_crashed): retried

Other extractions that were running in the replaced processes are retried the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING, Any

import structlog

from busscrape.errors import ExtractionFailed, ExtractionStalled
from busscrape.extract.definition import Extractor
from busscrape.extract.registry import Registry

if TYPE_CHECKING:  # the engine (lxml, parsel, price-parser) is the child processes' to import, not the worker's
    from busscrape.extract.engine import Outcome

log = structlog.get_logger("busscrape.extract")

_EXTRACTORS: dict[str, Extractor] = {}  # in a child process: what it was loaded with


def _child_start(definitions: dict[str, dict[str, Any]], max_memory: int | None) -> None:
    """A child's start: the memory cap, the extractors, and the parsers imported before the first page."""
    if max_memory:
        import resource

        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_AS, (max_memory, max_memory))
    from busscrape.extract.python import PythonExtractor

    for name, definition in definitions.items():
        _EXTRACTORS[name] = (PythonExtractor if "python" in definition else Extractor).model_validate(definition)
    from busscrape.extract import engine

    engine.run(Extractor.model_validate({"name": "warm-up", "version": 1, "fields": {
        "a": {"jsonld": "*.a"}, "b": {"microdata": "*.b"}, "c": {"opengraph": "og:c"}, "d": {"css": "p"}}}),
        "<html><body><p>warm</p></body></html>", "http://localhost/")


def _child_run(name: str, html: str, url: str, status: int | None = None,
               headers: dict[str, str] | None = None) -> tuple[str, Any]:
    """In the child: ``("ok", outcome)``, ``("error", text)`` or ``("not_json", text)``; never an
    exception to pickle."""
    from busscrape.extract import engine
    from busscrape.extract.python import RecordNotJson

    try:
        return "ok", engine.run(_EXTRACTORS[name], html, url, status, headers)
    except RecordNotJson as exc:
        return "not_json", str(exc)[:500]
    except RecursionError:
        return "error", "RecursionError: the page is nested too deeply for the extractor"
    except MemoryError:
        return "error", "MemoryError: the extraction needed more than extract.max_memory"
    except Exception as exc:  # the last line of its traceback (a message's own last line)
        lines = str(exc).strip().splitlines()
        return "error", f"{type(exc).__name__}: {lines[-1][:500] if lines else ''}".rstrip(": ")


class ExtractionPool:
    """``async with ExtractionPool(registry, ...) as pool: outcome = await pool.extract(name, html, url)``."""

    def __init__(self, registry: Registry, *, processes: int = 1, timeout: float = 10.0,
                 max_memory: int | None = None) -> None:
        self.registry = registry
        self.processes = processes
        self.timeout = timeout
        self.max_memory = max_memory
        self.replaced = 0
        """How many times the processes were replaced (timeouts, crashes)."""
        self._executor: ProcessPoolExecutor | None = None
        self._definitions = {name: e.model_dump(exclude_unset=True) for name, e in registry.items()}
        self._entered = False
        self._starting = asyncio.Lock()

    async def __aenter__(self) -> ExtractionPool:
        if self._entered:
            raise RuntimeError("an ExtractionPool can be entered only once")
        self._entered = True
        return self

    async def _ready(self) -> ProcessPoolExecutor:
        """The processes, started on the first extraction (a worker whose tasks name no extractor
        never starts them), and waited for outside any extraction's timeout: spawning and importing
        the parsers takes a second or two."""
        async with self._starting:
            if self._executor is None:
                executor = self._start()
                loop = asyncio.get_running_loop()
                await asyncio.gather(*(loop.run_in_executor(executor, os.getpid) for _ in range(self.processes)))
                self._executor = executor
            return self._executor

    async def __aexit__(self, *exc: object) -> None:
        if self._executor is not None:
            self._kill(self._executor)
            self._executor = None

    def _start(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(self.processes, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_child_start, initargs=(self._definitions, self.max_memory))

    def _kill(self, executor: ProcessPoolExecutor) -> None:
        processes = list((getattr(executor, "_processes", None) or {}).values())
        executor.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            with contextlib.suppress(Exception):
                process.kill()

    def _replace(self, broken: ProcessPoolExecutor) -> None:
        """Away with processes that hung or died (once, however many extractions saw it); the next
        extraction starts new ones."""
        if self._executor is broken:
            self._kill(broken)
            self._executor = None
            self.replaced += 1

    async def extract(self, name: str, html: str, url: str, status: int | None = None,
                      headers: dict[str, str] | None = None) -> Outcome:
        """Run extractor ``name`` on the page in a child process (raises ``ExtractionFailed`` or
        ``ExtractionStalled``); ``status`` and ``headers`` are for Python extractors."""
        if not self._entered:
            raise RuntimeError("the ExtractionPool is not entered")
        executor = await self._ready()
        future = asyncio.get_running_loop().run_in_executor(executor, _child_run, name, html, url, status, headers)
        try:
            async with asyncio.timeout(self.timeout):
                outcome, value = await future
        except TimeoutError:
            log.warning("extraction.timeout", extractor=name, url=url, timeout=self.timeout)
            self._replace(executor)
            raise ExtractionStalled(f"extractor {name!r} did not finish in {self.timeout:g}s (extract.timeout); "
                                    "its process was replaced", reason="extraction_timeout") from None
        except BrokenProcessPool:
            log.warning("extraction.crashed", extractor=name, url=url)
            self._replace(executor)
            raise ExtractionStalled(f"the extraction process died running {name!r}; it was replaced",
                                    reason="extraction_crashed") from None
        if outcome == "error":
            raise ExtractionFailed(f"extractor {name!r} raised on this page: {value}")
        if outcome == "not_json":
            raise ExtractionFailed(f"extractor {name!r}: {value}", reason="extraction_not_json")
        record: Outcome = value
        return record
