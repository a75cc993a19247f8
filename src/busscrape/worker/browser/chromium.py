"""Which Chromium to drive, and the switches it runs with.

Playwright's own build is preferred where ``playwright install chromium`` could fetch it; on
machines where it cannot (no route to its download host), a system Chromium is used through
``executable_path``. Nothing is hard-coded: the configured path wins, then Playwright's, then
the usual system names on PATH.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from busscrape.errors import BinaryNotFound
from busscrape.settings import BrowserSettings

SYSTEM_NAMES = ("chromium", "chromium-browser", "google-chrome-stable", "google-chrome", "chrome")

# Quiet, deterministic Chromium: no background traffic to Google, no first-run UI, no
# /dev/shm exhaustion in containers, no QUIC (all traffic goes through the policy proxy).
BASE_ARGS = (
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--disable-features=Translate,MediaRouter,OptimizationHints,InterestFeedContentSuggestions",
    "--disable-breakpad",
    "--metrics-recording-only",
    "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
)


@dataclass(frozen=True)
class ChromiumBinary:
    path: str | None
    """Path to pass as ``executable_path``; None means Playwright's own build."""
    source: str
    """``configured``, ``playwright`` or ``system``."""


def playwright_chromium() -> str | None:
    """Playwright's downloaded Chromium, when it is on disk."""
    try:
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            path = p.chromium.executable_path
    except Exception:
        return None
    return path if path and Path(path).is_file() else None


def find_chromium(settings: BrowserSettings | None = None) -> ChromiumBinary | None:
    """The Chromium to launch, or None when there is none."""
    configured = settings.executable_path if settings else None
    if configured:
        if Path(configured).is_file() and os.access(configured, os.X_OK):
            return ChromiumBinary(str(configured), "configured")
        return None
    if playwright_chromium():
        return ChromiumBinary(None, "playwright")
    for name in SYSTEM_NAMES:
        path = shutil.which(name)
        if path:
            return ChromiumBinary(path, "system")
    return None


def require_chromium(settings: BrowserSettings) -> ChromiumBinary:
    """Like ``find_chromium`` but raises ``BinaryNotFound`` with the ways to get one."""
    found = find_chromium(settings)
    if found is None:
        where = f"at {settings.executable_path}" if settings.executable_path else "(Playwright's or on PATH)"
        raise BinaryNotFound(
            f"no Chromium found {where}. Run `playwright install chromium`, or install the system's "
            "(`apt-get install chromium`), or set BUSSCRAPE_BROWSER__EXECUTABLE_PATH"
        )
    return found


def launch_args(settings: BrowserSettings, extra: tuple[str, ...] = ()) -> list[str]:
    """Chromium switches: the base set, --no-sandbox only when root needs it, then extras."""
    args = list(BASE_ARGS)
    no_sandbox = settings.no_sandbox if settings.no_sandbox is not None else os.geteuid() == 0
    if no_sandbox:
        args.append("--no-sandbox")
    args += list(extra) + list(settings.extra_args)
    return args
