"""Bounds on what a page controls: a result and a dead letter always fit in one message.

A page decides its final URL, its redirect chain, its response headers and which sub-requests it
makes; none of that may make a result too large for RESULTS (``streams.max_msg_size``, 1 MiB) or
a dead letter too large for DEADLETTER. Fields are cut here, each cut marked with ``TRUNCATED``
so that a reader knows; a letter that is still too large sheds what it embeds (the result's page
fields, then the task itself) and says so in ``truncated``, keeping the task id, URL and source
(its stream and sequence) as the reference.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from busscrape.model.messages import AttemptRecord, DeadLetter, encode

TRUNCATED = "…[truncated]"
MAX_URL = 4096  # characters of one URL (browsers go to 2 MB; archives and indexes should not)
MAX_REDIRECTS = 20
MAX_HEADERS = 100
MAX_HEADER_NAME = 256
MAX_HEADER_VALUE = 4096
MAX_HEADERS_TOTAL = 32 * 1024
MAX_BLOCKED = 100
MAX_ERROR = 4000


def cut(text: str, limit: int) -> str:
    """``text``, or its start and ``TRUNCATED`` when it is longer than ``limit`` characters."""
    return text if len(text) <= limit else text[: max(limit - len(TRUNCATED), 0)] + TRUNCATED


def urls(values: Iterable[str], *, most: int) -> tuple[str, ...]:
    """At most ``most`` URLs (the first and the last ones, a marker between), each cut."""
    values = [cut(v, MAX_URL) for v in values]
    if len(values) <= most:
        return tuple(values)
    head, tail = values[: most // 2], values[-(most - most // 2 - 1):]
    return (*head, f"{TRUNCATED} {len(values) - len(head) - len(tail)} more", *tail)


def headers(values: dict[str, str]) -> dict[str, str]:
    """At most ``MAX_HEADERS`` headers, each name and value cut, ``MAX_HEADERS_TOTAL`` in all."""
    out: dict[str, str] = {}
    total = 0
    for name, value in values.items():
        name, value = cut(name, MAX_HEADER_NAME), cut(value, MAX_HEADER_VALUE)
        total += len(name) + len(value)
        if len(out) >= MAX_HEADERS or total > MAX_HEADERS_TOTAL:
            out[TRUNCATED] = f"{len(values) - len(out)} more headers"
            break
        out[name] = value
    return out


def fit_letter(letter: DeadLetter, limit: int) -> tuple[DeadLetter, bytes]:
    """The letter as it fits in ``limit`` bytes, and its bytes: shorter texts first, then without
    the result's page fields, then without the embedded task (then it cannot be replayed, and its
    ``truncated`` says so)."""
    data = encode(letter)
    if len(data) <= limit:
        return letter, data
    steps: list[tuple[str, Callable[[DeadLetter], DeadLetter]]] = [
        ("texts", lambda lt: lt.model_copy(update={
            "error": cut(lt.error, 1000), "payload": cut(lt.payload, 1000) if lt.payload else lt.payload,
            "attempts": tuple(_short(a) for a in lt.attempts[-10:])})),
        ("result", lambda lt: lt.model_copy(update={"result": lt.result.model_copy(update={
            "response_headers": {}, "redirect_chain": (), "blocked_requests": (), "timings": {}, "labels": {}})
            if lt.result else None})),
        ("task", lambda lt: lt.model_copy(update={"task": None, "result": None, "payload": None})),
        ("attempts", lambda lt: lt.model_copy(update={"attempts": lt.attempts[-1:], "error": cut(lt.error, 300)})),
    ]
    cuts: list[str] = []
    for name, shrink in steps:
        letter = shrink(letter).model_copy(update={"truncated": (*cuts, name)})
        cuts.append(name)
        data = encode(letter)
        if len(data) <= limit:
            return letter, data
    return letter, data  # a few hundred bytes of ids and codes: fits any limit worth the name


def _short(attempt: AttemptRecord) -> AttemptRecord:
    return attempt.model_copy(update={"error": cut(attempt.error, 300)})
