"""The ``busscrape`` command's entry point (and ``python -m busscrape``'s).

``run``, ``crawl`` and ``demo`` fork their daemons off a fork server that imports what the daemons
need (``ops.forks``). The sooner it starts, the sooner the first worker launches Chromium, and the
command line itself (Typer, every command's module) takes ~0.15 s of CPU to import: so a command
that will start local daemons starts the fork server here, from its raw arguments, before that
import. Nothing else starts it: the command line called any other way (the Python API, whose
``__main__`` is the user's script and must not be re-run in forks) has fresh interpreters as its
daemons (``ops.supervisor``). A NATS URL from the environment or a config file, without
``--with-daemons``, leaves the fork server idle.
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
    """Whether these arguments start local daemons: ``run``, ``crawl`` or ``demo`` without
    ``--nats-url``, or with ``--with-daemons``; not for ``--help``, ``crawl status`` or ``--detach``
    (which only talk to a server)."""
    if not args or args[0] not in FORKING or "--help" in args or "--detach" in args:
        return False
    if args[:2] == ["crawl", "status"]:
        return False
    remote = any(arg == "--nats-url" or arg.startswith("--nats-url=") for arg in args)
    return not remote or "--with-daemons" in args
