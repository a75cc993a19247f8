"""Full-text search over archived pages: the index interface (``index``) and its SQLite and
PostgreSQL backends, and the feed that fills it from the ingester (``feed``). ``open_index``
picks the backend from the settings; the interface imports no backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from busscrape.errors import ConfigurationError
from busscrape.search.index import SearchIndex

if TYPE_CHECKING:
    from busscrape.settings import Settings

__all__ = ["SearchIndex", "open_index"]


def open_index(settings: Settings) -> SearchIndex:
    """The configured index, not yet entered. ``ConfigurationError`` when search is off or misconfigured."""
    cfg = settings.search
    if cfg.backend == "sqlite":
        from busscrape.search.sqlite import SqliteIndex

        return SqliteIndex(settings.search_path(), timeout=cfg.timeout)
    if cfg.backend == "postgres":
        if cfg.postgres_dsn is None:
            raise ConfigurationError("BUSSCRAPE_SEARCH__BACKEND=postgres needs BUSSCRAPE_SEARCH__POSTGRES_DSN "
                                     "(postgresql://user:password@host:5432/db)")
        from busscrape.search.postgres import PostgresIndex

        return PostgresIndex(cfg.postgres_dsn.get_secret_value(), config=cfg.postgres_config, timeout=cfg.timeout)
    raise ConfigurationError("search is off (BUSSCRAPE_SEARCH__BACKEND=off); set it to sqlite or postgres, and "
                             "let the ingester index what it archives")
