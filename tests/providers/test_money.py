"""Money conversion: one tested function between Decimal and the receiver's minor units."""

from __future__ import annotations

from decimal import Decimal

import pytest

from actions.providers.money import (
    ZERO_DECIMAL_CURRENCIES,
    currency_exponent,
    from_minor_units,
    to_minor_units,
)


def test_it_converts_two_decimal_currencies_to_cents() -> None:
    assert to_minor_units(Decimal("10.50"), "EUR") == 1050
    assert to_minor_units(Decimal("0.01"), "usd") == 1
    assert to_minor_units(Decimal("12"), "gbp") == 1200


@pytest.mark.parametrize("currency", sorted(ZERO_DECIMAL_CURRENCIES))
def test_it_sends_zero_decimal_currencies_in_whole_units(currency: str) -> None:
    assert currency_exponent(currency) == 0
    assert to_minor_units(Decimal("1000"), currency) == 1000
    assert from_minor_units(1000, currency) == Decimal("1000")


def test_it_knows_exactly_stripes_zero_decimal_list() -> None:
    stripes_list = "BIF CLP DJF GNF JPY KMF KRW MGA PYG RWF UGX VND VUV XAF XOF XPF"
    assert set(stripes_list.split(" ")) == ZERO_DECIMAL_CURRENCIES
    assert currency_exponent("EUR") == 2


def test_it_accepts_trailing_zeros_beyond_the_currencys_places() -> None:
    assert to_minor_units(Decimal("10.00"), "JPY") == 10
    assert to_minor_units(Decimal("1.500"), "EUR") == 150


@pytest.mark.parametrize(
    ("amount", "currency"),
    [("10.5", "JPY"), ("1.005", "EUR"), ("0.001", "usd"), ("0.5", "KRW")],
)
def test_it_refuses_to_round_an_amount_more_precise_than_the_currency(amount: str, currency: str) -> None:
    with pytest.raises(ValueError, match="more precision"):
        to_minor_units(Decimal(amount), currency)


def test_it_handles_three_decimal_currencies_and_stripes_last_digit_rule() -> None:
    assert currency_exponent("KWD") == 3
    assert to_minor_units(Decimal("1.230"), "KWD") == 1230
    with pytest.raises(ValueError, match="end in 0"):
        to_minor_units(Decimal("1.235"), "KWD")


def test_it_converts_large_amounts_exactly_beyond_decimal_context_precision() -> None:
    amount = Decimal("123456789012345678901234567890.12")  # 32 digits: more than prec=28
    assert to_minor_units(amount, "EUR") == 12345678901234567890123456789012
    assert from_minor_units(12345678901234567890123456789012, "EUR") == amount


def test_it_rejects_floats_ints_and_non_finite_amounts() -> None:
    with pytest.raises(TypeError):
        to_minor_units(10.5, "EUR")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        to_minor_units(10, "EUR")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="finite"):
        to_minor_units(Decimal("NaN"), "EUR")
    with pytest.raises(ValueError, match="finite"):
        to_minor_units(Decimal("Infinity"), "EUR")


@pytest.mark.parametrize("currency", ["EU", "EURO", "", "€€€", "12A"])
def test_it_rejects_currency_codes_that_are_not_three_letters(currency: str) -> None:
    with pytest.raises(ValueError, match="three-letter"):
        to_minor_units(Decimal("1"), currency)


def test_it_converts_minor_units_back_with_the_currencys_places() -> None:
    assert str(from_minor_units(1050, "eur")) == "10.50"
    assert str(from_minor_units(5, "EUR")) == "0.05"
    assert str(from_minor_units(0, "EUR")) == "0.00"
    assert str(from_minor_units(-250, "EUR")) == "-2.50"
    assert str(from_minor_units(1500, "JPY")) == "1500"
    assert str(from_minor_units(1230, "KWD")) == "1.230"


def test_it_round_trips_negative_amounts() -> None:
    assert to_minor_units(Decimal("-2.50"), "EUR") == -250
    assert from_minor_units(to_minor_units(Decimal("-2.50"), "EUR"), "EUR") == Decimal("-2.50")


def test_it_rejects_bools_and_floats_as_minor_units() -> None:
    with pytest.raises(TypeError):
        from_minor_units(True, "EUR")
    with pytest.raises(TypeError):
        from_minor_units(10.0, "EUR")  # type: ignore[arg-type]
