"""``python -m busscrape`` — the same as the ``busscrape`` command."""

from busscrape.entry import main

main()
