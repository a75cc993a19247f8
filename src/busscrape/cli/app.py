"""The Typer application, shared options and the error-to-exit-code mapping."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

import typer
from rich.console import Console

from busscrape import __version__
from busscrape.errors import EXIT_INTERRUPTED, ConfigurationError
from busscrape.settings import Settings
from busscrape.telemetry import logs
from busscrape.telemetry.health import HealthServer

EPILOG = (
    "Exit codes: 0 ok; 1 partial (rejected input under --strict, failed publishes, dead letters); "
    "2 configuration (cannot connect, streams missing, bad settings); 3 credentials refused; "
    "130 interrupted. Settings come from BUSSCRAPE_* variables (see `busscrape config`)."
)

app = typer.Typer(
    name="busscrape",
    help="An event-driven browser-scraping bus over NATS JetStream.",
    epilog=EPILOG,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

err = Console(stderr=True, highlight=False)
out = Console(highlight=False)

T = TypeVar("T")


def settings(**sections: dict[str, Any]) -> Settings:
    """Settings from the environment with the given CLI flags on top; logging configured."""
    try:
        base = Settings()
        result = base.with_overrides(**sections) if sections else base
    except ValueError as exc:  # pydantic ValidationError is a ValueError
        err.print(f"[red]error:[/] invalid settings: {exc}")
        raise typer.Exit(2) from None
    logs.configure(result.telemetry.log_format, result.telemetry.log_level)
    return result


async def serve(service: Any) -> Any:
    """Run a daemon until it stops: SIGTERM/SIGINT drain it, a second signal stops it now.

    When the service has telemetry and ``BUSSCRAPE_TELEMETRY__HTTP_PORT`` is set, its
    ``/healthz``, ``/readyz`` and ``/metrics`` are served for as long as it runs.
    """
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, service.stop)
    telemetry = getattr(service, "telemetry", None)
    cfg = service.bus.settings.telemetry
    try:
        async with contextlib.AsyncExitStack() as stack:
            if telemetry is not None and cfg.http_port is not None:
                await stack.enter_async_context(
                    HealthServer(cfg.http_host, cfg.http_port, checks=service.checks, telemetry=telemetry))
            async with service:
                return await service.run()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        if telemetry is not None:
            telemetry.close()


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine; configuration errors become their exit code and a message."""
    try:
        return asyncio.run(coro)
    except ConfigurationError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/]")
        raise typer.Exit(EXIT_INTERRUPTED) from None


@app.command()
def version() -> None:
    """Print the busscrape version."""
    out.print(__version__)


@app.command("config")
def show_config(as_json: bool = typer.Option(False, "--json", help="Print JSON."),
                markdown: bool = typer.Option(False, "--markdown", help="Print every setting with its default "
                                              "and meaning as a Markdown table (the README's).")) -> None:
    """Print the effective settings (secrets masked) and where each can be set."""
    if markdown:
        from busscrape.settings import reference_markdown

        sys.stdout.write(reference_markdown())
        return
    s = settings()
    data = s.model_dump(mode="json")
    if as_json:
        import orjson

        sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    from rich.table import Table

    table = Table("variable", "value", "meaning", show_lines=False)
    for name, field in Settings.model_fields.items():
        value = data[name]
        if isinstance(value, dict):
            section = getattr(Settings.model_fields[name].annotation, "model_fields", {})
            for sub, subfield in section.items():
                table.add_row(f"BUSSCRAPE_{name.upper()}__{sub.upper()}", _short(value[sub]),
                              (subfield.description or "").split("\n")[0])
        else:
            table.add_row(f"BUSSCRAPE_{name.upper()}", _short(value), field.description or "")
    out.print(table)


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 40 else text[:39] + "…"


def main() -> None:
    """Console-script entry point."""
    app()
