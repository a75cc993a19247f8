"""The Python API's keyword arguments as the command's own flags: parsed, checked and turned into
settings and run options by the ``run`` and ``crawl`` commands themselves (``cli.embedding``), so
the defaults, the validation and the messages are the command line's.

A keyword is a long option without its dashes (``--max-pages`` → ``max_pages``, the same key as in
a ``--config`` file: ``cli.config_file.key_of``); a repeatable option takes a list; a ``--x/--no-x``
flag takes True or False; ``steps`` may be the list itself; ``artifacts`` and ``block`` a list.
"""

from __future__ import annotations

import contextvars
import json
import re
from typing import TYPE_CHECKING, Any

from busscrape.errors import ConfigurationError

if TYPE_CHECKING:
    from busscrape.cli.embedding import Handoff

_FLAG = re.compile(r"--([a-z][a-z0-9-]*)")
COMMA_LISTS = frozenset({"artifacts", "block"})


def command(name: str) -> Any:
    """The CLI's ``name`` command (every command module imported: they register themselves)."""
    import typer.main

    from busscrape.cli import app

    return typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]


def argv(name: str, cmd: Any, positional: list[str], kwargs: dict[str, Any]) -> list[str]:
    """The command line ``kwargs`` spell (``ConfigurationError`` for a keyword it has no option for)."""
    from busscrape.cli.config_file import is_argument, parameters

    params = parameters(cmd)
    args: list[str] = []
    for key, value in kwargs.items():
        if key == "config":
            if value is not None:
                args += ["--config", str(value)]
            continue
        param = params.get(key)
        if param is None or is_argument(param):
            choices = ", ".join(k for k, p in params.items() if not is_argument(p))
            raise ConfigurationError(f"busscrape.{name}(): no argument {key}= (the arguments are config, {choices})")
        if value is None:
            continue
        flag = next(o for o in param.opts if o.startswith("--"))
        if param.is_flag:
            if not isinstance(value, bool):
                raise ConfigurationError(f"busscrape.{name}(): {key}={value!r}: True or False")
            if value:
                args.append(flag)
            elif param.secondary_opts:
                args.append(param.secondary_opts[0])
        elif param.multiple:
            for item in value if isinstance(value, list | tuple) else [value]:
                args += [flag, str(item)]
        elif key == "steps" and isinstance(value, list | tuple):
            args += [flag, json.dumps(list(value))]
        elif key in COMMA_LISTS and isinstance(value, list | tuple):
            args += [flag, ",".join(map(str, value))]
        else:
            args += [flag, str(value)]
    return [*args, "--", *positional] if positional else args


def plan(name: str, positional: list[str], kwargs: dict[str, Any]) -> Handoff:
    """What the ``name`` command builds from ``kwargs``: its settings and run options."""
    from busscrape.cli import embedding
    from busscrape.cli.config_file import click_errors, key_of, plain

    cmd = command(name)
    args = argv(name, cmd, positional, kwargs)

    def invoke() -> None:
        embedding.EMBEDDED.set(True)
        cmd.main(args=args, prog_name=f"busscrape {name}", standalone_mode=False)

    errors = click_errors()
    try:
        contextvars.copy_context().run(invoke)  # the command's context variables stay its own
    except embedding.Handoff as handoff:
        return handoff
    except errors.BadParameter as exc:
        key = key_of(exc.param) if exc.param is not None else "?"
        raise ConfigurationError(f"busscrape.{name}(): {key}={kwargs.get(key)!r}: {plain(exc)}") from None
    except errors.ClickException as exc:
        raise ConfigurationError(f"busscrape.{name}(): {spoken(exc.format_message())}") from None
    except ConfigurationError as exc:
        raise ConfigurationError(f"busscrape.{name}(): {spoken(str(exc))}") from None
    raise ConfigurationError(f"busscrape.{name}(): these arguments start nothing to wait for (--detach, status)")


def spoken(message: str) -> str:
    """A command-line message in the API's words: ``--max-pages 0`` → ``max_pages= 0``."""
    return _FLAG.sub(lambda m: m.group(1).replace("-", "_") + "=", message)
