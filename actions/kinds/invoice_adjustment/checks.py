"""The invoice adjustment proposal's checks, each a named step: they read, they never write.

Bad input raises ``ProposalInvalid`` naming its field (invariant 11): an unknown bill or
request, a bill outside the accounting system, another currency than the bill's, a voided bill,
an amount above the bill's adjustable balance (amount due - adjusted - reserved). The proposal
service (``actions.kinds.invoice_adjustment.proposal``) runs them in order.
"""

from __future__ import annotations

from typing import Any

from actions.kinds.fields import ProposalInvalid, RequestFieldNames, RequestFields
from actions.models import ActionKind, AdjustmentReason, AdjustmentRequest, Agent, Bill

# What an agent may give as an adjustment's reason: a duplicate credit note is voided by the
# correction path, never adjusted.
PROPOSABLE_REASONS = tuple(
    reason for reason in AdjustmentReason.values if reason != AdjustmentReason.DUPLICATE_CREDIT_NOTE
)


# An invoice adjustment is for one adjustment request on a bill.
ADJUSTMENT_REQUEST_FIELDS = RequestFieldNames(
    target="bill_number", request="adjustment_number", request_noun="adjustment number", reasons=PROPOSABLE_REASONS
)


def adjustment_request_resolve(fields: RequestFields, *, agent: Agent | None) -> tuple[Bill, AdjustmentRequest]:
    """The bill and its adjustment request. Another agent's request reads as no request, with
    the same answer as a number that does not exist."""
    bill = Bill.objects.filter(number=fields.target_number).first()
    if bill is None:
        raise ProposalInvalid.for_field("bill_number", "not_found", f"There is no bill {fields.target_number}.")
    request = AdjustmentRequest.objects.visible_to(agent).filter(bill=bill, number=fields.request_number).first()
    if request is None:
        raise ProposalInvalid.for_field(
            "adjustment_number",
            "not_found",
            f"Bill {fields.target_number} has no adjustment request {fields.request_number}.",
        )
    return bill, request


def bill_accounting_check(bill: Bill, fields: RequestFields) -> None:
    """The bill is in the accounting system, in the proposal's currency."""
    if not bill.accounting_reference:
        raise ProposalInvalid.for_field(
            "bill_number", "not_in_accounting", f"Bill {fields.target_number} is not in the accounting system."
        )
    fields.currency_check(bill.currency, target_words=f"Bill {fields.target_number} is in")


def adjustment_payload(bill: Bill, request: AdjustmentRequest, fields: RequestFields) -> dict[str, Any]:
    """The material payload: what the approval binds and the credit note is made from."""
    return {
        "kind": ActionKind.INVOICE_ADJUSTMENT.value,
        "bill": bill.number,
        "adjustment": request.number,
        "invoice_id": bill.accounting_reference,
        "supplier": bill.supplier_name,
        "amount": str(fields.amount),
        "currency": fields.currency,
        "reason_code": fields.reason_code,
    }


def bill_balance_check(bill: Bill, fields: RequestFields) -> None:
    """The bill is not voided and its adjustable balance covers the amount."""
    if bill.voided:
        raise ProposalInvalid.for_field("bill_number", "bill_voided", f"Bill {fields.target_number} is voided.")
    if fields.amount > bill.adjustable_amount:
        currency = fields.currency
        raise ProposalInvalid.for_field(
            "amount",
            "over_adjustable_balance",
            f"{fields.amount} {currency} is more than the adjustable balance of bill {fields.target_number} "
            f"({bill.adjustable_amount} {currency}: amount due {bill.amount_due}, "
            f"adjusted {bill.adjusted_amount}, reserved {bill.reserved_amount}).",
        )
