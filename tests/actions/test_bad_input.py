"""Bad input gets a clear error naming the field and writes nothing (invariant 11).

An agent's proposal arrives as loosely typed JSON; every case below is something an agent (or a
person at the API) could plausibly send.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest

from actions.kinds.fields import MAX_EVIDENCE_LENGTH, ProposalInvalid
from actions.models import Order
from actions.services import (
    ProposalResult,
)
from tests.factories import make_order, make_request

pytestmark = pytest.mark.django_db

Propose = Callable[..., ProposalResult]
Counts = Callable[[], dict[str, int]]

# (overrides of a valid proposal, the field the error must name, its code)
BAD_INPUT: list[tuple[str, dict[str, Any], str, str]] = [
    # amount
    ("negative amount", {"amount": "-5.00"}, "amount", "not_positive"),
    ("zero amount", {"amount": "0"}, "amount", "not_positive"),
    ("zero amount with decimals", {"amount": "0.00"}, "amount", "not_positive"),
    ("negative zero", {"amount": "-0"}, "amount", "not_positive"),
    ("three decimals in EUR", {"amount": "10.001"}, "amount", "too_many_decimals"),
    ("a float", {"amount": 40.0}, "amount", "invalid_type"),
    ("a float NaN", {"amount": float("nan")}, "amount", "invalid_type"),
    ("a boolean", {"amount": True}, "amount", "invalid_type"),
    ("NaN", {"amount": "NaN"}, "amount", "invalid"),
    ("signalling NaN", {"amount": "sNaN"}, "amount", "invalid"),
    ("Infinity", {"amount": "Infinity"}, "amount", "invalid"),
    ("minus infinity", {"amount": "-inf"}, "amount", "invalid"),
    ("a Decimal NaN", {"amount": Decimal("NaN")}, "amount", "invalid"),
    ("words", {"amount": "forty euros"}, "amount", "invalid"),
    ("a decimal comma", {"amount": "40,00"}, "amount", "invalid"),
    ("an empty amount", {"amount": ""}, "amount", "invalid"),
    ("no amount", {"amount": None}, "amount", "invalid"),
    ("an amount in exponent notation", {"amount": "1e20"}, "amount", "invalid"),
    ("an absurd amount", {"amount": "100000000000000"}, "amount", "too_large"),
    ("an amount with digit separators", {"amount": "4_0"}, "amount", "invalid"),
    ("over the refundable balance", {"amount": "100.01"}, "amount", "over_refundable_balance"),
    # currency
    ("an unknown currency", {"currency": "XYZ"}, "currency", "unknown_currency"),
    ("a currency name", {"currency": "EURO"}, "currency", "unknown_currency"),
    ("no currency", {"currency": ""}, "currency", "unknown_currency"),
    ("a null currency", {"currency": None}, "currency", "unknown_currency"),
    ("a currency symbol", {"currency": "€"}, "currency", "unknown_currency"),
    ("another currency than the order's", {"currency": "USD"}, "currency", "currency_mismatch"),
    # order reference
    ("an unknown order", {"order_number": "999999"}, "order_number", "not_found"),
    ("a 33-character order reference", {"order_number": "A" * 33}, "order_number", "invalid_reference"),
    ("a very long order reference", {"order_number": "4821" * 100}, "order_number", "invalid_reference"),
    ("a space inside the reference", {"order_number": "48 21"}, "order_number", "invalid_reference"),
    ("a path in the reference", {"order_number": "../4821"}, "order_number", "invalid_reference"),
    ("a colon in the reference", {"order_number": "4821:request-9"}, "order_number", "invalid_reference"),
    ("full-width digits", {"order_number": "\uff14\uff18\uff12\uff11"}, "order_number", "invalid_reference"),
    ("an accented reference", {"order_number": "ordér-4821"}, "order_number", "invalid_reference"),
    ("an emoji reference", {"order_number": "4821💸"}, "order_number", "invalid_reference"),
    ("a NUL in the reference", {"order_number": "4821\x00"}, "order_number", "invalid_reference"),
    ("no order", {"order_number": ""}, "order_number", "required"),
    ("a null order", {"order_number": None}, "order_number", "required"),
    # refund request
    ("an unknown request", {"request_number": 7}, "request_number", "not_found"),
    ("request zero", {"request_number": 0}, "request_number", "out_of_range"),
    ("a negative request", {"request_number": -1}, "request_number", "out_of_range"),
    ("a fractional request", {"request_number": "1.5"}, "request_number", "invalid"),
    ("a request in words", {"request_number": "first"}, "request_number", "invalid"),
    ("a boolean request", {"request_number": True}, "request_number", "invalid"),
    ("no request", {"request_number": None}, "request_number", "invalid"),
    # reason code
    ("an unknown reason code", {"reason_code": "because"}, "reason_code", "unknown_reason_code"),
    ("an upper-case reason code", {"reason_code": "DAMAGED"}, "reason_code", "unknown_reason_code"),
    ("an accented reason code", {"reason_code": "dämaged"}, "reason_code", "unknown_reason_code"),
    ("an emoji reason code", {"reason_code": "💸"}, "reason_code", "unknown_reason_code"),
    ("a reason code with a NUL", {"reason_code": "damaged\x00"}, "reason_code", "unknown_reason_code"),
    ("a reason code with a newline", {"reason_code": "damaged\n"}, "reason_code", "unknown_reason_code"),
    (
        "a reason label instead of its code",
        {"reason_code": "Damaged or defective"},
        "reason_code",
        "unknown_reason_code",
    ),
    ("no reason code", {"reason_code": ""}, "reason_code", "unknown_reason_code"),
    ("a null reason code", {"reason_code": None}, "reason_code", "unknown_reason_code"),
    # evidence
    ("evidence over the limit", {"evidence": "x" * (MAX_EVIDENCE_LENGTH + 1)}, "evidence", "too_long"),
    ("evidence with a NUL", {"evidence": "Ticket\x00 991"}, "evidence", "invalid_characters"),
]


@pytest.mark.parametrize(
    ("overrides", "field", "code"),
    [pytest.param(overrides, field, code, id=case) for case, overrides, field, code in BAD_INPUT],
)
def test_it_refuses_bad_input_naming_the_field_and_writes_nothing(
    propose: Propose, order: Order, row_counts: Counts, overrides: dict[str, Any], field: str, code: str
) -> None:
    """Invariant 11: bad input gets a clear error naming the field and writes nothing."""
    before = row_counts()

    with pytest.raises(ProposalInvalid) as raised:
        propose(**overrides)

    assert (field, code) in [(problem.field, problem.code) for problem in raised.value.problems]
    assert all(problem.message for problem in raised.value.problems)
    assert f"{field}: " in str(raised.value)
    assert row_counts() == before == {"actions": 0, "events": 0, "approvals": 0}
    assert Order.objects.filter(pk=order.pk, reserved_amount=0, refunded_amount=0, version=1).exists()


def test_it_names_every_bad_field_at_once(propose: Propose, row_counts: Counts) -> None:
    """An agent fixing its request one error at a time would need as many round trips."""
    with pytest.raises(ProposalInvalid) as raised:
        propose(amount="-1", currency="XYZ", reason_code="because", order_number="no such order!")

    assert {(problem.field, problem.code) for problem in raised.value.problems} == {
        ("amount", "not_positive"),
        ("currency", "unknown_currency"),
        ("reason_code", "unknown_reason_code"),
        ("order_number", "invalid_reference"),
    }
    assert row_counts() == {"actions": 0, "events": 0, "approvals": 0}


@pytest.fixture
def jpy_order(db: Any) -> Order:
    order = make_order(number="7000", currency="JPY", captured="50000")
    make_request(order, 1)
    return order


@pytest.mark.parametrize("amount", ["10.5", "1000.01", "0.1"])
def test_it_refuses_fractions_of_a_yen(propose: Propose, jpy_order: Order, row_counts: Counts, amount: str) -> None:
    """Invariant 11: JPY has no minor unit, so any fraction is bad input, never rounded."""
    with pytest.raises(ProposalInvalid) as raised:
        propose(order_number=jpy_order.number, amount=amount, currency="JPY")

    assert [(problem.field, problem.code) for problem in raised.value.problems] == [("amount", "too_many_decimals")]
    assert "JPY" in raised.value.problems[0].message
    assert row_counts() == {"actions": 0, "events": 0, "approvals": 0}


def test_whole_yen_are_accepted_with_no_decimals(propose: Propose, jpy_order: Order) -> None:
    """The counterpart of the test above: the currency, not a fixed two places, decides."""
    action = propose(order_number=jpy_order.number, amount="4000.00", currency="JPY").action

    assert action.amount == Decimal("4000")
    assert action.payload["amount"] == "4000"


def test_it_refuses_more_than_the_balance_left_after_refunds_and_reservations(
    propose: Propose, order: Order, row_counts: Counts
) -> None:
    """Invariant 5: refunded + reserved never exceeds captured, so neither does a new proposal."""
    Order.objects.filter(pk=order.pk).update(refunded_amount=Decimal("30.00"), reserved_amount=Decimal("30.00"))

    with pytest.raises(ProposalInvalid) as raised:
        propose(amount="40.01")

    problem = raised.value.problems[0]
    assert (problem.field, problem.code) == ("amount", "over_refundable_balance")
    assert "40.00" in problem.message  # the balance the agent may still ask for
    assert row_counts() == {"actions": 0, "events": 0, "approvals": 0}
    assert propose(amount="40.00").created


def test_evidence_at_the_limit_is_accepted(propose: Propose) -> None:
    """The boundary of the test above: exactly the limit is fine."""
    action = propose(evidence="x" * MAX_EVIDENCE_LENGTH).action

    assert len(action.evidence) == MAX_EVIDENCE_LENGTH
