"""Every setting with its default and meaning: ``busscrape config --markdown``, docs/configuration.md's table."""

from __future__ import annotations

import ast
import inspect
import textwrap
from functools import cache
from typing import Any

from pydantic import BaseModel

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


def reference() -> list[tuple[str, str, str]]:
    """Every setting as (variable, default, meaning): the table of docs/configuration.md.

    Defaults are the declared ones (not this environment's values); computed ones say so.
    """
    rows: list[tuple[str, str, str]] = []

    def default(field: Any) -> str:
        if field.default_factory is not None:
            return "(computed)"
        value = field.default
        if value is None or value == [] or value == "":
            return ""
        if isinstance(value, BaseModel):
            return ""
        return str(value)

    def cell(model: type[BaseModel], name: str) -> str:
        return meaning(model, name).replace("|", "\\|")

    for name, field in Settings.model_fields.items():
        section = field.annotation
        if not (isinstance(section, type) and issubclass(section, BaseModel)):
            rows.append((f"BUSSCRAPE_{name.upper()}", default(field), cell(Settings, name)))
            continue
        for sub, subfield in section.model_fields.items():
            rows.append((f"BUSSCRAPE_{name.upper()}__{sub.upper()}", default(subfield), cell(section, sub)))
    return rows


def reference_markdown() -> str:
    """``reference()`` as a Markdown table."""
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    lines += [f"| `{var}` | {f'`{dflt}`' if dflt else ''} | {text} |" for var, dflt, text in reference()]
    return "\n".join(lines) + "\n"
