"""The refund's proposal service: validate deterministically, then record (docs/architecture.md
section 12, step 2). Each step is named for what it checks or does; the checks are in
``actions.kinds.refund.checks`` and the composing and recording, shared by every kind, is
``actions.services.ProposalDraft``.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction

from actions.foundation.clock import database_clock_now
from actions.foundation.trail import Actor
from actions.kinds.fields import ProposalInvalid, request_fields_check
from actions.kinds.refund.checks import (
    REFUND_REQUEST_FIELDS,
    exceeds_refundable_balance,
    order_payment_check,
    over_refundable_balance,
    refund_payload,
    refund_request_resolve,
    refund_window_reasons,
)
from actions.kinds.refund.contract import refund_action_id
from actions.services import ProposalDraft, ProposalResult, answers_a_lost_proposal_race


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
    fields = request_fields_check(
        REFUND_REQUEST_FIELDS,
        target_number=order_number,
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
        draft = ProposalDraft.compose(
            refund_action_id(order_number=order.number, request_number=request.number),
            refund_payload(order, request, fields),
        )
        if exceeds_refundable_balance(order, fields):
            return identical_retry_or_refusal(draft, refusal=over_refundable_balance(order, fields))
        return draft.record(
            proposer,
            now=now,
            evidence=fields.evidence,
            policy_reasons=refund_window_reasons(order, now=now),
            order=order,
            refund_request=request,
            amount=fields.amount,
            currency=fields.currency,
            reason_code=fields.reason_code,
        )


def identical_retry_or_refusal(draft: ProposalDraft, *, refusal: ProposalInvalid) -> ProposalResult:
    """An identical retry returns what exists, even when the first proposal's own reservation is
    what now leaves too little; otherwise ``refusal``. (A new proposal meets the UNIQUE action id
    in ``proposal_record`` instead, without a read first.)"""
    existing = draft.existing()
    if existing is None:
        raise refusal
    return existing
