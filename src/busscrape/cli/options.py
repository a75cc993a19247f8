"""Parsing of the task options shared by ``busscrape dispatch`` and ``busscrape run``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer

from busscrape.cli.app import err, safe
from busscrape.errors import EXIT_CONFIG

if TYPE_CHECKING:
    from busscrape.dispatch.inputs import TaskDefaults
    from busscrape.model.messages import TaskOptions
    from busscrape.model.steps import Step


def task_defaults(*, steps: str | None = None, artifacts: str | None = None, label: list[str] | None = None,
                  screenshot_format: str | None = None, jpeg_quality: int | None = None,
                  full_page: bool | None = None, har_content: str | None = None, wait_until: str | None = None,
                  timeout: str | None = None, viewport: str | None = None, block: str | None = None,
                  user_agent: str | None = None, header: list[str] | None = None) -> TaskDefaults:
    """The task defaults the command-line flags describe (exit 2 with the reason when invalid)."""
    from busscrape.dispatch.inputs import TaskDefaults

    return TaskDefaults(
        steps=parse_steps(steps) if steps else (),
        options=build_options(artifacts=csv(artifacts), screenshot=screenshot(screenshot_format, jpeg_quality,
                                                                             full_page),
                              har_content=har_content, wait_until=wait_until, navigation_timeout=timeout,
                              viewport=parse_viewport(viewport), block_resources=csv(block), user_agent=user_agent,
                              headers=pairs(header or [], ":", "--header") or None),
        labels=pairs(label or [], "=", "--label"),
    )


def usage(message: str) -> NoReturn:
    err.print(f"[red]error:[/] {safe(message)}", soft_wrap=True)
    raise typer.Exit(EXIT_CONFIG)


def check_input(source: str) -> None:
    """Exit 2 at once when INPUT cannot be read: before any connection, which may take seconds to fail."""
    if source == "-":
        return
    try:
        with open(source, "rb"):
            pass
    except OSError as exc:
        usage(f"INPUT {source}: {exc.strerror or exc}")


def csv(value: str | None) -> list[str] | None:
    return None if value is None else [v.strip() for v in value.split(",") if v.strip()]


def pairs(values: list[str], sep: str, flag: str) -> dict[str, str]:
    pairs = {}
    for value in values:
        key, found, rest = value.partition(sep)
        if not found or not key.strip():
            usage(f"{flag} {value!r}: write KEY{sep}VALUE")
        pairs[key.strip()] = rest.strip()
    return pairs


def parse_viewport(value: str | None) -> dict[str, str] | None:
    if value is None:
        return None
    width, found, height = value.lower().partition("x")
    if not found:
        usage(f"--viewport {value!r}: write WIDTHxHEIGHT, e.g. 1280x800")
    return {"width": width, "height": height}


def screenshot(fmt: str | None, quality: int | None, full_page: bool | None) -> dict[str, Any] | None:
    given = {"format": fmt, "quality": quality, "full_page": full_page}
    return {k: v for k, v in given.items() if v is not None} or None


def build_options(**given: Any) -> TaskOptions:
    from pydantic import ValidationError

    from busscrape.model.messages import TaskOptions, describe_validation_error

    try:
        return TaskOptions.model_validate({k: v for k, v in given.items() if v is not None})
    except ValidationError as exc:
        usage(f"invalid task options: {describe_validation_error(exc)}")


def parse_steps(value: str) -> tuple[Step, ...]:
    from pydantic import TypeAdapter, ValidationError

    from busscrape.model.messages import describe_validation_error
    from busscrape.model.steps import Steps

    text = value
    if value.startswith("@"):
        try:
            text = Path(value[1:]).read_text()
        except OSError as exc:
            usage(f"--steps {value}: {exc.strerror or exc}")
    try:
        return TypeAdapter(Steps).validate_json(text)
    except ValidationError as exc:
        usage(f"--steps: {describe_validation_error(exc)}")
