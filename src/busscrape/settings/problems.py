"""What is wrong with the settings, said in the operator's terms: the variable, the value, the reason.

``BUSSCRAPE_WORKER__CONCURRENCY='abc': not an integer`` rather than pydantic's
``worker.concurrency / Input should be a valid integer … https://errors.pydantic.dev/…``. Every
command builds its settings through ``busscrape.cli.app.settings``, which prints this, so every
command says it the same way.
"""

from __future__ import annotations

import os
import re
from typing import Any

from pydantic import ValidationError

# Values of these are never echoed back (a password with a typo in its type is still a password).
_SECRET = re.compile(r"password|token|secret|access_key|dsn|seed|creds", re.I)
_SOURCE_ERROR = re.compile(r'error parsing value for field "(?P<field>[^"]+)" from source')
_MAX_VALUE = 80


def variable(loc: tuple[int | str, ...]) -> str:
    """``("worker", "concurrency")`` → ``BUSSCRAPE_WORKER__CONCURRENCY``."""
    return "BUSSCRAPE_" + "__".join(str(part).upper() for part in loc)


def reason(error: Any) -> str:
    """A few words for one pydantic error (``not an integer``, ``must be at least 1`` …)."""
    kind, ctx = error["type"], error.get("ctx") or {}
    simple = {
        "int_parsing": "not an integer", "int_type": "not an integer", "int_from_float": "not a whole number",
        "float_parsing": "not a number", "float_type": "not a number",
        "bool_parsing": "not a boolean (true or false)", "bool_type": "not a boolean (true or false)",
        "string_type": "not a string", "list_type": "not a list", "dict_type": "not an object",
        "model_type": "not a section (write one variable per setting)",
        "missing": "required", "extra_forbidden": "no such setting",
    }
    if kind in simple:
        return simple[kind]
    bounds = {"greater_than": "more than {gt}", "greater_than_equal": "at least {ge}",
              "less_than": "less than {lt}", "less_than_equal": "at most {le}"}
    if kind in bounds:
        return "must be " + bounds[kind].format(**ctx)
    if kind in ("too_short", "too_long"):
        bound = ctx.get("min_length") if kind == "too_short" else ctx.get("max_length")
        return f"must have at {'least' if kind == 'too_short' else 'most'} {bound} item(s)"
    if kind == "literal_error":
        return f"not one of {ctx.get('expected')}"
    if kind == "json_invalid":
        return f"not valid JSON ({ctx.get('error')})"
    if kind == "value_error" and ctx.get("error") is not None:
        return str(ctx["error"])
    message = str(error["msg"]).removeprefix("Value error, ")
    return message[:1].lower() + message[1:]


def shown(name: str, value: Any) -> str:
    """The value as the operator wrote it (quoted), or hidden when it is a secret's."""
    if _SECRET.search(name):
        return "(value hidden)"
    text = value if isinstance(value, str) else repr(value)
    if len(text) > _MAX_VALUE:
        text = text[: _MAX_VALUE - 1] + "…"
    return repr(text)


def describe(exc: Exception, *, flags: dict[str, str] | None = None) -> list[str]:
    """One line per problem: ``NAME='value': reason``. ``flags`` maps ``section.field`` to the
    command-line flag that set it, which is then named instead of the variable."""
    flags = flags or {}
    if isinstance(exc, ValidationError):
        lines = []
        for error in exc.errors():
            loc = tuple(error["loc"])
            dotted = ".".join(str(p) for p in loc)
            name = flags.get(dotted) or variable(loc)
            value = error.get("input")
            text = reason(error)
            if isinstance(value, str | int | float):
                text = text.replace(f": {value!r}", "")  # said once, before the reason
                where = f"{name}{' ' if name.startswith('--') else '='}{shown(name, value)}"
            else:
                where = name
            lines.append(f"{where}: {text}")
        return lines
    match = _SOURCE_ERROR.search(str(exc))
    if match:  # a whole section given as one variable that is not JSON
        name = variable(tuple(match["field"].split(".")))
        raw = os.environ.get(name)
        where = name if raw is None else f"{name}={shown(name, raw)}"
        return [f"{where}: not a JSON object; set each value on its own ({name}__<SETTING>=…)"]
    return [str(exc)]
