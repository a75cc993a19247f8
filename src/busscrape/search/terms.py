"""The one query language of ``busscrape search`` and ``GET /search``, whatever the backend.

It is what people type into a search box, as PostgreSQL's ``websearch_to_tsquery`` (and most web
search engines) read it:

- ``quokka marsupial``: pages holding every word;
- ``"brown fox"``: the words next to each other, in that order (a phrase);
- ``fox or dog`` (``OR`` too): either; it binds tighter than the space (``a b or c`` is a and
  (b or c));
- ``-lazy``: pages without it (a query needs at least one word to find);
- anything else is text: ``covid-19``, ``example.com``, ``e-mail``, ``C++`` are searched as the
  backend's tokenizer splits them (``covid-19`` as the phrase ``covid 19``), never as operators.

A query is parsed here once into ``Terms``; each backend renders them in its own syntax (FTS5's
quoted strings with AND / OR / NOT in ``search.sqlite``, a normalised websearch text in
``search.postgres``), so no query is valid on one backend and an error on the other. Stemming
is the backend's: FTS5's ``unicode61`` does none, PostgreSQL's does per
``BUSSCRAPE_SEARCH__POSTGRES_CONFIG`` (``simple``, the default: none).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TOKEN = re.compile(r'-?"[^"]*(?:"|$)|\S+')
_WORDISH = re.compile(r"\w")


@dataclass(frozen=True, slots=True)
class Term:
    """A word, or a phrase (several words in order); ``text`` never holds a double quote."""

    text: str
    phrase: bool = False


@dataclass(frozen=True, slots=True)
class Terms:
    """``groups`` all must match, each by any of its terms; no page may match any of ``excluded``."""

    groups: tuple[tuple[Term, ...], ...]
    excluded: tuple[Term, ...] = ()


def parse(text: str) -> Terms | None:
    """The query's terms; None when it has no word to find (only operators, punctuation or
    exclusions)."""
    groups: list[list[Term]] = []
    excluded: list[Term] = []
    joining = False  # the last token was OR: the next term joins the last group
    for token in _TOKEN.findall(text):
        if token.lower() == "or" and groups:
            joining = True
            continue
        negated = token.startswith("-") and len(token) > 1
        body = token[1:] if negated else token
        phrase = body.startswith('"')
        words = body.replace('"', " ").strip()
        if not _WORDISH.search(words):
            continue  # punctuation alone: no backend finds it
        term = Term(" ".join(words.split()), phrase=phrase)
        if negated:
            excluded.append(term)
        elif joining:
            groups[-1].append(term)
        else:
            groups.append([term])
        joining = False
    if not groups:
        return None
    return Terms(tuple(tuple(g) for g in groups), tuple(excluded))
