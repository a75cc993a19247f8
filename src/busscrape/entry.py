"""The ``busscrape`` command's entry point (and ``python -m busscrape``'s).

``run``, ``crawl`` and ``demo`` fork their daemons off a fork server that imports what the daemons
need (``ops.forks``). The sooner it starts, the sooner the first worker launches Chromium, and the
command line itself (Typer, every command's module) takes ~0.15 s of CPU to import: so a command
that will start local daemons starts the fork server here, from its arguments, before that
import. The command decides again once parsed (``cli.run.warm_daemons``, which does nothing if
the server already runs); this only guesses early, by the same rule on the raw arguments.
"""

from __future__ import annotations

import sys

FORKING = frozenset({"run", "crawl", "demo"})
"""The commands that start local daemons (unless they are given a NATS URL of their own)."""


def main() -> None:
    args = sys.argv[1:]
    if forks_daemons(args):
        from busscrape.ops import forks

        forks.prestart()
    from busscrape.cli import main as cli

    cli()


def forks_daemons(args: list[str]) -> bool:
    """Whether these arguments start local daemons: ``warm_daemons``'s rule (no ``--nats-url``, or
    ``--with-daemons``) on the raw arguments; not for ``--help``, ``crawl status`` or ``--detach``
    (which only talk to a server)."""
    if not args or args[0] not in FORKING or "--help" in args or "--detach" in args:
        return False
    if args[:2] == ["crawl", "status"]:
        return False
    remote = any(arg == "--nats-url" or arg.startswith("--nats-url=") for arg in args)
    return not remote or "--with-daemons" in args
