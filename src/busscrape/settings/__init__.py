"""One settings object for every busscrape process (``environment``), in sections (``sections``).

Values come from (highest first) CLI flags, ``BUSSCRAPE_*`` environment variables (sections
nested with ``__``: ``BUSSCRAPE_NATS__URL``, ``BUSSCRAPE_WORKER__CONCURRENCY``), a ``.env`` file,
then the defaults. The CLI builds it once and passes it down; nothing reads the
environment anywhere else. ``busscrape config`` prints the effective values (secrets masked).
"""

from busscrape.settings import sections
from busscrape.settings.environment import Settings, settings_env
from busscrape.settings.sections import *  # noqa: F403 - the sections are part of the public API

__all__ = ["Settings", "settings_env", *sections.__all__]
