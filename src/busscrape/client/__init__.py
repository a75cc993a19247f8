"""busscrape from Python: ``busscrape.run`` and ``busscrape.crawl``, what ``busscrape run`` and
``busscrape crawl`` do, in the caller's event loop::

    summary = await busscrape.run(["https://a.example/1"], archive="out/", extractor="product")

    async with busscrape.crawl("https://a.example/", depth=2, max_pages=100, output="pages.jsonl") as crawl:
        async for page in crawl:
            print(page.url, page.status, page.title, page.extracted, page.folder)
    print(crawl.summary.archived)

Keyword arguments are the command's long options (``client.arguments``), ``config=`` a file of
them (``--config``), ``output=`` a dataset (``-o``). Without ``nats_url`` (or
``BUSSCRAPE_NATS__URL``) the run is the embedded default: its own nats-server and daemons,
stopped when the run ends or the ``async with`` is left (``ops.session``).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Generator
from typing import TYPE_CHECKING, Any

from busscrape.client.summary import Summary
from busscrape.dataset.pages import Page

if TYPE_CHECKING:
    from busscrape.ops.session import RunSession

__all__ = ["Page", "Run", "Summary", "crawl", "run"]


class Run:
    """A run or a crawl from Python: ``await`` it for its ``Summary``, or ``async with`` it and
    iterate its pages (each archived or dead page once, as it lands); ``summary`` once it is over."""

    def __init__(self, name: str, positional: list[str], kwargs: dict[str, Any], *, dead: bool) -> None:
        from busscrape.client.arguments import plan

        handoff = plan(name, positional, kwargs)  # ConfigurationError now, before anything starts
        self.settings = handoff.settings
        self.options = handoff.options
        self.dead = dead
        self.summary: Summary | None = None
        self._session: RunSession | None = None

    def __await__(self) -> Generator[Any, None, Summary]:
        return self._complete().__await__()

    async def _complete(self) -> Summary:
        async with self._open(collect=False) as _:
            assert self._session is not None
            await self._session.finish()
        assert self.summary is not None
        return self.summary

    def _open(self, *, collect: bool) -> Run:
        from busscrape.ops.session import RunSession

        if self._session is not None:
            raise RuntimeError("a busscrape run can be started only once: call busscrape.run/crawl again")
        self._session = RunSession(self.settings, self.options, dead=self.dead, collect=collect)
        return self

    async def __aenter__(self) -> Run:
        if self._session is None:
            self._open(collect=True)
        assert self._session is not None
        await self._session.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        """Left before the run is over (a ``break``, an exception, a cancellation): it stops, as
        on Ctrl-C, and every process it started with it. The summary is there once it has."""
        assert self._session is not None
        await self._session.__aexit__(*exc)
        if self._session.result is not None:
            self.summary = Summary.of(self._session.result)

    def __aiter__(self) -> AsyncIterator[Page]:
        if self._session is None or not self._session.started:
            raise RuntimeError("iterate a run inside `async with busscrape.run(...) as run:`")
        return self._session


def run(inputs: str | os.PathLike[str] | list[str | dict[str, Any]] | None = None, /, *, dead: bool = True,
        **options: Any) -> Run:
    """``busscrape run`` from Python. ``inputs``: URLs and task specs (dicts shaped like the JSONL
    task lines), a path to an input file, or None with ``config=`` giving ``input``."""
    positional: list[str] = []
    if isinstance(inputs, list | tuple):
        from busscrape.cli.config_file import spill

        positional = [spill(list(inputs))]
    elif isinstance(inputs, str) and "://" in inputs:
        from busscrape.cli.config_file import spill

        positional = [spill([inputs])]
    elif inputs is not None:
        positional = [os.fspath(inputs)]
    return Run("run", positional, options, dead=dead)


def crawl(seeds: str | list[str] | None = None, /, *, dead: bool = True, **options: Any) -> Run:
    """``busscrape crawl`` from Python: ``seeds`` one URL or a list (or None with ``config=``)."""
    positional = [seeds] if isinstance(seeds, str) else list(seeds or [])
    return Run("crawl", positional, options, dead=dead)
