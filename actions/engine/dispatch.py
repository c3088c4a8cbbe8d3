"""Dispatch: claim, call the receiver outside any transaction, record what it said.

Every outside call has the same shape: a committed record first (the SUBMITTING row with its
lease, and the attempt with the request: actions.engine.claim), then the call with no
transaction open and no row locked (actions.engine.send), then one transaction that records
the answer, but only while the caller still holds the lease (invariant 3, actions.engine.record).
What each outcome does to the action is actions.engine.outcomes, in one place for every kind.
"""

from __future__ import annotations

import uuid

from actions.engine.claim import ClaimOutcome, submission_begin
from actions.engine.faults import fault_point
from actions.engine.record import sent_record
from actions.engine.send import submission_send
from actions.kinds.base import Receiver
from actions.models import Action, Attempt


def execution_dispatch(*, action_pk: int, skip_locked: bool = False) -> str:
    """Claim an authorized action, submit it once, record the answer. Safe to run twice."""
    claim = submission_begin(action_pk=action_pk, skip_locked=skip_locked)
    if claim.outcome != ClaimOutcome.CLAIMED:
        return claim.outcome.value
    assert claim.action is not None and claim.attempt is not None and claim.lease_token is not None
    return submission_send_and_record(action=claim.action, attempt=claim.attempt, lease_token=claim.lease_token)


def submission_send_and_record(
    *, action: Action, attempt: Attempt, lease_token: uuid.UUID, receiver: Receiver | None = None
) -> str:
    """The call and the record, for a caller that holds a freshly committed lease."""
    sent = submission_send(action=action, attempt=attempt, lease_token=lease_token, receiver=receiver)
    if sent is None:
        return "lease_too_short"
    status = sent_record(sent, action=action)
    fault_point("after_record")
    return status
