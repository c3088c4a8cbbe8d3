"""The refund proposal's checks, each a named step: they read, they never write.

Bad input raises ``ProposalInvalid`` naming its field (invariant 11). The proposal service
(``actions.kinds.refund.proposal``) runs them in order; the field checks come first, outside any
transaction, and the checks against the order inside the proposal's transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings

from actions.kinds.fields import (
    FieldProblem,
    ProposalInvalid,
    check_currency,
    check_evidence,
    check_reason_code,
    check_reference,
    check_request_number,
    parse_amount,
)
from actions.models import ActionKind, Agent, Order, RefundRequest


@dataclass(frozen=True)
class RefundFields:
    """A refund proposal's fields, each checked on its own."""

    order_number: str
    request_number: int
    currency: str
    amount: Decimal
    reason_code: str
    evidence: str


def refund_fields_check(
    *,
    order_number: object,
    request_number: object,
    amount: object,
    currency: object,
    reason_code: object,
    evidence: object,
) -> RefundFields:
    """Each field on its own: every bad one is named at once, before anything is read."""
    problems: list[FieldProblem] = []
    order_ref = check_reference("order_number", order_number, problems)
    number = check_request_number(request_number, problems)
    currency_code = check_currency(currency, problems)
    money = parse_amount(amount, currency_code, problems)
    reason = check_reason_code(reason_code, problems)
    evidence_text = check_evidence(evidence, problems)
    if problems:
        raise ProposalInvalid(problems)
    assert order_ref is not None and number is not None and currency_code is not None
    assert money is not None and reason is not None
    return RefundFields(
        order_number=order_ref,
        request_number=number,
        currency=currency_code,
        amount=money,
        reason_code=reason,
        evidence=evidence_text,
    )


def refund_request_resolve(fields: RefundFields, *, agent: Agent | None) -> RefundRequest:
    """The refund request and its order, in one read.

    Which of the two is missing is asked only when one is. An agent proposing against another
    agent's request finds no request, with the same answer as for a number that does not exist.
    """
    request = (
        RefundRequest.objects.visible_to(agent)
        .select_related("order")
        .filter(order__number=fields.order_number, number=fields.request_number)
        .first()
    )
    if request is None and not Order.objects.filter(number=fields.order_number).exists():
        raise ProposalInvalid([FieldProblem("order_number", "not_found", f"There is no order {fields.order_number}.")])
    if request is None:
        raise ProposalInvalid(
            [
                FieldProblem(
                    "request_number",
                    "not_found",
                    f"Order {fields.order_number} has no refund request {fields.request_number}.",
                )
            ]
        )
    return request


def order_payment_check(order: Order, fields: RefundFields) -> None:
    """The order has a payment at the provider to refund, in the proposal's currency."""
    if not order.charge_reference:
        raise ProposalInvalid(
            [
                FieldProblem(
                    "order_number",
                    "no_charge",
                    f"Order {fields.order_number} has no payment at the provider to refund.",
                )
            ]
        )
    if fields.currency != order.currency:
        raise ProposalInvalid(
            [
                FieldProblem(
                    "currency",
                    "currency_mismatch",
                    f"Order {fields.order_number} was paid in {order.currency}, not {fields.currency}.",
                )
            ]
        )


def refund_payload(order: Order, request: RefundRequest, fields: RefundFields) -> dict[str, Any]:
    """The material payload: what the approval binds and the receiver is sent."""
    return {
        "kind": ActionKind.REFUND.value,
        "order": order.number,
        "request": request.number,
        "charge": order.charge_reference,
        "amount": str(fields.amount),
        "currency": fields.currency,
        "reason_code": fields.reason_code,
    }


def exceeds_refundable_balance(order: Order, fields: RefundFields) -> bool:
    return fields.amount > order.refundable_amount


def over_refundable_balance(order: Order, fields: RefundFields) -> ProposalInvalid:
    """The refusal of an amount the order's refundable balance does not cover, with the sum."""
    currency = fields.currency
    return ProposalInvalid(
        [
            FieldProblem(
                "amount",
                "over_refundable_balance",
                f"{fields.amount} {currency} is more than the refundable balance of order {fields.order_number} "
                f"({order.refundable_amount} {currency}: captured {order.captured_amount}, "
                f"refunded {order.refunded_amount}, reserved {order.reserved_amount}).",
            )
        ]
    )


def refund_window_reasons(order: Order, *, now: datetime) -> list[dict[str, str]]:
    """Against policy, not bad input: a refund past the window is recorded REJECTED with this."""
    window = timedelta(days=settings.REFUND_WINDOW_DAYS)
    if order.paid_at + window >= now:
        return []
    return [
        {
            "code": "refund_window_past",
            "message": f"The refund window of {window.days} days ended on {(order.paid_at + window):%Y-%m-%d}.",
        }
    ]
