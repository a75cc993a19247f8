"""Which Chromium to drive, and the switches it runs with.

Playwright's own build is preferred where ``playwright install chromium`` could fetch it; on
machines where it cannot (no route to its download host), a system Chromium is used through
``executable_path``. Nothing is hard-coded: the configured path wins, then Playwright's, then
the usual system names on PATH.

Headless, the system choice is the *headless shell* (Debian's ``chromium-headless-shell``), as
Playwright itself picks its ``chromium-headless-shell`` build for headless runs. Full Chromium in
its "new" headless mode waits for a login prompt nobody can answer whenever a subresource asks for
HTTP authentication: the request, and so the page's ``load``, hang until the navigation times out
(and a 401 main document becomes ``net::ERR_INVALID_AUTH_CREDENTIALS`` instead of a status). The
shell has no prompt: the 401 reaches the page, and the task's status policy, as it is.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from busscrape.errors import BinaryNotFound
from busscrape.settings import BrowserSettings

SYSTEM_NAMES = ("chromium", "chromium-browser", "google-chrome-stable", "google-chrome", "chrome")
HEADLESS_SHELL_NAMES = ("chromium-headless-shell", "chrome-headless-shell")
# Debian's /usr/bin/chromium-headless-shell is a shell script that runs this binary without
# ``exec``: a shell would sit between Playwright and the browser. The binary itself comes first.
HEADLESS_SHELL_BINARIES = ("/usr/lib/chromium/chromium-headless-shell",)

# Quiet, deterministic Chromium: no background traffic to Google, no first-run UI, no
# /dev/shm exhaustion in containers, no QUIC (all traffic goes through the policy proxy).
# No --disable-features here: Playwright passes its own list (HttpsUpgrades, PaintHolding,
# ThirdPartyStoragePartitioning and more) and Chromium keeps only the last such switch, so ours
# would silently replace it (settings refuse one in extra_args for the same reason).
BASE_ARGS = (
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--disable-breakpad",
    "--metrics-recording-only",
    "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
)

# Behind the egress proxy the browser must never resolve a name itself: SOCKS5 hands names to
# the proxy, yet Chromium still looks some up on its own (a netlog shows lookups for an <img>'s
# host, and for Google's update and account hosts), which would leak what a page asks for to the
# machine's resolver. Every name maps to "not found"; the proxy's own address is an IP literal,
# excluded so that the rule can never touch it. One argv element: no shell quoting to get wrong.
PROXIED_ARGS = ("--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",)


@dataclass(frozen=True)
class ChromiumBinary:
    path: str | None
    """Path to pass as ``executable_path``; None means Playwright's own build."""
    source: str
    """``configured``, ``playwright`` or ``system``."""
    headless_shell: bool = False
    """A headless shell (no login prompts, no window), or Playwright's build, which picks its own
    headless shell when headless."""


def playwright_browsers() -> Path:
    """Where ``playwright install`` puts browsers (``PLAYWRIGHT_BROWSERS_PATH``, ``0`` meaning
    inside the package, else the user's cache), as Playwright's registry resolves it."""
    configured = os.environ.get("PLAYWRIGHT_BROWSERS_PATH")
    if configured == "0":
        import playwright

        return Path(playwright.__file__).parent / "driver" / "package" / ".local-browsers"
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ms-playwright"


def playwright_chromium() -> str | None:
    """Playwright's downloaded Chromium, when it is on disk."""
    # Only Playwright's driver knows the revision it wants, and starting it costs a node process
    # (seconds on a busy machine, on every worker's start): without any Chromium download where
    # it keeps them, there is nothing to ask it about.
    if not any(playwright_browsers().glob("chromium*")):
        return None
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
            return ChromiumBinary(str(configured), "configured", headless_shell="headless" in Path(configured).name)
        return None
    if playwright_chromium():
        return ChromiumBinary(None, "playwright", headless_shell=True)
    headless = settings.headless if settings else True
    if headless:
        for path in HEADLESS_SHELL_BINARIES:
            if Path(path).is_file() and os.access(path, os.X_OK):
                return ChromiumBinary(path, "system", headless_shell=True)
    for name in (HEADLESS_SHELL_NAMES if headless else ()) + SYSTEM_NAMES:
        found = shutil.which(name)
        if found:
            return ChromiumBinary(found, "system", headless_shell=name in HEADLESS_SHELL_NAMES)
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


# What Chromium may see of the worker's environment: where things are and how to print text.
# Everything else stays out (the worker's NATS, S3 and API credentials among them): a renderer
# exploit that reads its environment finds nothing worth having.
ENVIRONMENT = ("PATH", "HOME", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "DISPLAY",
               "WAYLAND_DISPLAY", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "FONTCONFIG_PATH",
               "FONTCONFIG_FILE")


def launch_env() -> dict[str, str | float | bool]:
    """The environment Chromium starts with: ``ENVIRONMENT``'s variables, as this process has them
    (typed as Playwright's ``launch(env=…)`` takes it)."""
    return {name: os.environ[name] for name in ENVIRONMENT if name in os.environ}


def launch_args(settings: BrowserSettings, extra: tuple[str, ...] = ()) -> list[str]:
    """Chromium switches: the base set, --no-sandbox only when root needs it, then extras."""
    args = list(BASE_ARGS)
    no_sandbox = settings.no_sandbox if settings.no_sandbox is not None else os.geteuid() == 0
    if no_sandbox:
        args.append("--no-sandbox")
    args += list(extra) + list(settings.extra_args)
    return args
