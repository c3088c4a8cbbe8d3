"""Conversion between console money (``Decimal``) and a receiver's integer minor units.

Every amount sent to a payment provider goes through ``to_minor_units``. The function refuses any
amount it cannot represent exactly, because rounding a refund by even one minor unit is a silent
disagreement between the console's ledger and the receiver's.
"""

from __future__ import annotations

from decimal import Decimal

__all__ = [
    "THREE_DECIMAL_CURRENCIES",
    "ZERO_DECIMAL_CURRENCIES",
    "currency_exponent",
    "from_minor_units",
    "normalize_currency",
    "to_minor_units",
]

# Stripe's zero-decimal currencies: amounts are sent in whole units (1000 JPY is ``1000``).
ZERO_DECIMAL_CURRENCIES: frozenset[str] = frozenset(
    {
        "BIF", "CLP", "DJF", "GNF", "JPY", "KMF", "KRW", "MGA",
        "PYG", "RWF", "UGX", "VND", "VUV", "XAF", "XOF", "XPF",
    }
)  # fmt: skip

# Stripe's three-decimal currencies: amounts are sent in thousandths, and Stripe requires the last
# digit to be 0 so that its banking partners can settle them. Treating them as two-decimal would
# send amounts ten times too small, so they get their own exponent and the extra rule below.
THREE_DECIMAL_CURRENCIES: frozenset[str] = frozenset({"BHD", "JOD", "KWD", "OMR", "TND"})


def normalize_currency(currency: str) -> str:
    """Return the upper-case ISO 4217 code, or raise ``ValueError`` if it is not one in shape."""
    if not isinstance(currency, str):
        raise TypeError(f"currency must be a str, not {type(currency).__name__}")
    code = currency.strip().upper()
    if len(code) != 3 or not code.isascii() or not code.isalpha():
        raise ValueError(f"currency must be a three-letter ISO 4217 code, got {currency!r}")
    return code


def currency_exponent(currency: str) -> int:
    """How many decimal places the receiver's minor unit has for ``currency`` (0, 2 or 3)."""
    code = normalize_currency(currency)
    if code in ZERO_DECIMAL_CURRENCIES:
        return 0
    if code in THREE_DECIMAL_CURRENCIES:
        return 3
    return 2


def to_minor_units(amount: Decimal, currency: str) -> int:
    """Convert ``amount`` in ``currency`` to an integer count of minor units.

    Raises ``ValueError`` when the amount has more precision than the currency allows
    (``JPY 10.5``, ``EUR 1.005``): the caller has a bug or bad input, and guessing which way to
    round would move real money. Trailing zeros are fine (``JPY 10.00`` is 10).
    """
    if not isinstance(amount, Decimal):
        # A float has already lost the exact value (0.1 + 0.2), and an int hides which unit the
        # caller meant, so only Decimal is accepted.
        raise TypeError(f"amount must be a Decimal, not {type(amount).__name__}")
    if not amount.is_finite():
        raise ValueError(f"amount must be a finite number, got {amount}")
    code = normalize_currency(currency)
    exponent = currency_exponent(code)

    # Integer arithmetic on the digit tuple: Decimal.scaleb and quantize go through the context
    # precision (28 digits by default) and could round a long amount without saying so.
    sign, digits, decimal_exponent = amount.as_tuple()
    assert isinstance(decimal_exponent, int)  # finite, checked above
    coefficient = int("".join(map(str, digits))) if digits else 0
    shift = decimal_exponent + exponent
    if shift >= 0:
        minor = coefficient * 10**shift
    else:
        divisor = 10**-shift
        minor, remainder = divmod(coefficient, divisor)
        if remainder:
            raise ValueError(
                f"{amount} {code} has more precision than {code} allows "
                f"({exponent} decimal places); refusing to round money"
            )
    if code in THREE_DECIMAL_CURRENCIES and minor % 10:
        raise ValueError(
            f"{amount} {code}: Stripe requires three-decimal currencies to end in 0 "
            "(a multiple of 0.010); refusing to round money"
        )
    return -minor if sign else minor


def from_minor_units(minor: int, currency: str) -> Decimal:
    """Convert an integer count of minor units back to a ``Decimal`` with the currency's places.

    ``from_minor_units(1050, "eur") == Decimal("10.50")``, and the result always carries exactly
    ``currency_exponent(currency)`` decimal places, so it prints the way finance expects.
    """
    # bool is an int subclass; True as an amount is always a bug.
    if isinstance(minor, bool) or not isinstance(minor, int):
        raise TypeError(f"minor units must be an int, not {type(minor).__name__}")
    exponent = currency_exponent(currency)
    digits = tuple(int(d) for d in str(abs(minor)))
    # Building from the tuple is exact whatever the size; Decimal arithmetic would round.
    return Decimal((1 if minor < 0 else 0, digits, -exponent))


def money_text(amount: object, currency: object) -> str:
    """How every page and message writes an amount: grouped, with its currency's places, then the
    code: ``money_text(Decimal("82.5"), "EUR") == "82.50 EUR"``, ``"12,800 JPY"``.

    An aggregate over a decimal column can come back without its trailing zeros (SQLite's SUM),
    so the places come from the currency, never from the value."""
    code = str(currency or "").strip()
    # Receivers write ISO codes in either case ("eur" at Stripe); anything else stays as given.
    code = code.upper() if len(code) == 3 and code.isalpha() else code
    if amount is None or amount == "":
        return code
    try:
        value = amount if isinstance(amount, Decimal) else Decimal(str(amount))
    except ArithmeticError:
        return f"{amount} {code}".strip()
    try:
        places = currency_exponent(code.upper())
    except (TypeError, ValueError):
        places = 2
    return f"{value:,.{places}f} {code}".strip()
