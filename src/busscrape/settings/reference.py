"""Every setting with its default and meaning: ``busscrape config --markdown``, docs/configuration.md's table."""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Iterator
from functools import cache
from typing import NamedTuple

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from busscrape.settings.environment import Settings


@cache
def field_docs(model: type[BaseModel]) -> dict[str, str]:
    """Each field's meaning: the string literal under it in the class body (its own or a base's).
    Read from the source here, on demand, rather than by pydantic's ``use_attribute_docstrings``,
    which reads it at import: ~45 ms of every process that builds the settings, for the two commands
    that show it."""
    docs: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if not issubclass(cls, BaseModel) or cls.__module__.startswith("pydantic"):
            continue
        try:
            source = inspect.getsource(cls)
        except OSError:  # installed without its sources: the table without meanings, not a traceback
            continue
        [node] = ast.parse(textwrap.dedent(source)).body
        assert isinstance(node, ast.ClassDef)
        for field, under in zip(node.body, node.body[1:], strict=False):
            if (isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name)
                    and isinstance(under, ast.Expr) and isinstance(under.value, ast.Constant)
                    and isinstance(under.value.value, str)):
                docs[field.target.id] = inspect.cleandoc(under.value.value)
    return docs


def meaning(model: type[BaseModel], name: str) -> str:
    """A field's meaning on one line."""
    return " ".join(field_docs(model).get(name, "").split())


class Variable(NamedTuple):
    """One setting as its environment variable."""

    name: str
    """``BUSSCRAPE_NAME``, or ``BUSSCRAPE_SECTION__NAME`` for a section's setting."""
    path: tuple[str, ...]
    """Where its value is in ``Settings.model_dump()``: ``(name,)`` or ``(section, name)``."""
    field: FieldInfo
    meaning: str


def variables() -> Iterator[Variable]:
    """Every setting, in the order ``Settings`` declares them."""
    for name, field in Settings.model_fields.items():
        section = field.annotation
        if isinstance(section, type) and issubclass(section, BaseModel):
            for sub, subfield in section.model_fields.items():
                yield Variable(f"BUSSCRAPE_{name.upper()}__{sub.upper()}", (name, sub), subfield, meaning(section, sub))
        else:
            yield Variable(f"BUSSCRAPE_{name.upper()}", (name,), field, meaning(Settings, name))


def reference() -> list[tuple[str, str, str]]:
    """Every setting as (variable, default, meaning): the table of docs/configuration.md.

    Defaults are the declared ones (not this environment's values); computed ones say so.
    """
    def default(field: FieldInfo) -> str:
        if field.default_factory is not None:
            return "(computed)"
        value = field.default
        if value is None or value == [] or value == "":
            return ""
        if isinstance(value, BaseModel):
            return ""
        return str(value)

    return [(v.name, default(v.field), v.meaning.replace("|", "\\|")) for v in variables()]


def reference_markdown() -> str:
    """``reference()`` as a Markdown table."""
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    lines += [f"| `{var}` | {f'`{dflt}`' if dflt else ''} | {text} |" for var, dflt, text in reference()]
    return "\n".join(lines) + "\n"
