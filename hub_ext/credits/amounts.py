"""Amounts of credits as the Credits API writes them: decimal strings, at most two places.

The contract (``hub_ext/credits/openapi.yaml``, schema ``Amount``) allows
``^[0-9]{1,12}(\\.[0-9]{1,2})?$``: never a float, never negative, never more than two
decimal places.  Python code holds amounts as :class:`decimal.Decimal`; the reference
service stores them as whole hundredths (integer "cents") so that SQLite, which has no
exact decimal type, keeps them exact too.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

__all__ = [
    "AMOUNT_PATTERN",
    "MAX_CENTS",
    "POSITIVE_AMOUNT_PATTERN",
    "cents_to_decimal",
    "format_amount",
    "format_cents",
    "parse_amount",
    "to_cents",
]

#: The ``Amount`` pattern from the OpenAPI contract.
AMOUNT_PATTERN = re.compile(r"^[0-9]{1,12}(\.[0-9]{1,2})?$")

#: The ``PositiveAmount`` pattern (contract 1.1): an amount moved by a debit, refund or
#: grant, greater than zero and written without leading zeros ("0.25", "1", "10.50").
POSITIVE_AMOUNT_PATTERN = re.compile(r"^([1-9][0-9]{0,11}(\.[0-9]{1,2})?|0\.(0[1-9]|[1-9][0-9]?))$")

#: The largest amount the contract can express, in hundredths of a credit (999999999999.99).
MAX_CENTS = 10**14 - 1

_CENT = Decimal("0.01")


def parse_amount(text: object) -> Decimal:
    """Read a contract amount string ("1.50") into a Decimal of credits.

    Raises :class:`ValueError` when ``text`` is not a string matching the contract's
    ``Amount`` pattern (floats, numbers, signs, exponents and a third decimal place are
    all refused).
    """
    if not isinstance(text, str) or not AMOUNT_PATTERN.fullmatch(text):
        raise ValueError(f"not a contract amount (decimal string, at most two places): {text!r}")
    return Decimal(text).quantize(_CENT)


def to_cents(amount: Decimal | int | str) -> int:
    """An amount of credits as whole hundredths, refusing anything the contract cannot carry.

    Accepts a :class:`~decimal.Decimal`, an ``int`` or a contract string.  Floats are refused
    (:class:`TypeError`) because they cannot hold 0.10 exactly; negative, non-finite, too
    large or more-than-two-places amounts raise :class:`ValueError`.
    """
    if isinstance(amount, bool) or isinstance(amount, float):
        raise TypeError(f"amounts are Decimal, int or str, never {type(amount).__name__}")
    if isinstance(amount, str):
        value = parse_amount(amount)
    elif isinstance(amount, int):
        value = Decimal(amount)
    elif isinstance(amount, Decimal):
        value = amount
    else:
        raise TypeError(f"amounts are Decimal, int or str, not {type(amount).__name__}")
    try:
        if not value.is_finite() or value < 0 or value != value.quantize(_CENT):
            raise ValueError(
                f"amount must be a non-negative number of credits with at most two "
                f"decimal places, got {amount!r}"
            )
    except InvalidOperation as exc:
        raise ValueError(f"amount out of range: {amount!r}") from exc
    cents = int(value * 100)
    if cents > MAX_CENTS:
        raise ValueError(f"amount larger than the contract allows (999999999999.99): {amount!r}")
    return cents


def cents_to_decimal(cents: int) -> Decimal:
    """Whole hundredths back to a Decimal of credits with two places."""
    return (Decimal(cents) / 100).quantize(_CENT)


def format_cents(cents: int) -> str:
    """Whole hundredths as the contract string, always with two places: 150 -> "1.50"."""
    if cents < 0:
        raise ValueError(f"negative amount: {cents} hundredths")
    return f"{cents // 100}.{cents % 100:02d}"


def format_amount(amount: Decimal | int | str) -> str:
    """An amount of credits as the contract string with two places: Decimal("1.5") -> "1.50"."""
    return format_cents(to_cents(amount))
