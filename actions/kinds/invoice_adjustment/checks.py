"""The invoice adjustment proposal's checks, each a named step: they read, they never write.

Bad input raises ``ProposalInvalid`` naming its field (invariant 11): an unknown bill or
request, a bill outside the accounting system, another currency than the bill's, a voided bill,
an amount above the bill's adjustable balance (amount due - adjusted - reserved). The proposal
service (``actions.kinds.invoice_adjustment.proposal``) runs them in order.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from actions.kinds.fields import (
    REFERENCE_PATTERN,
    FieldProblem,
    ProposalInvalid,
    check_currency,
    check_evidence,
    parse_amount,
)
from actions.models import ActionKind, AdjustmentReason, AdjustmentRequest, Agent, Bill


def bill_number_check(raw: object, problems: list[FieldProblem]) -> str | None:
    value = str(raw if raw is not None else "").strip()
    if not value:
        problems.append(FieldProblem("bill_number", "required", "This field is required."))
        return None
    if not REFERENCE_PATTERN.match(value):
        problems.append(
            FieldProblem(
                "bill_number",
                "invalid_reference",
                "Use 1 to 32 characters: letters, digits, '.', '_' or '-', starting with a letter or digit.",
            )
        )
        return None
    return value


def adjustment_number_check(raw: object, problems: list[FieldProblem]) -> int | None:
    if isinstance(raw, bool):
        raw = None
    try:
        number = int(str(raw))
    except (TypeError, ValueError):
        problems.append(FieldProblem("adjustment_number", "invalid", "The adjustment number must be a whole number."))
        return None
    if not 1 <= number <= 1_000_000:
        problems.append(FieldProblem("adjustment_number", "out_of_range", "The adjustment number must be at least 1."))
        return None
    return number


def adjustment_reason_check(raw: object, problems: list[FieldProblem]) -> str | None:
    value = str(raw or "")
    allowed = [reason for reason in AdjustmentReason.values if reason != AdjustmentReason.DUPLICATE_CREDIT_NOTE]
    if value not in allowed:
        problems.append(
            FieldProblem(
                "reason_code", "unknown_reason_code", f"Unknown reason code. Use one of: {', '.join(allowed)}."
            )
        )
        return None
    return value


@dataclass(frozen=True)
class AdjustmentFields:
    """An invoice adjustment proposal's fields, each checked on its own."""

    bill_number: str
    adjustment_number: int
    currency: str
    amount: Decimal
    reason_code: str
    evidence: str


def adjustment_fields_check(
    *,
    bill_number: object,
    adjustment_number: object,
    amount: object,
    currency: object,
    reason_code: object,
    evidence: object,
) -> AdjustmentFields:
    """Each field on its own: every bad one is named at once, before anything is read."""
    problems: list[FieldProblem] = []
    bill_ref = bill_number_check(bill_number, problems)
    number = adjustment_number_check(adjustment_number, problems)
    currency_code = check_currency(currency, problems)
    money = parse_amount(amount, currency_code, problems)
    reason = adjustment_reason_check(reason_code, problems)
    evidence_text = check_evidence(evidence, problems)
    if problems:
        raise ProposalInvalid(problems)
    assert bill_ref is not None and number is not None and currency_code is not None
    assert money is not None and reason is not None
    return AdjustmentFields(
        bill_number=bill_ref,
        adjustment_number=number,
        currency=currency_code,
        amount=money,
        reason_code=reason,
        evidence=evidence_text,
    )


def adjustment_request_resolve(fields: AdjustmentFields, *, agent: Agent | None) -> tuple[Bill, AdjustmentRequest]:
    """The bill and its adjustment request. Another agent's request reads as no request, with
    the same answer as a number that does not exist."""
    bill = Bill.objects.filter(number=fields.bill_number).first()
    if bill is None:
        raise ProposalInvalid([FieldProblem("bill_number", "not_found", f"There is no bill {fields.bill_number}.")])
    request = AdjustmentRequest.objects.visible_to(agent).filter(bill=bill, number=fields.adjustment_number).first()
    if request is None:
        raise ProposalInvalid(
            [
                FieldProblem(
                    "adjustment_number",
                    "not_found",
                    f"Bill {fields.bill_number} has no adjustment request {fields.adjustment_number}.",
                )
            ]
        )
    return bill, request


def bill_accounting_check(bill: Bill, fields: AdjustmentFields) -> None:
    """The bill is in the accounting system, in the proposal's currency."""
    if not bill.accounting_reference:
        raise ProposalInvalid(
            [
                FieldProblem(
                    "bill_number",
                    "not_in_accounting",
                    f"Bill {fields.bill_number} is not in the accounting system.",
                )
            ]
        )
    if fields.currency != bill.currency:
        raise ProposalInvalid(
            [
                FieldProblem(
                    "currency",
                    "currency_mismatch",
                    f"Bill {fields.bill_number} is in {bill.currency}, not {fields.currency}.",
                )
            ]
        )


def adjustment_payload(bill: Bill, request: AdjustmentRequest, fields: AdjustmentFields) -> dict[str, Any]:
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


def bill_balance_check(bill: Bill, fields: AdjustmentFields) -> None:
    """The bill is not voided and its adjustable balance covers the amount."""
    if bill.voided:
        raise ProposalInvalid([FieldProblem("bill_number", "bill_voided", f"Bill {fields.bill_number} is voided.")])
    if fields.amount > bill.adjustable_amount:
        currency = fields.currency
        raise ProposalInvalid(
            [
                FieldProblem(
                    "amount",
                    "over_adjustable_balance",
                    f"{fields.amount} {currency} is more than the adjustable balance of bill {fields.bill_number} "
                    f"({bill.adjustable_amount} {currency}: amount due {bill.amount_due}, "
                    f"adjusted {bill.adjusted_amount}, reserved {bill.reserved_amount}).",
                )
            ]
        )
