"""Human units for durations and sizes: ``7d``, ``90s``, ``1h30m``, ``20MB``.

Settings, stream definitions and CLI flags all accept these, so an operator never has to
count nanoseconds. Durations are held as float seconds everywhere inside busscrape.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BeforeValidator, ByteSize, PlainSerializer, TypeAdapter

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_duration(value: str | float | int) -> float:
    """Seconds from ``90``, ``"90"``, ``"1.5s"``, ``"250ms"``, ``"1h30m"`` or ``"7d"``.

    Raises ``ValueError`` naming the text when it is not a duration.
    """
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"duration must not be negative: {value!r}")
        return float(value)
    text = str(value).strip().lower().replace(" ", "")
    if not text:
        raise ValueError("empty duration")
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if seconds < 0:
            raise ValueError(f"duration must not be negative: {value!r}")
        return seconds
    pos, total = 0, 0.0
    for match in _DURATION_PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _SECONDS[match.group(2)]
        pos = match.end()
    if pos != len(text) or pos == 0:
        raise ValueError(f"not a duration: {value!r} (use e.g. 250ms, 30s, 5m, 1h30m, 7d)")
    return total


def format_duration(seconds: float) -> str:
    """The shortest exact human form of ``seconds``: ``604800`` -> ``7d``, ``90`` -> ``1m30s``."""
    if seconds < 1 and seconds != 0:
        return f"{round(seconds * 1000)}ms"
    remaining = round(seconds)
    parts = []
    for unit in ("d", "h", "m", "s"):
        size = int(_SECONDS[unit])
        count, remaining = divmod(remaining, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


def parse_size(value: str | int) -> int:
    """Bytes from ``1048576``, ``"1MiB"``, ``"20MB"`` or ``"-1"`` (unlimited)."""
    if isinstance(value, int) or str(value).strip().lstrip("-").isdigit():
        return int(value)
    return int(_BYTE_SIZE.validate_python(value))


_BYTE_SIZE = TypeAdapter(ByteSize)

Duration = Annotated[
    float,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str, when_used="json"),
]
"""A duration in seconds that also accepts human forms (``30s``, ``7d``)."""

Size = Annotated[int, BeforeValidator(parse_size)]
"""A size in bytes that also accepts human forms (``20MB``, ``1GiB``); -1 means unlimited."""
