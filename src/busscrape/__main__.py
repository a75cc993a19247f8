"""``python -m busscrape`` — the same as the ``busscrape`` command."""

from busscrape.cli import main

main()
