"""The files a render stores, and their content types: one list for the worker that writes them
and for everyone who must find them by name (the clean-up of attempts that died, the archive).

An object in ARTIFACTS is named ``<task_id>/<task_seq>/<attempt>/<file>`` (``store.object_name``),
and the files follow from the task alone, so the objects of any attempt can be named without
asking anyone what it stored.
"""

from __future__ import annotations

from busscrape.model.messages import ScrapeTask
from busscrape.model.steps import Screenshot

HTML_FILE, TEXT_FILE, HAR_FILE = "page.html", "page.txt", "page.har"
WARC_FILE = "page.warc.gz"
"""Gzip per record already (as WARC readers expect): stored as it is, never compressed again."""
CONTENT_TYPES = {"html": "text/html; charset=utf-8", "text": "text/plain; charset=utf-8",
                 "har": "application/json", "png": "image/png", "jpeg": "image/jpeg", "warc": "application/warc"}


def screenshot_file(task: ScrapeTask, step: str | None = None) -> str:
    """``screenshot.png`` for the page, ``shot-<step>.png`` for a screenshot step (``.jpg`` for JPEG)."""
    ext = "jpg" if task.options.screenshot.format == "jpeg" else "png"
    return f"shot-{step}.{ext}" if step else f"screenshot.{ext}"


def capture_files(task: ScrapeTask) -> list[str]:
    """Every file a render of ``task`` stores: how the objects of an attempt that died are found."""
    wanted = task.options.artifacts
    files = [file for kind, file in (("html", HTML_FILE), ("text", TEXT_FILE), ("har", HAR_FILE),
                                     ("warc", WARC_FILE)) if kind in wanted]
    if "screenshot" in wanted:
        files.append(screenshot_file(task))
    return files + [screenshot_file(task, step.name) for step in task.steps if isinstance(step, Screenshot)]
