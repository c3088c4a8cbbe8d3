"""The invoice adjustment's proposal service: validate deterministically, then record.

Shaped like the refund's (``actions.kinds.refund.proposal``): the checks first
(``actions.kinds.invoice_adjustment.checks``; bad input writes nothing and names its field),
then ``actions.services.ProposalDraft``, the composing and recording every kind shares.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction

from actions.foundation.clock import database_clock_now
from actions.foundation.trail import Actor
from actions.kinds.fields import request_fields_check
from actions.kinds.invoice_adjustment.checks import (
    ADJUSTMENT_REQUEST_FIELDS,
    adjustment_payload,
    adjustment_request_resolve,
    bill_accounting_check,
    bill_balance_check,
)
from actions.kinds.invoice_adjustment.contract import invoice_adjustment_action_id
from actions.services import ProposalDraft, ProposalResult, answers_a_lost_proposal_race


@answers_a_lost_proposal_race
def action_propose_invoice_adjustment(
    *,
    bill_number: object,
    adjustment_number: object,
    amount: object,
    currency: object,
    reason_code: object,
    evidence: object = "",
    proposer: Actor,
    now: datetime | None = None,
) -> ProposalResult:
    """Validate an invoice adjustment deterministically and record it.

    - Bad input raises ProposalInvalid naming the field and writes nothing (invariant 11): an
      unknown bill or request, a voided bill, another currency than the bill's, an amount above
      the bill's adjustable balance (amount due - adjusted - reserved).
    - The same action id with the same payload returns the existing action; with another payload
      it raises ProposalConflict naming the fields.
    - Below the kind's auto-approval threshold (and the per-bill cap) the policy approves it in
      the same transaction.
    """
    now = now or database_clock_now()
    fields = request_fields_check(
        ADJUSTMENT_REQUEST_FIELDS,
        target_number=bill_number,
        request_number=adjustment_number,
        amount=amount,
        currency=currency,
        reason_code=reason_code,
        evidence=evidence,
    )
    with transaction.atomic(durable=True):
        bill, request = adjustment_request_resolve(fields, agent=proposer.agent)
        bill_accounting_check(bill, fields)
        draft = ProposalDraft.compose(
            invoice_adjustment_action_id(bill_number=bill.number, adjustment_number=request.number),
            adjustment_payload(bill, request, fields),
        )
        # An identical retry returns what exists before any check its own reservation could fail.
        existing = draft.existing()
        if existing is not None:
            return existing
        bill_balance_check(bill, fields)
        return draft.record(
            proposer,
            now=now,
            evidence=fields.evidence,
            bill=bill,
            adjustment_request=request,
            amount=fields.amount,
            currency=fields.currency,
            reason_code=fields.reason_code,
        )
