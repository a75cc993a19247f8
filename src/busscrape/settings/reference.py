"""Every setting with its default and meaning: ``busscrape config --markdown``, docs/configuration.md's table."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from busscrape.settings.environment import Settings


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

    def meaning(field: Any) -> str:
        return " ".join((field.description or "").split()).replace("|", "\\|")

    for name, field in Settings.model_fields.items():
        section = getattr(field.annotation, "model_fields", None)
        if section is None:
            rows.append((f"BUSSCRAPE_{name.upper()}", default(field), meaning(field)))
            continue
        for sub, subfield in section.items():
            rows.append((f"BUSSCRAPE_{name.upper()}__{sub.upper()}", default(subfield), meaning(subfield)))
    return rows


def reference_markdown() -> str:
    """``reference()`` as a Markdown table."""
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    lines += [f"| `{var}` | {f'`{dflt}`' if dflt else ''} | {text} |" for var, dflt, text in reference()]
    return "\n".join(lines) + "\n"
