"""Recording a receiver's answer: on the attempt always, on the action only for the lease holder.

One transaction records the answer, but only while the caller still holds the lease
(invariant 3): its first write is the action's row, fenced on its status and lease token.
The dispatcher's group commit records several answers in one transaction, each still fenced
on its own lease (docs/architecture.md section 6).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db import connection, transaction
from django.utils import timezone
from django_fsm import ConcurrentTransition

from actions.engine.claim import target_lock_order
from actions.engine.escalation import action_escalate
from actions.engine.outcomes import outcome_book, outcome_transition
from actions.engine.send import Answered, Sent
from actions.foundation import sql
from actions.foundation.tracing import traced
from actions.foundation.trail import Actor, Writes, attempt_answer_write
from actions.kinds.base import Answer, Outcome, ReceiverContract
from actions.models import Action, ActionStatus, Attempt

log = logging.getLogger(__name__)
S = ActionStatus


def submission_record(
    *,
    action_pk: int,
    attempt_pk: int,
    lease_token: uuid.UUID,
    answer: Answer,
    contract: ReceiverContract | None = None,
    action: Action | None = None,
) -> str:
    """Record the receiver's answer: ``sent_record`` for a caller that holds no ``Sent``."""
    answered = Answered(attempt_pk=attempt_pk, lease_token=lease_token, answer=answer, contract=contract)
    return _record_alone(answered, action_pk=action_pk, action=action)


def sent_record(sent: Sent, *, action: Action | None) -> str:
    """Record what the receiver said to a ``Sent`` call, in a transaction of its own."""
    return _record_alone(sent, action_pk=sent.action.pk, action=action)


@traced("action.record", outcome=str)
def _record_alone(answered: Answered, *, action_pk: int, action: Action | None) -> str:
    """Record the receiver's answer: on the attempt always, on the action only for the lease holder.

    A late worker whose lease expired (and was swept to UNKNOWN) still stores what the receiver
    said on its attempt row: reconciliation and people read it as evidence.

    ``action``: the caller's copy of the action as its claim committed it. The record then reads
    nothing: its first write is the action's UPDATE, fenced on the status and the lease token
    (``actions.foundation.sql.ACTIONS_RECORD``: ``WHERE status = 'SUBMITTING' AND lease_token = ...``), and
    changing no row means the lease was lost. Without it (or when the answer hands the action
    to a person, who is picked from the current row) the action is read under a row lock first.
    """
    now = timezone.now()
    try:
        with transaction.atomic(durable=True):
            writes = Writes()
            if action is None or _escalates(answered):
                action = Action.objects.select_for_update().get(pk=action_pk)
                if not (action.status == S.SUBMITTING and action.lease_token == answered.lease_token):
                    raise _LeaseLost(action)
            record = _record_in_memory(answered, action=action, now=now, writes=writes)
            _records_write([record], writes)
            return record.status
    except ConcurrentTransition as lost:
        action = lost.action if isinstance(lost, _LeaseLost) else action
        return _lease_lost(answered, action_pk=action_pk, action=action, now=now)


class _LeaseLost(ConcurrentTransition):
    """The lease was lost, seen on the action's row as read under lock (kept for the log line)."""

    def __init__(self, action: Action) -> None:
        super().__init__("the lease was lost before recording")
        self.action = action


def _escalates(answered: Answered) -> bool:
    """Whether the answer hands the action to a person: the owner is picked from its current row."""
    return answered.answer.outcome == Outcome.NEEDS_REVIEW or _unknown_for_good(answered)


def _unknown_for_good(answered: Answered) -> bool:
    """Whether the outcome is unknown and no lookup or idempotency key could ever tell it."""
    contract = answered.contract
    return answered.answer.outcome == Outcome.UNKNOWN and contract is not None and not contract.can_be_asked


@dataclass(frozen=True)
class _Record:
    """A lease holder's record, run in memory and not yet written."""

    action: Action
    lease_token: uuid.UUID
    status: str


def _record_in_memory(answered: Answered, *, action: Action, now: datetime, writes: Writes) -> _Record:
    """The lease holder's transition for the answer, in memory (its event and the answer on the
    attempt go to ``writes``): ``_records_write`` writes it."""
    status = _submission_apply(answered, action=action, now=now, writes=writes)
    _attempt_answered(answered, held_lease=True, now=now, writes=writes)
    return _Record(action=action, lease_token=answered.lease_token, status=status)


def _records_write(records: Sequence[_Record], writes: Writes) -> None:
    """Write lease holders' records, in the caller's transaction, in this order:

    1. the lease fence: the actions' rows in one UPDATE, each a compare-and-set on its status
       and the lease token its record holds (``actions.foundation.sql.actions_record``). Changing fewer rows
       than there are records means a lease was lost: ConcurrentTransition, and the caller's
       transaction rolls back. First, so that a lost lease has written nothing, and so that a
       record waits on the action's row before its target's, as the claim and the reconciler
       lock them;
    2. what each outcome books on its target (the kind's hooks), in the order given;
    3. the events (and their outbox rows) and the answers on the attempts.
    """
    if records:
        written = sql.actions_record([(record.action, record.lease_token) for record in records])
        if written != len(records):
            raise ConcurrentTransition(f"{len(records) - written} of {len(records)} leases lost before recording")
    for record in records:
        outcome_book(record.action, from_status=S.SUBMITTING)
    writes.write()


def _attempt_answered(answered: Answered, *, held_lease: bool, now: datetime, writes: Writes | None = None) -> None:
    """What the receiver said, on the attempt: always, whether or not the lease was still held
    (with ``writes``, written with the record's other rows)."""
    answer = answered.answer
    attempt_answer_write(
        Attempt(
            pk=answered.attempt_pk,
            response=answer.response_json(),
            error=answer.error_json(),
            outcome=answer.outcome.value,
            held_lease=held_lease,
            finished_at=now,
        ),
        writes=writes,
    )


def _lease_lost(
    answered: Answered, *, action_pk: int, action: Action | None, now: datetime, writes: Writes | None = None
) -> str:
    """The action moved on without this worker (its lease expired and was swept, or another
    holder took over): the answer is kept on the attempt as evidence, and nothing else."""
    _attempt_answered(answered, held_lease=False, now=now, writes=writes)
    log.warning(
        "action_id=%s lease lost before recording (%s); the answer is kept on attempt %s",
        action.action_id if action is not None else action_pk,
        answered.answer.summary(),
        answered.attempt_pk,
    )
    return "lease_lost"


def submission_record_group(*, sent: Sequence[Sent]) -> list[str | Exception]:
    """Record several lease holders' answers in one transaction: the dispatcher's group commit.

    Answers that came back while another was being recorded share one commit, and each agent's
    webhook is read once for the group instead of once per event. Each record is the one
    ``submission_record`` makes, under its own lease: the group first locks its actions and
    reads their leases in one statement, so an answer whose lease was lost meanwhile goes on its
    attempt only (in the same transaction) and leaves its action alone, while the others are
    recorded, still fenced on their tokens. Any failure rolls the whole group back; each answer
    is then recorded in a transaction of its own, from its row read under lock (the copies in
    hand may have moved in the rolled-back group), so one bad record holds up only itself.

    Returns each answer's result in order: the action's new status, "lease_lost", or the error
    that stopped its own record (its lease then expires to UNKNOWN and reconciliation).
    """
    if len(sent) == 1:
        return [_record_one(sent[0], action=sent[0].action)]
    now = timezone.now()
    results: dict[int, str] = {}
    try:
        with transaction.atomic(durable=True):
            # With each action, its agent's active webhook: the records' events need it for
            # their outbox rows (one read fewer a group).
            locked = sql.actions_lock_for_record(action_pks=[one.action.pk for one in sent])
            writes = Writes(
                webhooks={row.agent_id: row.agent_webhook_pk for row in locked.values() if row.agent_id is not None}
            )
            records = []
            # Targets in the claims' lock order: two groups never wait on each other in a cycle.
            for index in sorted(range(len(sent)), key=lambda i: target_lock_order(sent[i].action)):
                one = sent[index]
                row = locked.get(one.action.pk)
                if row is None or (row.status, row.lease_token) != (S.SUBMITTING, one.lease_token):
                    results[index] = _lease_lost(
                        one, action_pk=one.action.pk, action=one.action, now=now, writes=writes
                    )
                    continue
                action = one.action
                if _escalates(one):
                    action = Action.objects.select_for_update().get(pk=one.action.pk)
                record = _record_in_memory(one, action=action, now=now, writes=writes)
                records.append(record)
                results[index] = record.status
            _records_write(records, writes)
        return [results[index] for index in range(len(sent))]
    except Exception:
        log.exception("a group of %d records failed and was rolled back; recording each on its own", len(sent))
        # A connection that broke under the group (a restart, a failover) would fail every
        # record below: reconnect first.
        connection.close_if_unusable_or_obsolete()
    return [_record_one(one, action=None) for one in sent]


def _record_one(sent: Sent, *, action: Action | None) -> str | Exception:
    try:
        return sent_record(sent, action=action)
    except Exception as error:
        log.exception("action_id=%s: its record failed; its lease expires to reconciliation", sent.action.action_id)
        return error


def _submission_apply(answered: Answered, *, action: Action, now: datetime, writes: Writes) -> str:
    """The lease holder's transition for the answer (in memory, inside the record's transaction)."""
    answer, attempt_pk = answered.answer, answered.attempt_pk
    if _unknown_for_good(answered):
        # No reconciliation could ever tell what happened (docs/architecture.md section 4, SUBMITTING ->
        # NEEDS_REVIEW): hand it to a person now rather than after a pass that can only give up.
        action_escalate(
            action=action,
            actor=Actor.system("dispatcher"),
            now=now,
            reason=f"The outcome is unknown ({answer.summary()}) and the receiver has no lookup and no "
            "idempotency keys: only a person can find out what happened.",
            evidence={"answer": answer.summary(), "source": "submission", "attempt_id": attempt_pk},
            writes=writes,
        )
        return action.status
    return outcome_transition(
        action=action,
        answer=answer,
        actor=Actor.system("dispatcher"),
        now=now,
        source="submission",
        evidence={"attempt_id": attempt_pk},
        writes=writes,
    )
