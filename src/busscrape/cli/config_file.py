"""``--config FILE``: one file for a whole ``run`` or ``crawl`` (YAML, TOML or JSON; ``-`` reads
YAML or JSON from standard input).

Its keys are the command's long options (``max_pages`` or ``max-pages``; the arguments as
``seeds`` and, for ``run``, ``input``: a path or a list of URLs and task specs), plus a
``settings`` table of ``BUSSCRAPE_*`` settings by section (``worker: {host_concurrency: 2}``).

Precedence: command-line flags, then ``BUSSCRAPE_*`` variables, then the file, then defaults. The
option keys become the command's defaults (click's ``default_map``: a flag given on the command
line wins); an option that sets a setting yields to that setting's variable when it is set
(``SETTING_OF``); the ``settings`` table is laid under the environment (``under_environment``).
Relative paths are relative to the file's folder. An unknown key or a bad value is an error
naming the file, the key and the value (exit 2). Each value is checked by the option's own type,
so the file, the command line and the Python API share every rule.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import sys
import tempfile
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from busscrape.settings import Settings

FILE_SETTINGS: ContextVar[tuple[str, Path, dict[str, Any]] | None] = ContextVar("busscrape_file_settings",
                                                                                 default=None)
"""(the file's name, its folder, its ``settings`` table) while a command reads one."""

FROM_FILE: ContextVar[dict[str, tuple[str, str, Any, str]] | None] = ContextVar("busscrape_from_file", default=None)
"""While a command reads a file: by the label its errors begin with (``--max-pages``, ``INPUT``),
the file, the key, the value as written and the parameter's name, for ``located``."""

ARGUMENT_KEYS = {"source": "input"}
"""A command argument's key where it is not the parameter's own name."""

ARGUMENT_LABELS = {"input": "INPUT", "seeds": "seed"}
"""What an argument's errors begin with (``INPUT x.txt: …``, ``seed 'x': …``); an option's is its long flag."""

SETTING_OF = {"nats_url": "nats.url", "concurrency": "worker.concurrency", "archive": "archive.dir",
              "recrawl_after": "dispatch.recrawl_after", "strip_tracking": "dispatch.strip_tracking",
              "sort_query": "dispatch.sort_query", "max_url_length": "dispatch.max_url_length",
              "window": "dispatch.window"}
"""Options that set a setting (``cli/run.py``, ``cli/crawl.py``): the setting's variable beats the file."""

NOT_IN_FILE = frozenset({"config"})
PATH_KEYS = frozenset({"input", "output", "archive", "rejects"})


def click_errors() -> Any:
    """The exceptions of the click the commands are built on."""
    return click_module("exceptions")


def click_module(name: str) -> Any:
    """A module of the click the commands are built on: Typer 0.2x builds them on a click of its
    own (``typer._click``; ``cli.reference`` says the same), so parameters are read through their
    attributes, never ``isinstance`` against the ``click`` package."""
    import importlib

    try:
        return importlib.import_module(f"typer._click.{name}")
    except ImportError:  # a Typer on the click package
        return importlib.import_module(f"click.{name}")


def is_argument(param: Any) -> bool:
    return bool(param.param_type_name == "argument")


def key_of(param: Any) -> str:
    """A parameter's key in a file and in the Python API: its first long option without the dashes
    (``--max-pages`` → ``max_pages``, ``--format`` → ``format``), an argument's name."""
    if is_argument(param):
        return ARGUMENT_KEYS.get(param.name or "", param.name or "")
    long: str = next((o for o in param.opts if o.startswith("--")), param.opts[0])
    return long.lstrip("-").replace("-", "_")


def label_of(param: Any) -> str:
    """What an error about the parameter's value begins with: its long flag, or an argument's name."""
    key = key_of(param)
    return ARGUMENT_LABELS.get(key, key) if is_argument(param) else "--" + key.replace("_", "-")


def parameters(command: Any) -> dict[str, Any]:
    """Every parameter of ``command`` by its key."""
    return {key_of(p): p for p in command.params if key_of(p) not in NOT_IN_FILE}


def fail(message: str) -> None:
    from busscrape.cli.options import usage

    usage(message)


def read(name: str) -> tuple[dict[str, Any], Path]:
    """The file's top-level table and the folder its relative paths are relative to."""
    import tomllib

    import yaml

    try:
        text = sys.stdin.read() if name == "-" else Path(name).read_text()
    except OSError as exc:
        fail(f"--config {name}: {exc.strerror or exc}")
    folder = Path.cwd() if name == "-" else Path(name).resolve().parent
    suffix = "" if name == "-" else Path(name).suffix.lower()
    try:
        if suffix == ".toml":
            doc = tomllib.loads(text)
        elif suffix in ("", ".yaml", ".yml", ".json"):
            doc = yaml.safe_load(text)
        else:
            fail(f"--config {name}: write a .yaml, .yml, .toml or .json file (or - for YAML or JSON on stdin)")
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        fail(f"--config {name}: not valid {'TOML' if suffix == '.toml' else 'YAML'}: {str(exc).splitlines()[0]}")
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        fail(f"--config {name}: the file must be a table of options, not {type(doc).__name__}")
    return doc, folder


def callback(ctx: Any, param: Any, value: str | None) -> str | None:
    """``--config``'s callback (eager: before the other parameters take their values)."""
    if value is None:
        return None
    doc, folder = read(value)
    params = parameters(ctx.command)
    defaults: dict[str, Any] = {}
    given_by: dict[str, tuple[str, str, Any, str]] = {}
    FROM_FILE.set(given_by)
    for key, given in doc.items():
        if key == "settings":
            if not isinstance(given, dict):
                fail(f"{value}: settings={given!r}: write a table of sections (worker: {{host_concurrency: 2}})")
            FILE_SETTINGS.set((value, folder, given))
            continue
        name = str(key).replace("-", "_")
        target = params.get(name)
        if target is None:
            fail(f"{value}: unknown key {key!r} (value {given!r}); the keys are "
                 + ", ".join(sorted([*params, "settings"])))
        assert target is not None
        setting = SETTING_OF.get(target.name or "")
        if setting is not None and "BUSSCRAPE_" + setting.upper().replace(".", "__") in os.environ:
            continue  # the variable beats the file
        converted = _value(value, key, target, given, folder)
        given_by[label_of(target)] = (value, str(key), given, target.name or name)
        try:
            target.process_value(ctx, converted)  # the option's own conversion and checks
        except click_errors().BadParameter as exc:
            fail(f"{value}: {key}={given!r}: {plain(exc)}")
        defaults[target.name or name] = converted
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return value


def plain(exc: Any, *, with_value: bool = False) -> str:
    """A ``BadParameter``'s reason in a few words (``with_value``: after the value, quoted): Typer
    converts values through pydantic, whose wording (``Input should be a valid integer, unable to
    parse string …``) is said plainly."""
    from pydantic import ValidationError

    from busscrape.settings.problems import reason

    cause = exc.__cause__
    if not isinstance(cause, ValidationError) or not cause.errors():
        return str(exc.message)
    error = cause.errors()[0]
    value = error.get("input")
    shown = with_value and isinstance(value, str | int | float)
    return f"{value!r}: {reason(error)}" if shown else reason(error)


def located(message: str) -> str:
    """A usage error about a value the ``--config`` file gave, said as the file, its key and the
    value as written (``crawl.yaml: scope='bogus': must be one of …``) rather than as the flag
    the file stood for; ``message`` as it is otherwise. Parts joined by ``; `` are each looked at."""
    given_by = FROM_FILE.get()
    if not given_by:
        return message
    context = click_module("globals").get_current_context(silent=True)
    return "; ".join(_located(part, given_by, context) for part in message.split("; "))


def _located(part: str, given_by: dict[str, tuple[str, str, Any, str]], context: Any) -> str:
    for label, (file, key, given, name) in given_by.items():
        rest = part.removeprefix(label)
        if rest == part or rest[:1] not in (" ", ":"):
            continue
        source = context.get_parameter_source(name) if context is not None else None
        if source is not None and source.name != "DEFAULT_MAP":
            return part  # the command line gave it: the flag is the right name
        # "--flag VALUE: reason" or "--flag: reason"; VALUE is said again when it is not the file's
        # own text (a path made the file's, one item of a list).
        shown, reason = _split_value(rest)
        value = f"{key}={given!r}" + (f" ({shown})" if _says_more(shown, given) else "")
        return f"{file}: {value}: {reason}"
    return part


def _split_value(rest: str) -> tuple[str, str]:
    """``" 'a: b': reason"`` → ``("'a: b'", "reason")``: a quoted value ends where its quote does."""
    import ast

    at = rest.find(": ")
    while at != -1:
        shown = rest[:at].strip()
        if not shown.startswith(("'", '"')):
            return shown, rest[at + 2:]
        with contextlib.suppress(ValueError, SyntaxError):
            ast.literal_eval(shown)
            return shown, rest[at + 2:]
        at = rest.find(": ", at + 1)
    return "", rest.lstrip(": ")


def _says_more(shown: str, given: Any) -> bool:
    """Whether the flag's message said of the value more than the file's own text: the path a
    relative one became, or which item of a list is wrong (not the value re-encoded, as JSON)."""
    if not shown or shown in (str(given), repr(given)):
        return False
    items = given if isinstance(given, list) else []
    return isinstance(given, str) or shown in {text for item in items for text in (str(item), repr(item))}


def _value(file: str, key: str, param: Any, given: Any, folder: Path) -> Any:
    """A file's value as the command line would give it: relative paths made the file's, a list
    of inputs spilled into a JSONL file, steps as JSON, one value as a list for a repeatable one."""
    if key_of(param) == "input" and isinstance(given, list):
        return spill(given)
    if key_of(param) == "steps" and isinstance(given, list):
        return json.dumps(given)
    if key_of(param) == "steps" and isinstance(given, str) and given.startswith("@"):
        return "@" + str(folder / given[1:])
    multiple = getattr(param, "multiple", False) or (is_argument(param) and param.nargs == -1)
    if multiple and not isinstance(given, list):
        given = [given]
    if isinstance(given, list) and not multiple:
        if key_of(param) in ("artifacts", "block"):
            return ",".join(str(v) for v in given)
        fail(f"{file}: {key}={given!r}: one value, not a list")
    if _is_path(param) and isinstance(given, str) and given != "-":
        return str(folder / given)
    return given


def _is_path(param: Any) -> bool:
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)  # Typer's own click
    return "Path" in str(annotation or getattr(param, "type", "")) or key_of(param) in PATH_KEYS


def spill(items: list[Any]) -> str:
    """URLs and task specs as a JSONL input file (removed when the process ends)."""
    lines = []
    for item in items:
        if isinstance(item, str):
            item = {"url": item}
        elif not isinstance(item, dict):
            fail(f"input: {item!r}: a URL or a task spec (a table with url, extractor, steps …)")
        lines.append(json.dumps(item))
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", prefix="busscrape-input-", delete=False) as f:
        f.write("".join(line + "\n" for line in lines))
    atexit.register(Path(f.name).unlink, missing_ok=True)
    return f.name


def under_environment(base: Settings) -> Settings:
    """``base`` (the environment's settings) with the file's ``settings`` table under it: a
    setting the environment set keeps its value. Errors name the file, the key and the value."""
    read_file = FILE_SETTINGS.get()
    if read_file is None:
        return base
    name, folder, table = read_file
    from pydantic import BaseModel

    from busscrape.settings import Settings

    layered: dict[str, dict[str, Any]] = {}
    for section, values in table.items():
        if section not in Settings.model_fields or not isinstance(getattr(base, section), BaseModel):
            fail(f"{name}: unknown settings section {section!r} (value {values!r}); the sections are "
                 + ", ".join(n for n in Settings.model_fields if isinstance(getattr(base, n), BaseModel)))
        if not isinstance(values, dict):
            fail(f"{name}: settings.{section}={values!r}: write a table of settings")
        current = getattr(base, section)
        for key, given in values.items():
            field = type(current).model_fields.get(key)
            if field is None:
                fail(f"{name}: unknown setting settings.{section}.{key} (value {given!r})")
            if key in current.model_fields_set:
                continue  # its variable is set: the environment beats the file
            if isinstance(given, str) and "Path" in str(field.annotation) and not given.startswith("/"):
                given = str(folder / given)
            layered.setdefault(section, {})[key] = given
    try:
        return base.with_overrides(**layered)
    except ValueError as exc:
        from busscrape.settings.problems import describe

        fail("; ".join(describe(exc, flags={f"{s}.{k}": f"{name}: settings.{s}.{k}"
                                            for s, values in layered.items() for k in values})))
    raise AssertionError("unreachable")
