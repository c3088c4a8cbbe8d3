"""The refund proposal's checks, each a named step: they read, they never write.

Bad input raises ``ProposalInvalid`` naming its field (invariant 11). The proposal service
(``actions.kinds.refund.proposal``) runs them in order; the field checks come first, outside any
transaction, and the checks against the order inside the proposal's transaction.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings

from actions.kinds.fields import ProposalInvalid, RequestFieldNames, RequestFields
from actions.models import ActionKind, Agent, Order, ReasonCode, RefundRequest

# A refund is for one refund request on an order.
REFUND_REQUEST_FIELDS = RequestFieldNames(
    target="order_number", request="request_number", request_noun="refund request number", reasons=ReasonCode.values
)


def refund_request_resolve(fields: RequestFields, *, agent: Agent | None) -> RefundRequest:
    """The refund request and its order, in one read.

    Which of the two is missing is asked only when one is. An agent proposing against another
    agent's request finds no request, with the same answer as for a number that does not exist.
    """
    request = (
        RefundRequest.objects.visible_to(agent)
        .select_related("order")
        .filter(order__number=fields.target_number, number=fields.request_number)
        .first()
    )
    if request is None and not Order.objects.filter(number=fields.target_number).exists():
        raise ProposalInvalid.for_field("order_number", "not_found", f"There is no order {fields.target_number}.")
    if request is None:
        raise ProposalInvalid.for_field(
            "request_number",
            "not_found",
            f"Order {fields.target_number} has no refund request {fields.request_number}.",
        )
    return request


def order_payment_check(order: Order, fields: RequestFields) -> None:
    """The order has a payment at the provider to refund, in the proposal's currency."""
    if not order.charge_reference:
        raise ProposalInvalid.for_field(
            "order_number", "no_charge", f"Order {fields.target_number} has no payment at the provider to refund."
        )
    fields.currency_check(order.currency, target_words=f"Order {fields.target_number} was paid in")


def refund_payload(order: Order, request: RefundRequest, fields: RequestFields) -> dict[str, Any]:
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


def exceeds_refundable_balance(order: Order, fields: RequestFields) -> bool:
    return fields.amount > order.refundable_amount


def over_refundable_balance(order: Order, fields: RequestFields) -> ProposalInvalid:
    """The refusal of an amount the order's refundable balance does not cover, with the sum."""
    currency = fields.currency
    return ProposalInvalid.for_field(
        "amount",
        "over_refundable_balance",
        f"{fields.amount} {currency} is more than the refundable balance of order {fields.target_number} "
        f"({order.refundable_amount} {currency}: captured {order.captured_amount}, "
        f"refunded {order.refunded_amount}, reserved {order.reserved_amount}).",
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
