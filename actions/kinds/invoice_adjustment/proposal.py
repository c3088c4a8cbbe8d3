"""The invoice adjustment's proposal service: validate deterministically, then record.

Shaped like the refund's (``actions.kinds.refund.proposal``): the checks first
(``actions.kinds.invoice_adjustment.checks``; bad input writes nothing and names its field),
then ``actions.services.proposal_record``, the proposal recording every kind shares.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction

from actions.foundation.clock import database_clock_now
from actions.foundation.trail import Actor
from actions.kinds.invoice_adjustment.checks import (
    adjustment_fields_check,
    adjustment_payload,
    adjustment_request_resolve,
    bill_accounting_check,
    bill_balance_check,
)
from actions.kinds.invoice_adjustment.contract import invoice_adjustment_action_id
from actions.models import ActionKind
from actions.providers.base import validate_idempotency_key
from actions.services import (
    ProposalResult,
    action_new,
    answers_a_lost_proposal_race,
    existing_proposal,
    payload_hash,
    payload_versioned,
    proposal_record,
)


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
    fields = adjustment_fields_check(
        bill_number=bill_number,
        adjustment_number=adjustment_number,
        amount=amount,
        currency=currency,
        reason_code=reason_code,
        evidence=evidence,
    )
    with transaction.atomic(durable=True):
        bill, request = adjustment_request_resolve(fields, agent=proposer.agent)
        bill_accounting_check(bill, fields)
        action_id = invoice_adjustment_action_id(bill_number=bill.number, adjustment_number=request.number)
        validate_idempotency_key(action_id)
        payload = payload_versioned(adjustment_payload(bill, request, fields))
        digest = payload_hash(payload)
        # An identical retry returns what exists before any check its own reservation could fail.
        existing = existing_proposal(action_id, payload, digest)
        if existing is not None:
            return existing
        bill_balance_check(bill, fields)
        action = action_new(
            kind=ActionKind.INVOICE_ADJUSTMENT,
            action_id=action_id,
            payload=payload,
            digest=digest,
            proposer=proposer,
            evidence=fields.evidence,
            bill=bill,
            adjustment_request=request,
            amount=fields.amount,
            currency=fields.currency,
            reason_code=fields.reason_code,
        )
        return proposal_record(
            action=action,
            proposer=proposer,
            now=now,
            policy_reasons=[],
            event_evidence={"payload": payload, "payload_hash": digest, "evidence": fields.evidence},
            auto_policy=True,
            savepoint=False,
        )
