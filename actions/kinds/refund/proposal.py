"""The refund's proposal service: validate deterministically, then record (docs/architecture.md
section 12, step 2). Each step is named for what it checks or does; the checks are in
``actions.kinds.refund.checks`` and the recording, shared by every kind, is
``actions.services.proposal_record``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction

from actions.foundation.clock import database_clock_now
from actions.foundation.trail import Actor
from actions.kinds.fields import ProposalInvalid
from actions.kinds.refund.checks import (
    exceeds_refundable_balance,
    order_payment_check,
    over_refundable_balance,
    refund_fields_check,
    refund_payload,
    refund_request_resolve,
    refund_window_reasons,
)
from actions.kinds.refund.contract import refund_action_id
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
def action_propose_refund(
    *,
    order_number: object,
    request_number: object,
    amount: object,
    currency: object,
    reason_code: object,
    evidence: object = "",
    proposer: Actor,
    now: datetime | None = None,
) -> ProposalResult:
    """Validate a refund proposal deterministically and record it.

    - Bad input raises ProposalInvalid and writes nothing (invariant 11).
    - The same action id with the same payload returns the existing action (``created`` False).
    - The same action id with another payload raises ProposalConflict naming the fields.
    - A proposal that is well-formed but against policy (refund window past) is recorded as
      REJECTED with its reasons.
    - An auto-approvable proposal is authorized in the same transaction (one commit).
    """
    now = now or database_clock_now()
    fields = refund_fields_check(
        order_number=order_number,
        request_number=request_number,
        amount=amount,
        currency=currency,
        reason_code=reason_code,
        evidence=evidence,
    )
    with transaction.atomic(durable=True):
        request = refund_request_resolve(fields, agent=proposer.agent)
        order = request.order
        order_payment_check(order, fields)
        action_id = refund_action_id(order_number=order.number, request_number=request.number)
        validate_idempotency_key(action_id)
        payload = payload_versioned(refund_payload(order, request, fields))
        digest = payload_hash(payload)
        if exceeds_refundable_balance(order, fields):
            return identical_retry_or_refusal(
                action_id, payload, digest, refusal=over_refundable_balance(order, fields)
            )
        action = action_new(
            kind=ActionKind.REFUND,
            action_id=action_id,
            payload=payload,
            digest=digest,
            proposer=proposer,
            evidence=fields.evidence,
            order=order,
            refund_request=request,
            amount=fields.amount,
            currency=fields.currency,
            reason_code=fields.reason_code,
        )
        return proposal_record(
            action=action,
            proposer=proposer,
            now=now,
            policy_reasons=refund_window_reasons(order, now=now),
            event_evidence={"payload": payload, "payload_hash": digest, "evidence": fields.evidence},
            auto_policy=True,
            savepoint=False,
        )


def identical_retry_or_refusal(
    action_id: str, payload: dict[str, Any], digest: str, *, refusal: ProposalInvalid
) -> ProposalResult:
    """An identical retry returns what exists, even when the first proposal's own reservation is
    what now leaves too little; otherwise ``refusal``. (A new proposal meets the UNIQUE action id
    in ``proposal_record`` instead, without a read first.)"""
    existing = existing_proposal(action_id, payload, digest)
    if existing is None:
        raise refusal
    return existing
