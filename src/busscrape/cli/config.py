"""``busscrape config``: the effective settings, or the table of every setting."""

from __future__ import annotations

import sys
from typing import Any

import typer

from busscrape.cli.app import app, out, settings


@app.command("config")
def show_config(as_json: bool = typer.Option(False, "--json", help="Print JSON."),
                markdown: bool = typer.Option(False, "--markdown", help="Print every setting with its default "
                                              "and meaning as a Markdown table (docs/configuration.md's).")) -> None:
    """Print the effective settings (secrets masked) and where each can be set."""
    if markdown:
        from busscrape.settings.reference import reference_markdown

        sys.stdout.write(reference_markdown())
        return
    from busscrape.settings.reference import variables

    s = settings()
    data = s.model_dump(mode="json")
    if as_json:
        import orjson

        sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    from rich.table import Table

    table = Table("variable", "value", "meaning", show_lines=False)
    for variable in variables():
        value = data
        for key in variable.path:
            value = value[key]
        table.add_row(variable.name, _short(value), variable.meaning)
    out.print(table)


def _short(value: Any) -> str:
    import orjson

    # A list or a mapping as JSON: the form its environment variable takes (not a Python repr).
    text = orjson.dumps(value).decode() if isinstance(value, list | dict) else str(value)
    # Shortened only for a reader at a terminal: a pipe gets the whole value.
    return text if len(text) <= 40 or not out.is_terminal else text[:39] + "…"
