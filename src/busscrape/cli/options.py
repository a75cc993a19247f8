"""The task options every command that queues tasks takes (``dispatch``, ``run``, and the ones to
come), defined once, and their parsing.

``TASK_OPTIONS`` is the one list of those flags. A command decorated with ``@task_options`` gets
them all and receives their values as one ``TaskFlags`` (its ``task`` parameter): adding an entry
there (then using ``task.<name>`` where it takes effect) adds the flag to every such command.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import IO, TYPE_CHECKING, Any, NoReturn, overload

import typer

from busscrape.cli.app import err, safe
from busscrape.errors import EXIT_CONFIG

if TYPE_CHECKING:
    from busscrape.dispatch.inputs import TaskDefaults
    from busscrape.model.messages import TaskOptions
    from busscrape.model.steps import Step
    from busscrape.settings import Settings


class TaskFlags(SimpleNamespace):
    """What the shared task options were given as, one attribute per entry of ``TASK_OPTIONS``
    (None: not given, the settings decide)."""

    def check(self) -> None:
        """Exit 2 for what can be refused before anything starts."""
        if self.fmt not in ("auto", "urls", "jsonl"):
            usage(f"--format must be auto, urls or jsonl, not {self.fmt!r}")

    def check_extractor(self, s: Settings, *, local: bool) -> None:
        """``--extractor NAME`` against the extractors this process sees (the bundled ones and
        BUSSCRAPE_EXTRACT__DIR's): refused (exit 2) when the workers are ``local`` (they see the
        same, so every task would be dead-lettered ``unknown_extractor``); a warning otherwise
        (workers elsewhere may have it)."""
        if self.extractor is None:
            return
        from busscrape.errors import ConfigurationError
        from busscrape.extract.registry import Registry

        try:
            Registry.with_bundled(s.extract.dir).get_or_explain(self.extractor)
        except ConfigurationError as exc:
            message = f"--extractor {self.extractor}: {exc.message}"
            if local or exc.reason != "unknown_extractor":
                usage(message)
            err.print(f"[yellow]warning:[/] {safe(message)}; the workers will dead-letter every task "
                      "unknown_extractor unless they have it", soft_wrap=True)

    def dispatch_settings(self) -> dict[str, Any]:
        """The ``dispatch`` settings section these flags override."""
        return {"recrawl_after": self.recrawl_after, "strip_tracking": self.strip_tracking,
                "sort_query": self.sort_query, "max_url_length": self.max_url_length, "window": self.window}

    def defaults(self) -> TaskDefaults:
        """The task defaults they describe (exit 2 with the reason when invalid)."""
        return task_defaults(
            steps=self.steps, artifacts=self.artifacts, label=self.label, screenshot_format=self.screenshot_format,
            jpeg_quality=self.jpeg_quality, full_page=self.full_page, har_content=self.har_content,
            wait_until=self.wait_until, timeout=self.timeout, viewport=self.viewport, block=self.block,
            user_agent=self.user_agent, header=self.header, extractor=self.extractor, proxy=self.proxy,
            session=self.session)

    @contextlib.contextmanager
    def rejects_file(self) -> Iterator[IO[bytes] | None]:
        """``--rejects FILE`` opened for writing (exit 2 when it cannot be), or None."""
        if self.rejects is None:
            yield None
            return
        try:
            handle = open(self.rejects, "wb")  # closed by the with below
        except OSError as exc:
            usage(f"--rejects {self.rejects}: {exc.strerror or exc}")
        with handle:
            yield handle


# (TaskFlags field, annotation, typer option): the flags, in the order --help lists them.
TASK_OPTIONS: list[tuple[str, Any, Any]] = [
    ("fmt", str, typer.Option("auto", "--format", help="auto (by file name: *.jsonl is JSONL), urls or jsonl.")),
    ("steps", str | None, typer.Option(None, "--steps", help="JSON array of steps for every task, or @FILE.")),
    ("artifacts", str | None, typer.Option(None, "--artifacts", help="Comma list of html,screenshot,har,text,warc.")),
    ("label", list[str], typer.Option([], "--label", metavar="K=V", help="A label on every task. Repeatable.")),
    ("screenshot_format", str | None, typer.Option(None, "--screenshot-format", help="png or jpeg.")),
    ("jpeg_quality", int | None, typer.Option(None, "--jpeg-quality", help="1-100, with jpeg screenshots.")),
    ("full_page", bool | None, typer.Option(
        None, "--full-page/--no-full-page",
        help="Whole-page screenshot (capped at worker.max_screenshot_height) instead of the viewport; 3–4× the cost.")),
    ("har_content", str | None, typer.Option(None, "--har-content", help="omit or embed response bodies.")),
    ("wait_until", str | None, typer.Option(None, "--wait-until",
                                            help="load, domcontentloaded, networkidle, commit.")),
    ("timeout", str | None, typer.Option(None, "--timeout", help="Navigation timeout of every task (30s, 1m).")),
    ("viewport", str | None, typer.Option(None, "--viewport", metavar="WxH", help="Viewport, e.g. 1280x800.")),
    ("block", str | None, typer.Option(None, "--block", help="Comma list of image,media,font,stylesheet.")),
    ("user_agent", str | None, typer.Option(None, "--user-agent", help="User-Agent of every task.")),
    ("header", list[str], typer.Option([], "--header", metavar="'NAME: VALUE'",
                                       help="Request header. Repeatable.")),
    ("extractor", str | None, typer.Option(None, "--extractor", metavar="NAME",
                                           help="Extractor every task runs (extractors/NAME.toml).")),
    ("proxy", str | None, typer.Option(None, "--proxy", metavar="POOL|URL",
                                       help="direct, a workers' proxy pool, or a proxy URL without credentials.")),
    ("session", str | None, typer.Option(None, "--session", metavar="NAME",
                                         help="Session every task runs in (the workers' sessions file).")),
    ("recrawl_after", str | None, typer.Option(None, "--recrawl-after", help="Skip URLs dispatched within this "
                                               "(default BUSSCRAPE_DISPATCH__RECRAWL_AFTER, 7d).")),
    ("force", bool, typer.Option(False, "--force", help="Queue every URL even if it was seen within "
                                 "--recrawl-after.")),
    ("strip_tracking", bool | None, typer.Option(None, "--strip-tracking/--keep-tracking",
                                                 help="Drop utm_*, fbclid … before de-duplication.")),
    ("sort_query", bool | None, typer.Option(None, "--sort-query/--keep-query-order", help="Sort query parameters.")),
    ("max_url_length", int | None, typer.Option(None, "--max-url-length", help="Reject longer URLs.")),
    ("window", int | None, typer.Option(None, "--window", help="Publishes in flight before waiting for PubAcks.")),
    ("rejects", Path | None, typer.Option(None, "--rejects", metavar="FILE",
                                          help="Also write rejected lines here, as JSONL.")),
    ("strict", bool, typer.Option(False, "--strict", help="Exit 1 if any line was rejected.")),
    ("as_json", bool, typer.Option(False, "--json", help="Print the summary as one JSON object.")),
]


def _config(ctx: typer.Context, param: typer.CallbackParam, value: str | None) -> str | None:
    from busscrape.cli.config_file import callback

    return callback(ctx, param, value)


CONFIG = typer.Option(None, "--config", metavar="FILE", is_eager=True, callback=_config,
                      help="Options and settings from a YAML, TOML or JSON file (- for stdin); flags win.")
OUTPUT = typer.Option(None, "--output", "-o", metavar="FILE",
                      help="Also write one row per page to FILE (.jsonl, .csv, .parquet; - for JSONL on stdout).")
"""``run`` and ``crawl``'s --config and -o (``cli.config_file``, ``dataset.writer``)."""


@overload
def task_options(command: Callable[..., Any], *, hidden: tuple[str, ...] = ()) -> Callable[..., Any]: ...


@overload
def task_options(command: None = None, *,
                 hidden: tuple[str, ...] = ()) -> Callable[[Callable[..., Any]], Callable[..., Any]]: ...


def task_options(command: Callable[..., Any] | None = None, *,
                 hidden: tuple[str, ...] = ()) -> Any:
    """Give ``command`` every flag of ``TASK_OPTIONS``; it receives them as ``task: TaskFlags``.
    Those named in ``hidden`` (TaskFlags fields) are left out of its ``--help``: flags it refuses
    with a reason (``crawl``'s list flags), never ones it takes.

    Typer reads a command's parameters from its signature, so the wrapper's signature is the
    command's own (without ``task``) followed by the shared flags.
    """
    if command is None:
        return functools.partial(task_options, hidden=hidden)
    own = [p for p in inspect.signature(command).parameters.values() if p.name != "task"]
    shared = []
    for name, annotation, option in TASK_OPTIONS:
        if name in hidden:
            option = copy.copy(option)
            option.hidden = True
        shared.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation))

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> Any:
        flags = TaskFlags(**{name: kwargs.pop(name) for name, _, _ in TASK_OPTIONS})
        return command(task=flags, **kwargs)

    wrapper.__signature__ = inspect.Signature([*own, *shared])  # type: ignore[attr-defined]
    return wrapper


def task_defaults(*, steps: str | None = None, artifacts: str | None = None, label: list[str] | None = None,
                  screenshot_format: str | None = None, jpeg_quality: int | None = None,
                  full_page: bool | None = None, har_content: str | None = None, wait_until: str | None = None,
                  timeout: str | None = None, viewport: str | None = None, block: str | None = None,
                  user_agent: str | None = None, header: list[str] | None = None,
                  extractor: str | None = None, proxy: str | None = None,
                  session: str | None = None) -> TaskDefaults:
    """The task defaults the command-line flags describe (exit 2 with the reason when invalid)."""
    from busscrape.dispatch.inputs import TaskDefaults

    return TaskDefaults(
        steps=parse_steps(steps) if steps else (),
        options=build_options(artifacts=csv(artifacts), screenshot=screenshot(screenshot_format, jpeg_quality,
                                                                             full_page),
                              har_content=har_content, wait_until=wait_until, navigation_timeout=timeout,
                              viewport=parse_viewport(viewport), block_resources=csv(block), user_agent=user_agent,
                              headers=pairs(header or [], ":", "--header") or None, extractor=extractor,
                              proxy=proxy, session=session),
        labels=pairs(label or [], "=", "--label"),
    )


def usage(message: str) -> NoReturn:
    from busscrape.cli import embedding
    from busscrape.cli.config_file import located

    message = located(message)  # a value from --config is named as the file's key
    embedding.refuse(message)
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


def check_output(target: str | None) -> None:
    """Exit 2 at once when ``-o`` names no format busscrape writes (or Parquet without pyarrow):
    before the run starts, not once its first page lands."""
    from busscrape.dataset.writer import dataset_format
    from busscrape.errors import ConfigurationError

    if target is None:
        return
    try:
        dataset_format(target)
    except ConfigurationError as exc:
        usage(str(exc))


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

    from busscrape.model.steps import Steps, describe_errors
    from busscrape.settings.problems import shown

    text = value
    if value.startswith("@"):
        try:
            text = Path(value[1:]).read_text()
        except OSError as exc:
            usage(f"--steps {value}: {exc.strerror or exc}")
    try:
        return TypeAdapter(Steps).validate_json(text)
    except ValidationError as exc:
        usage(f"--steps {shown('steps', value)}: {describe_errors(exc)}")
