"""The Typer application, shared options and the error-to-exit-code mapping.

Every command module imports only this, typer and the standard library at the top, and what its
command needs inside the command: ``busscrape --help`` and ``busscrape <command> --help`` then
load no settings, no NATS client and no browser (``bench/cli_startup.py`` measures it).
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Coroutine
from typing import IO, TYPE_CHECKING, Any, NoReturn, TypeVar, cast

import typer

from busscrape import __version__
from busscrape.errors import EXIT_CONFIG, EXIT_INTERRUPTED, ConfigurationError
from busscrape.printable import visible

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

    from busscrape.settings import Settings

EPILOG = (
    "Exit codes: 0 ok; 1 partial or not found (rejected input under --strict, failed publishes, tasks "
    "unfinished, no such task or letter); 2 configuration or usage (bad settings or flags, unreadable input, "
    "cannot connect, streams missing, port taken); 3 credentials refused; 130 interrupted (docs/exit-codes.md "
    "has every case). Settings come from BUSSCRAPE_* variables (see `busscrape config`)."
)

# Off a terminal (a pipe, a file, a CI log) lines are as long as they are: rich would otherwise
# wrap at 80 columns, split paths mid-hash and cut table cells with "…".
_UNBOUNDED = 1_000_000

class _Commands(typer.core.TyperGroup):
    """The top group: a flag value Typer could not convert is said in a few words."""

    def invoke(self, ctx: Any) -> Any:
        from busscrape.cli.config_file import click_errors, plain

        try:
            return super().invoke(ctx)
        except click_errors().BadParameter as exc:
            # Typer converts through pydantic ("Input should be a valid integer, unable to …").
            exc.message = plain(exc, with_value=True)
            raise


app = typer.Typer(
    name="busscrape",
    cls=_Commands,
    help="An event-driven browser-scraping bus over NATS JetStream.",
    epilog=EPILOG,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    # Off a terminal click would fit --help to 80 columns and cut each command's line with "…".
    context_settings={} if sys.stdout.isatty() else {"terminal_width": _UNBOUNDED, "max_content_width": _UNBOUNDED},
)



class _Unpadded(io.TextIOBase):
    """Off a terminal: the console's lines without the spaces rich pads them with (a table's
    last column), written to whatever ``sys.stdout``/``sys.stderr`` is at the time."""

    def __init__(self, stderr: bool) -> None:
        self._stderr = stderr
        self._line = ""

    def _target(self) -> IO[str]:
        return sys.stderr if self._stderr else sys.stdout

    def write(self, text: str) -> int:
        *done, self._line = (self._line + text).split("\n")
        if done:
            self._target().write("".join(line.rstrip(" ") + "\n" for line in done))
        return len(text)

    def flush(self) -> None:
        if self._line:
            self._target().write(self._line)
            self._line = ""
        self._target().flush()

    def isatty(self) -> bool:
        return False


class _Lazy:
    """A rich ``Console`` made on first use (rich costs a tenth of a second to import).

    On a terminal it wraps and fits tables to the window; off one it never wraps, truncates or
    pads: ``soft_wrap`` and a width no line reaches.
    """

    def __init__(self, stderr: bool) -> None:
        self._stderr = stderr
        self._console: Console | None = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            console = Console(stderr=self._stderr, highlight=False)
            if not console.is_terminal:
                console = Console(file=cast(IO[str], _Unpadded(self._stderr)), highlight=False, soft_wrap=True,
                                  width=_UNBOUNDED)
            self._console = console
        return getattr(self._console, name)


err: Console = _Lazy(stderr=True)  # type: ignore[assignment]
out: Console = _Lazy(stderr=False)  # type: ignore[assignment]


def safe(value: object) -> str:
    """Outside text for a markup string (an f-string given to ``print``, a table cell): shown as
    it is, never read as markup (``[/]`` would crash the command, ``[link=…]`` spoof it), its
    escape sequences shown rather than obeyed."""
    from rich.markup import escape

    return escape(visible(value))


def plain(value: object) -> Text:
    """Outside text as a rich ``Text`` (never markup), escape sequences shown (``visible``)."""
    from rich.text import Text

    return Text(visible(value))

T = TypeVar("T")

LIFELINE_HELP = "(internal) a pipe from `busscrape run`: stop when it closes."
WAIT_STREAMS_HELP = ("(internal) from `busscrape run`, which starts its daemons while it applies the streams: "
                     "wait this many seconds for them instead of exiting at once.")
ARCHIVE_HELP = ("Where to archive: s3://bucket/prefix, gs://bucket/prefix, az://container/prefix, or a folder "
                "(default: BUSSCRAPE_ARCHIVE__URL, the S3 endpoint, or the state dir's archive folder).")


def archive_section(where: str | None) -> dict[str, Any]:
    """The ``archive`` settings an ``--archive`` value sets: a cloud URL's location, or a folder."""
    from pathlib import Path

    from busscrape.archive.storage import CLOUD_SCHEMES

    if where is None:
        return {}
    if where.split("://", 1)[0].lower() in CLOUD_SCHEMES and "://" in where:
        return {"url": where}
    folder = Path(where.removeprefix("file://"))
    return {"dir": folder, "url": str(folder)}  # a folder named here wins over a configured URL


def settings(*, state_nats: bool = False, **sections: dict[str, Any]) -> Settings:
    """Settings from the environment with the given CLI flags on top; logging configured.

    Invalid settings are exit 2 with one line per problem, naming the variable (or the flag) and
    the value (``BUSSCRAPE_WORKER__CONCURRENCY='abc': not an integer``). With ``state_nats`` and
    no NATS URL, the NATS of the state dir's last embedded run is reopened for the command
    (``ops.state_dir``) and stopped when the command ends.
    """
    from busscrape.cli.config_file import under_environment
    from busscrape.settings import Settings
    from busscrape.telemetry import logs

    try:
        base = Settings()
    except ValueError as exc:  # pydantic's ValidationError and pydantic-settings' SettingsError both
        invalid_settings(exc)
    base = under_environment(base)  # a --config file's settings table, under the environment
    try:
        result = base.with_overrides(**sections) if sections else base
    except ValueError as exc:
        invalid_settings(exc, flags={f"{section}.{name}": "--" + name.replace("_", "-")
                                     for section, values in sections.items() for name in values})
    logs.configure(result.telemetry.log_format, result.telemetry.log_level)
    if state_nats:
        result = _state_nats(result)
    return result


def _state_nats(s: Settings) -> Settings:
    import atexit

    from busscrape.ops.state_dir import reopen

    try:
        reopened = reopen(s)
    except ConfigurationError as exc:
        err.print(f"[red]error:[/] {safe(exc)}", soft_wrap=True)
        raise typer.Exit(exc.exit_code) from None
    if reopened is None:
        return s
    result, stop = reopened
    atexit.register(stop)  # however the command ends (typer.Exit is a SystemExit)
    return result


def invalid_settings(exc: Exception, flags: dict[str, str] | None = None) -> NoReturn:
    """Exit 2 with what is wrong with the settings, one line per problem."""
    from busscrape.cli import embedding
    from busscrape.settings.problems import describe

    embedding.refuse("\n".join(describe(exc, flags=flags)))
    for line in describe(exc, flags=flags):
        err.print(f"[red]error:[/] {safe(line)}", soft_wrap=True)
    raise typer.Exit(EXIT_CONFIG)


async def serve(service: Any, lifeline: int | None = None) -> Any:
    """Run a daemon until it stops: SIGTERM/SIGINT drain it, a second signal stops it now.

    When the service has telemetry and ``BUSSCRAPE_TELEMETRY__HTTP_PORT`` is set, its
    ``/healthz``, ``/readyz`` and ``/metrics`` are served for as long as it runs. With a
    ``lifeline`` (the pipe ``busscrape run`` holds, ``ops.lifeline``) it also stops when that closes:
    its supervisor is gone.
    """
    import asyncio
    import contextlib
    import signal

    from busscrape.ops import lifeline as lifelines
    from busscrape.telemetry.health import HealthServer

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, service.stop)
    unwatch = lifelines.watch(lifeline, service.stop) if lifeline is not None else None
    telemetry = getattr(service, "telemetry", None)
    cfg = service.bus.settings.telemetry
    try:
        async with contextlib.AsyncExitStack() as stack:
            if telemetry is not None and cfg.http_port is not None:
                # Only the default port gives way to another daemon on this host; one the operator chose does not.
                await stack.enter_async_context(
                    HealthServer(cfg.http_host, cfg.http_port, checks=service.checks, telemetry=telemetry,
                                 fallback="http_port" not in cfg.model_fields_set))
            async with service:
                return await service.run()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        if unwatch is not None:
            unwatch()
        if telemetry is not None:
            telemetry.close()


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine; configuration errors become their exit code and a message."""
    import asyncio

    try:
        return asyncio.run(coro)
    except ConfigurationError as exc:
        err.print(f"[red]error:[/] {safe(exc)}")
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/]")
        raise typer.Exit(EXIT_INTERRUPTED) from None


@app.command()
def version() -> None:
    """Print the busscrape version."""
    out.print(__version__)


def _print_version(given: bool) -> None:
    if given:
        out.print(__version__)
        raise typer.Exit(0)


@app.callback()
def _root(
    show_version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                      help="Print the busscrape version and exit."),
) -> None:
    """An event-driven browser-scraping bus over NATS JetStream."""


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except SystemExit as done:
        end(done.code)
    end(0)


def end(code: int | str | None) -> NoReturn:
    """End the process with ``code`` once the command is done.

    With obstore loaded (the archive on S3, GCS or Azure) the process skips Python's own
    finalisation: obstore's Rust runtime keeps its worker threads, and one that hands a late
    result back to Python while the interpreter is being torn down aborts the process (SIGABRT,
    SIGBUS; pyo3's interpreter-shutdown race) — an ingester that had printed "exit 2, fix the CA"
    ended as -6 under load. The atexit handlers still run and the output is flushed first."""
    if "obstore" not in sys.modules:
        raise SystemExit(code)
    import atexit
    import os

    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code or 0)
