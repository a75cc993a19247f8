"""mkdocs hooks (``hooks:`` in mkdocs.yml): the generated parts of the documentation.

A page holds a marker where generated text goes; at build time the marker is replaced with what
the code says now, so the configuration and CLI references cannot drift from busscrape:

- ``<!-- generated: settings -->``: every setting, ``busscrape config --markdown``
  (``busscrape.settings.reference.reference_markdown``);
- ``<!-- generated: cli -->``: every command and option, read off the Typer app
  (``busscrape.cli.reference.cli_reference_markdown``).

A marker that names no generator fails the build, as does a generator whose marker is missing from
every page (a moved or deleted reference page must not silently drop its table).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from mkdocs.exceptions import PluginError

MARKER = re.compile(r"<!-- generated: ([a-z-]+) -->")


def _settings() -> str:
    from busscrape.settings.reference import reference_markdown

    return reference_markdown()


def _cli() -> str:
    from busscrape.cli.reference import cli_reference_markdown

    return cli_reference_markdown()


GENERATORS: dict[str, Callable[[], str]] = {"settings": _settings, "cli": _cli}
_used: set[str] = set()


def expand(markdown: str, where: str = "page") -> str:
    """``markdown`` with each marker replaced by its generated text."""

    def generate(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise PluginError(f"{where}: unknown generated section {name!r} (known: {sorted(GENERATORS)})")
        _used.add(name)
        return GENERATORS[name]()

    return MARKER.sub(generate, markdown)


def on_pre_build(config: Any) -> None:
    _used.clear()


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return expand(markdown, page.file.src_uri)


def on_post_build(config: Any) -> None:
    missing = sorted(set(GENERATORS) - _used)
    if missing:
        raise PluginError(f"no page holds the generated section(s) {missing}: add <!-- generated: NAME --> back")
