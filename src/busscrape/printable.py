"""Text from outside (a page, a message, an input line) made safe to show on a terminal.

Page titles, error texts, URLs and rejected input lines can hold escape sequences: printed as
they are, ``ESC]8;;…`` makes a link say something else and ``ESC[2J`` clears the screen. Every
terminal output of such text (the CLI's tables, console-format logs) goes through ``visible``;
the CLI's rich markup also escapes it (``busscrape.cli.app.safe``). JSON output needs neither:
its encoder escapes control characters itself.
"""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL, C1 controls (0x9b is a one-byte CSI), and the Unicode
# bidirectional overrides that make text read in another order than it is stored.
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def visible(value: object) -> str:
    """``value`` as text with each unprintable character shown as its escape (``\\x1b``)."""
    text = value if isinstance(value, str) else str(value)
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)
