"""Turning a found value into its field's type, the same way for every source.

Values land in the record as JSON: ``decimal`` as a string of digits (``"1299.00"``: exact, and
what Parquet's decimal columns are made from at export), ``price`` as ``{"amount": "1299.00",
"currency": "€"}`` (read by Zyte's price-parser: ``"1.299 €"`` is 1299, not 1.299; the currency as
the page wrote it, a sign or a code, None when it gave none), ``date`` and ``datetime`` as ISO 8601,
``url`` resolved against the page (its ``<base href>`` first). A value that does not read as its
type raises ``NotThatType`` with the value and the type: the engine turns it into a warning, or
into the failure of a required field.
"""

from __future__ import annotations

import re
from datetime import date, datetime
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import urljoin

from price_parser import Price

from busscrape.extract.definition import FieldType

_NUMBER = re.compile(r"[-+]?\d[\d.,' \u00a0\u202f]*")
_TRUE = frozenset({"true", "yes", "1", "on", "y", "in stock", "instock"})
_FALSE = frozenset({"false", "no", "0", "off", "n", "out of stock", "outofstock"})
_DATE_FORMATS = ("%d %B %Y", "%B %d, %Y", "%b %d, %Y", "%d %b %Y", "%Y/%m/%d", "%d.%m.%Y")


class NotThatType(ValueError):
    pass


def coerce(value: Any, kind: FieldType, *, base_url: str, fmt: str | None = None) -> Any:
    """``value`` (text from the DOM, or JSON from metadata) as a JSON value of ``kind``."""
    try:
        return _CONVERTERS[kind](value, base_url, fmt)
    except (ValueError, InvalidOperation, TypeError, OverflowError):
        shown = value if not isinstance(value, str) or len(value) <= 60 else value[:59] + "…"
        raise NotThatType(f"{shown!r} does not read as {kind}") from None


def number_text(text: str) -> str:
    """The first number in ``text`` with its grouping removed and ``.`` as the decimal point:
    ``"1.299,00 €"`` → ``"1299.00"``, ``"$1,299"`` → ``"1299"``, ``"12,5"`` → ``"12.5"``. A number
    with a currency is a price, read as price-parser reads it (``"1.299 €"`` → ``"1299"``)."""
    price = Price.fromstring(text)
    if price.currency is not None and price.amount is not None:
        return str(price.amount)
    found = _NUMBER.search(text)
    if found is None:
        raise ValueError(text)
    digits = re.sub(r"[' \u00a0\u202f]", "", found.group()).rstrip(".,")
    last_dot, last_comma = digits.rfind("."), digits.rfind(",")
    if last_dot >= 0 and last_comma >= 0:  # both: the later one is the decimal point
        point = "." if last_dot > last_comma else ","
        grouping = "," if point == "." else "."
        digits = digits.replace(grouping, "").replace(point, ".")
    elif last_comma >= 0:  # only commas: a decimal comma when one is followed by 1, 2 or 4+ digits
        tail = digits[last_comma + 1:]
        digits = digits.replace(",", ".") if digits.count(",") == 1 and len(tail) != 3 else digits.replace(",", "")
    elif digits.count(".") > 1:
        digits = digits.replace(".", "")
    return digits


def _str(value: Any, base_url: str, fmt: str | None) -> str:
    return value if isinstance(value, str) else str(value)


def _int(value: Any, base_url: str, fmt: str | None) -> int:
    if isinstance(value, bool):
        raise TypeError(value)
    if isinstance(value, int | float):
        if isinstance(value, float) and not value.is_integer():
            raise ValueError(value)
        return int(value)
    number = Decimal(number_text(str(value)))
    if number != number.to_integral_value():
        raise ValueError(value)
    return int(number)


def _float(value: Any, base_url: str, fmt: str | None) -> float:
    if isinstance(value, bool):
        raise TypeError(value)
    result = float(value) if isinstance(value, int | float) else float(number_text(str(value)))
    if result != result or result in (float("inf"), float("-inf")):
        raise ValueError(value)
    return result


def _decimal(value: Any, base_url: str, fmt: str | None) -> str:
    if isinstance(value, bool):
        raise TypeError(value)
    number = Decimal(str(value)) if isinstance(value, int | float) else Decimal(number_text(str(value)))
    if not number.is_finite():
        raise ValueError(value)
    return str(number)


def _price(value: Any, base_url: str, fmt: str | None) -> dict[str, str | None]:
    if isinstance(value, bool):
        raise TypeError(value)
    if isinstance(value, int | float):
        amount, currency = Decimal(str(value)), None
    else:
        price = Price.fromstring(str(value))
        if price.amount is None:
            raise ValueError(value)
        amount, currency = price.amount, price.currency
    if not amount.is_finite():
        raise ValueError(value)
    return {"amount": str(amount), "currency": currency}


def _date(value: Any, base_url: str, fmt: str | None) -> str:
    text = str(value).strip()
    if fmt:
        return datetime.strptime(text, fmt).date().isoformat()
    try:
        return date.fromisoformat(text[:10]).isoformat()
    except ValueError:
        pass
    for candidate in _DATE_FORMATS:
        try:
            return datetime.strptime(text, candidate).date().isoformat()
        except ValueError:
            continue
    raise ValueError(text)


def _datetime(value: Any, base_url: str, fmt: str | None) -> str:
    text = str(value).strip()
    return (datetime.strptime(text, fmt) if fmt else datetime.fromisoformat(text)).isoformat()


def _url(value: Any, base_url: str, fmt: str | None) -> str:
    text = str(value).strip()
    if not text:
        raise ValueError(text)
    return urljoin(base_url, text)


def _bool(value: Any, base_url: str, fmt: str | None) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower().rsplit("/", 1)[-1]  # schema.org's "https://schema.org/InStock"
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(value)


_CONVERTERS = {"str": _str, "int": _int, "float": _float, "decimal": _decimal, "price": _price, "date": _date,
               "datetime": _datetime, "url": _url, "bool": _bool}
