"""Every command with its arguments and options as Markdown: the documentation's CLI reference.

Read off the Typer app itself (the click commands it builds), so the reference says what
``busscrape <command> --help`` says and cannot drift from it; ``scripts/docs_hooks.py`` writes it
into the documentation site at build time. Hidden (internal) options are left out, as ``--help``
leaves them out.
"""

from __future__ import annotations

import inspect
from typing import Any

import typer.main


def cli_reference_markdown() -> str:
    """The whole command line: ``busscrape`` itself, then one section per command (and per
    subcommand of a group), each with its help, usage and options."""
    from busscrape.cli import app

    root = typer.main.get_command(app)
    ctx = root.context_class(root, info_name="busscrape")
    lines = _section(root, ctx, level=2, epilog=root.epilog) + _subcommands(root, ctx, level=2)
    return "\n".join(lines).rstrip("\n") + "\n"


# Typer builds its commands on a click of its own (``typer._click`` in Typer 0.2x), so they are
# read through their own attributes, never ``isinstance`` against the ``click`` package.
def _subcommands(group: Any, ctx: Any, level: int) -> list[str]:
    lines: list[str] = []
    for name, command in (getattr(group, "commands", None) or {}).items():
        if not command.hidden:
            sub = command.context_class(command, info_name=name, parent=ctx)
            lines += _section(command, sub, level) + _subcommands(command, sub, level + 1)
    return lines


def _section(command: Any, ctx: Any, level: int, epilog: str | None = None) -> list[str]:
    path = ctx.command_path
    usage = " ".join([path, *command.collect_usage_pieces(ctx)])
    lines = [f"{'#' * level} `{path}`", "", _text(command.help), ""]
    if epilog:
        lines += [_text(epilog), ""]
    lines += ["```", usage, "```", ""]
    rows = [record for param in command.params
            if not getattr(param, "hidden", False) and (record := param.get_help_record(ctx)) is not None]
    if rows:
        lines += ["| argument or option | meaning |", "|---|---|"]
        lines += [f"| `{_line(names)}` | {_html(_line(text), cell=True)} |" for names, text in rows]
        lines.append("")
    return lines


def _text(text: str | None) -> str:
    """A docstring or help text as a Markdown paragraph (click's ``\\b`` no-rewrap marks dropped)."""
    return _html(inspect.cleandoc(text or "").replace("\b\n", ""))


def _html(text: str, cell: bool = False) -> str:
    """Plain help text as Markdown that shows it as written: ``<int>`` and ``x<=65535`` are not
    HTML, ``*.jsonl`` and ``utm_*`` are not emphasis, and in a table ``a|b`` is no column break.
    Code spans (backquoted) are left alone: Markdown shows them as written already."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # the even parts are outside code spans
        part = parts[i].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*")
        parts[i] = part.replace("|", "\\|") if cell else part
    return "`".join(parts)


def _line(text: str) -> str:
    return " ".join(text.split())
