"""The call to the receiver: made with no transaction open and no row locked, and only while
the caller's lease has time left (docs/architecture.md section 6)."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction

from actions.engine.faults import fault_point
from actions.foundation.clock import database_clock_now
from actions.foundation.tracing import action_span, outcome_set
from actions.kinds import kind_for
from actions.kinds.base import Answer, Receiver, ReceiverContract
from actions.models import Action, Attempt

log = logging.getLogger(__name__)


def receiver_for(action: Action) -> Receiver:
    """The receiver configured for the action's kind."""
    return kind_for(action.kind).receiver()


def receiver_send(*, action: Action, receiver: Receiver | None = None) -> Answer:
    """Call the receiver. Never inside a transaction: the call may take seconds or hang."""
    assert not transaction.get_connection().in_atomic_block, "a network call must not run inside a transaction"
    receiver = receiver or receiver_for(action)
    return receiver.send(action)


@dataclass(frozen=True)
class Answered:
    """An answer to record: the attempt it came on, the lease it was sent under, and the
    receiver's contract (None when the caller knows none: the answer is then recorded as is)."""

    attempt_pk: int
    lease_token: uuid.UUID
    answer: Answer
    contract: ReceiverContract | None


@dataclass(frozen=True)
class Sent(Answered):
    """A lease holder's call that the receiver answered, not yet recorded."""

    action: Action  # the caller's copy, as its claim committed it


def submission_send(
    *, action: Action, attempt: Attempt, lease_token: uuid.UUID, receiver: Receiver | None = None
) -> Sent | None:
    """The call, for a caller that holds a freshly committed lease; None when it was not made."""
    receiver = receiver or receiver_for(action)
    # A worker that stalled between its claim and the call (a long GC pause, a suspended VM)
    # must not start a call that could outlast its lease: by then the lease sweeper may have
    # handed the action to reconciliation or a person. The attempt stays unanswered and the
    # lease expires, as if the worker had died here.
    margin = timedelta(seconds=settings.PROVIDER_TIMEOUT_SECONDS)
    if action.lease_expires_at is not None and database_clock_now() + margin > action.lease_expires_at:
        log.warning("action_id=%s lease nearly expired before the receiver call; not sending", action.action_id)
        return None
    fault_point("before_provider_call")
    with action_span("receiver.call", kind=action.kind, action_id=action.action_id) as span:
        answer = receiver_send(action=action, receiver=receiver)
        outcome_set(span, answer.outcome.value)
    fault_point("after_provider_answer")
    return Sent(
        action=action, attempt_pk=attempt.pk, lease_token=lease_token, answer=answer, contract=receiver.contract
    )
