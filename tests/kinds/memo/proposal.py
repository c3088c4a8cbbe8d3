"""The memo's proposal service, built like the shipped kinds' from the steps every kind shares."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from actions.foundation.trail import Actor
from actions.providers.base import validate_idempotency_key
from actions.services import (
    ProposalResult,
    action_new,
    answers_a_lost_proposal_race,
    existing_proposal,
    payload_hash,
    proposal_record,
)
from tests.kinds.memo.checks import memo_fields_check, memo_payload
from tests.kinds.memo.contract import MEMO, memo_action_id


@answers_a_lost_proposal_race
def memo_propose(
    *,
    topic: object,
    number: object,
    text: object,
    amount: object = "1.00",
    currency: object = "EUR",
    proposer: Actor,
    now: datetime | None = None,
) -> ProposalResult:
    """Check the memo's fields and record it; a manager decides (no policy reads it)."""
    now = now or timezone.now()
    fields = memo_fields_check(topic=topic, number=number, text=text, amount=amount, currency=currency)
    with transaction.atomic(durable=True):
        action_id = memo_action_id(topic=fields.topic, number=fields.number)
        validate_idempotency_key(action_id)
        payload = memo_payload(fields)
        digest = payload_hash(payload)
        existing = existing_proposal(action_id, payload, digest)
        if existing is not None:
            return existing
        action = action_new(
            kind=MEMO,
            action_id=action_id,
            payload=payload,
            digest=digest,
            proposer=proposer,
            evidence="",
            amount=fields.amount,
            currency=fields.currency,
            reason_code="goodwill",
        )
        return proposal_record(
            action=action,
            proposer=proposer,
            now=now,
            policy_reasons=[],
            event_evidence={"payload": payload},
            auto_policy=False,
            savepoint=False,
        )
