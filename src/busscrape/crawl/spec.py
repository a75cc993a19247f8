"""A crawl's rules (``CrawlSpec``), its id, and the ids of its tasks.

A crawl is named by what it is: ``crawl_id`` is a digest of its seeds, rules and task template,
so the same command run again (after Ctrl-C, or after a crash) is the same crawl and resumes it.
A task of a crawl has an id of its own (``crawl_task_id``): the crawl's id mixed with the
dispatcher's ``task_key``, so one page is one task within a crawl, while another crawl of the
same site renders it again.
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime
from typing import Literal

import orjson
import regex  # the engine crawl.scope runs include/exclude with (Python re syntax, a time bound)
from pydantic import Field, field_validator

from busscrape.model.messages import Message, TaskOptions, task_key
from busscrape.model.steps import Step, Steps

Scope = Literal["page", "prefix", "host", "domain", "any"]
SCOPES: tuple[Scope, ...] = ("page", "prefix", "host", "domain", "any")
DEFAULT_FOLLOW = "a[href], area[href], link[rel=next][href]"
DEFAULT_ROBOTS_AGENT = "busscrape"


class CrawlSpec(Message):
    """What to crawl and how far. Stored in CRAWLS as ``<crawl_id>.spec``; every worker reads it
    from there (a task carries only its ``CrawlRef``)."""

    seeds: tuple[str, ...] = Field(min_length=1)
    """The normalised seed URLs (depth 0)."""
    scope: Scope = "host"
    """Which links are followed: ``page`` (none: the seeds only), ``prefix`` (URLs under a seed's
    path), ``host`` (a seed's host), ``domain`` (a seed's registrable domain, public-suffix aware),
    ``any``."""
    include: tuple[str, ...] = ()
    """Regexes; when given, a link must match one of them (searched in the normalised URL)."""
    exclude: tuple[str, ...] = ()
    """Regexes; a link that matches one is not followed."""
    depth: int = Field(3, ge=0, le=1000)
    """Pages up to this depth are archived; links found at this depth are not followed."""
    max_pages: int | None = Field(None, ge=1)
    """At most this many pages of the crawl are queued (and so archived), across the fleet."""
    robots: Literal["obey", "ignore"] = "obey"
    robots_agent: str = Field(DEFAULT_ROBOTS_AGENT, min_length=1, max_length=64)
    """The user-agent token robots.txt groups are matched against."""
    follow: str = Field(DEFAULT_FOLLOW, min_length=1, max_length=1000)
    """CSS selector of the elements whose ``href`` is a link to follow."""
    sitemaps: bool = False
    """Seed the crawl with the URLs of the seeds' sitemaps (robots-declared and /sitemap.xml)."""
    sitemap_since: datetime | None = None
    """Only sitemap URLs whose ``lastmod`` is at or after this."""
    steps: Steps = ()
    """Steps of every page of the crawl."""
    options: TaskOptions = TaskOptions()
    """Task options of every page of the crawl."""
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("follow")
    @classmethod
    def _selector(cls, selector: str) -> str:
        # Refused here, once, rather than by the browser on every page of the crawl.
        from cssselect import GenericTranslator, SelectorError

        try:
            GenericTranslator().css_to_xpath(selector)
        except SelectorError as exc:
            raise ValueError(f"{selector!r} is not a CSS selector: {exc}") from None
        return selector

    @field_validator("include", "exclude")
    @classmethod
    def _regexes(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in patterns:
            try:
                regex.compile(pattern)
            except regex.error as exc:
                raise ValueError(f"{pattern!r} is not a regular expression: {exc}") from None
        return patterns

    @property
    def crawl_id(self) -> str:
        """16 hex chars of sha256 over the spec: the same crawl has the same id."""
        body = orjson.dumps(self.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
        return hashlib.sha256(b"crawl:" + body).hexdigest()[:16]


CRAWL_ID = re.compile(r"[0-9a-f]{16}")
"""What a crawl id looks like (``CrawlSpec.crawl_id``): anything else is a malformed id, not an unknown crawl."""


def crawl_task_id(crawl_id: str, url: str, steps: tuple[Step, ...] = (), options: TaskOptions | None = None, *,
                  tail: bytes | None = None) -> str:
    """The task id of ``url`` in crawl ``crawl_id`` (``tail``: ``identity_tail(steps, options)``,
    when the caller has it already)."""
    return hashlib.sha256(f"{crawl_id}:{task_key(url, steps, options, tail=tail)}".encode()).hexdigest()[:32]
