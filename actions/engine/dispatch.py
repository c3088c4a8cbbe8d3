"""Dispatch: claim, call the receiver outside any transaction, record what it said.

Every outside call has the same shape: a committed record first (the SUBMITTING row with its
lease, and the attempt with the request), then the call with no transaction open and no row
locked, then one transaction that records the answer, but only while the caller still holds
the lease (invariant 3). What an answer means is the kind's answer table; what each outcome
does to the action is decided here, in one place, for every kind.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from django_fsm import ConcurrentTransition

from actions import permissions as perms
from actions.engine.claim import ClaimOutcome, submission_begin, submission_begin_batch, target_lock_order
from actions.engine.faults import fault_point
from actions.engine.throttle import dispatch_wait, throttle_pause, throttling_enabled
from actions.foundation import sql
from actions.foundation.owners import owner_pick
from actions.foundation.trail import Actor, Writes, action_transition, attempt_answer_write
from actions.kinds import kind_for
from actions.kinds.base import Answer, Outcome, Receiver, ReceiverContract
from actions.models import Action, ActionStatus, Attempt

log = logging.getLogger(__name__)
S = ActionStatus


def receiver_for(action: Action) -> Receiver:
    """The receiver configured for the action's kind."""
    return kind_for(action.kind).receiver()


# --- outcomes ------------------------------------------------------------------------------


def next_reconcile_time(*, action: Action, now: datetime, contract: ReceiverContract | None = None) -> datetime:
    """When to ask the receiver next: after its lookup visibility delay, with backoff and jitter."""
    contract = contract or kind_for(action.kind).contract()
    base = settings.RECONCILE_BASE_BACKOFF_SECONDS * (2 ** min(action.reconcile_failures, 6))
    jitter = random.uniform(0, base * 0.25)
    delay = max(contract.lookup_visibility_delay.total_seconds(), 0) + base + jitter
    return now + timedelta(seconds=delay)


def not_before_retry_after(*, action: Action, error: Exception | None, due: datetime, now: datetime) -> datetime:
    """A receiver that answered 429 with Retry-After is not asked again about this action before
    then; with rate limits configured, its bucket is paused too, so no new dispatch to it starts
    before then either, nor any reconciliation lookup (actions.engine.throttle)."""
    retry_after = getattr(error, "retry_after", None)
    if not retry_after:
        return due
    throttle_pause(kind_for(action.kind).contract().receiver, retry_after)
    return max(due, now + timedelta(seconds=retry_after))


def settle_poll_time(now: datetime) -> datetime:
    return now + timedelta(seconds=settings.RECONCILE_BASE_BACKOFF_SECONDS)


def outcome_book(action: Action, *, from_status: str | None = None) -> None:
    """Book a final outcome on the action's target and open its follow-ups (same transaction).

    ``from_status``: the status the outcome moved the action from. Back to AUTHORIZED from
    SUBMITTING (nothing was sent), the reservation is released: the next claim reserves anew.
    """
    kind = kind_for(action.kind)
    if action.status == S.SUCCEEDED:
        kind.book_success(action)
        kind.on_success(action)
    elif action.status == S.FAILED_FINAL:
        kind.release(action)
        kind.on_failure(action)
    elif action.status == S.AUTHORIZED and from_status == S.SUBMITTING:
        kind.release(action)


def apply_outcome(
    *,
    action: Action,
    answer: Answer,
    actor: Actor,
    now: datetime,
    source: str,
    evidence: dict[str, Any] | None = None,
) -> str:
    """Move a SUBMITTING, UNKNOWN or SETTLING action to the state the answer proves.

    Runs inside the caller's transaction, with the action row locked, and books the target's
    money and any follow-up in that same transaction.
    """
    from_status = action.status
    status = outcome_transition(
        action=action, answer=answer, actor=actor, now=now, source=source, evidence=evidence
    )
    outcome_book(action, from_status=from_status)
    return status


def outcome_transition(
    *,
    action: Action,
    answer: Answer,
    actor: Actor,
    now: datetime,
    source: str,
    evidence: dict[str, Any] | None = None,
    writes: Writes | None = None,
) -> str:
    """The transitions of ``apply_outcome``, without the booking: the caller books
    (``outcome_book``) once the action's row is written.

    ``writes``: a record's (of a SUBMITTING action), which writes the action's row (its lease
    fence), the events and the answers at its end (actions.foundation.trail.Writes).
    """
    words = kind_for(action.kind).explanations
    evidence = {"answer": answer.summary(), "source": source, **(evidence or {})}
    reference = answer.reference
    outcome = answer.outcome
    status = action.status

    if writes is not None and status != S.SUBMITTING:
        raise ValueError("only the record of a send writes its transitions with the record's rows")
    if outcome == Outcome.UNKNOWN and status != S.SUBMITTING:
        raise ValueError("an inconclusive answer for an action that is not submitting belongs to the reconciler")
    if outcome == Outcome.NEEDS_REVIEW:
        action_escalate(
            action=action,
            actor=actor,
            now=now,
            reason=f"Needs a person: {answer.summary()}.",
            evidence=evidence,
            writes=writes,
        )
        return action.status

    if outcome == Outcome.NOT_SENT:
        if status != S.SUBMITTING:
            raise ValueError("only a send can prove that nothing was sent")
        return _not_sent(action=action, answer=answer, actor=actor, now=now, evidence=evidence, writes=writes)

    if status == S.SUBMITTING:
        if outcome == Outcome.SUCCEEDED:
            action_transition(
                action=action,
                transition="record_success",
                actor=actor,
                reason=words.succeeded,
                evidence=evidence,
                now=now,
                writes=writes,
                provider_reference=reference,
            )
        elif outcome == Outcome.PENDING:
            action_transition(
                action=action,
                transition="record_pending",
                actor=actor,
                reason=words.pending,
                evidence=evidence,
                now=now,
                writes=writes,
                provider_reference=reference,
            )
            action.next_reconcile_at = settle_poll_time(now)
            if writes is None:  # otherwise written with the transition, by the record
                action.save(update_fields=["next_reconcile_at"])
        elif outcome == Outcome.FAILED_FINAL:
            action_transition(
                action=action,
                transition="record_failure",
                actor=actor,
                reason=f"{words.failed}: {answer.summary()}.",
                evidence=evidence,
                now=now,
                writes=writes,
                provider_reference=reference,
            )
        else:
            action_transition(
                action=action,
                transition="mark_unknown",
                actor=actor,
                reason=f"The outcome is unknown ({answer.summary()}); reconciliation will ask the receiver.",
                evidence=evidence,
                now=now,
                writes=writes,
                next_reconcile_at=not_before_retry_after(
                    action=action, error=answer.error, due=next_reconcile_time(action=action, now=now), now=now
                ),
            )
    elif status == S.UNKNOWN:
        target = {Outcome.SUCCEEDED: S.SUCCEEDED, Outcome.PENDING: S.SETTLING, Outcome.FAILED_FINAL: S.FAILED_FINAL}
        action_transition(
            action=action,
            transition="reconcile_found",
            actor=actor,
            reason=f"Reconciliation found the receiver's record: {answer.summary()}.",
            evidence=evidence,
            now=now,
            outcome=target[outcome],
            provider_reference=reference,
        )
        if action.status == S.SETTLING:
            action.next_reconcile_at = settle_poll_time(now)
            action.save(update_fields=["next_reconcile_at"])
    elif status == S.SETTLING:
        if outcome == Outcome.PENDING:
            return status  # still pending: the settlement poller keeps asking
        action_transition(
            action=action,
            transition="settle",
            actor=actor,
            reason=f"The receiver settled it: {answer.summary()}.",
            evidence=evidence,
            now=now,
            succeeded=outcome == Outcome.SUCCEEDED,
        )
    else:
        raise ValueError(f"cannot apply a receiver's answer to an action in {status}")
    return action.status


def _not_sent(
    *, action: Action, answer: Answer, actor: Actor, now: datetime, evidence: dict[str, Any], writes: Writes | None
) -> str:
    """The receiver proved it was never handed the request: back to AUTHORIZED for another send.

    Not a retry from UNKNOWN and not a re-send (invariants 7 and 16): the receiver has nothing,
    so the next send is the first it sees. The approval still holds and the next claim checks
    it again (expiry, binding); whatever the claim reserved is released, because that claim
    reserves it anew. The sweep of AUTHORIZED rows picks it up after its grace period, which
    spaces the sends out. A receiver that keeps refusing goes to a named person instead of
    being asked for ever (invariant 8). The release is ``outcome_book``'s.
    """
    if action.attempt_count >= settings.NOT_SENT_MAX_ATTEMPTS:
        action_escalate(
            action=action,
            actor=actor,
            now=now,
            reason=f"The {kind_for(action.kind).contract().receiver} refused it {action.attempt_count} times without "
            f"taking it ({answer.summary()}); nothing was sent. A person decides whether to send it again.",
            evidence=evidence,
            writes=writes,
        )
        return action.status
    action_transition(
        action=action,
        transition="record_not_sent",
        actor=actor,
        reason=f"Nothing was sent ({answer.summary()}): the receiver refused before taking it. "
        "It will be sent again under the same approval.",
        evidence=evidence,
        now=now,
        writes=writes,
    )
    return action.status


def action_escalate(
    *,
    action: Action,
    actor: Actor,
    now: datetime,
    reason: str,
    evidence: dict[str, Any],
    writes: Writes | None = None,
) -> Any:
    """Hand the action to a named person: the owner finance already set, if they are still an
    active member able to resolve it, otherwise the kind's owner group's member with the fewest
    open items."""
    current = action.owner
    if current is not None and current.is_active and current.has_perm(perms.RESOLVE):
        owner = current
    else:
        owner = owner_pick(kind=action.kind, default_group=kind_for(action.kind).owner_group)
    assignee = owner.get_username() if owner else "nobody: the owner group has no active member"
    action_transition(
        action=action,
        transition="escalate",
        actor=actor,
        reason=f"{reason} Assigned to {assignee}"
        + (
            " (already its owner)."
            if owner is current and owner is not None
            else " (the owner group's member with the fewest open items)."
        ),
        evidence={**evidence, "owner": owner.get_username() if owner else None},
        now=now,
        writes=writes,
        owner=owner,
        due_at=now + timedelta(hours=settings.REVIEW_DUE_HOURS),
    )
    return owner


# --- dispatch ------------------------------------------------------------------------------


def receiver_send(*, action: Action, receiver: Receiver | None = None) -> Answer:
    """Call the receiver. Never inside a transaction: the call may take seconds or hang."""
    assert not transaction.get_connection().in_atomic_block, "a network call must not run inside a transaction"
    receiver = receiver or receiver_for(action)
    return receiver.send(action)


def execution_dispatch(*, action_pk: int, skip_locked: bool = False) -> str:
    """Claim an authorized action, submit it once, record the answer. Safe to run twice."""
    claim = submission_begin(action_pk=action_pk, skip_locked=skip_locked)
    if claim.outcome != ClaimOutcome.CLAIMED:
        return claim.outcome.value
    assert claim.action is not None and claim.attempt is not None and claim.lease_token is not None
    return submission_send_and_record(action=claim.action, attempt=claim.attempt, lease_token=claim.lease_token)


@dataclass(frozen=True)
class Sent:
    """A lease holder's call that the receiver answered, not yet recorded."""

    action: Action  # the caller's copy, as its claim committed it
    attempt_pk: int
    lease_token: uuid.UUID
    answer: Answer
    contract: ReceiverContract


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
    if action.lease_expires_at is not None and timezone.now() + margin > action.lease_expires_at:
        log.warning("action_id=%s lease nearly expired before the receiver call; not sending", action.action_id)
        return None
    fault_point("before_provider_call")
    answer = receiver_send(action=action, receiver=receiver)
    fault_point("after_provider_answer")
    return Sent(
        action=action, attempt_pk=attempt.pk, lease_token=lease_token, answer=answer, contract=receiver.contract
    )


def submission_send_and_record(
    *, action: Action, attempt: Attempt, lease_token: uuid.UUID, receiver: Receiver | None = None
) -> str:
    """The call and the record, for a caller that holds a freshly committed lease."""
    sent = submission_send(action=action, attempt=attempt, lease_token=lease_token, receiver=receiver)
    if sent is None:
        return "lease_too_short"
    status = submission_record(
        action_pk=action.pk,
        attempt_pk=sent.attempt_pk,
        lease_token=lease_token,
        answer=sent.answer,
        contract=sent.contract,
        action=action,
    )
    fault_point("after_record")
    return status


def submission_record(
    *,
    action_pk: int,
    attempt_pk: int,
    lease_token: uuid.UUID,
    answer: Answer,
    contract: ReceiverContract | None = None,
    action: Action | None = None,
) -> str:
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
            if action is None or _escalates(answer, contract):
                action = Action.objects.select_for_update().get(pk=action_pk)
                if not (action.status == S.SUBMITTING and action.lease_token == lease_token):
                    raise _LeaseLost(action)
            record = _record_in_memory(
                action=action,
                attempt_pk=attempt_pk,
                lease_token=lease_token,
                answer=answer,
                contract=contract,
                now=now,
                writes=writes,
            )
            _records_write([record], writes)
            return record.status
    except ConcurrentTransition as lost:
        action = lost.action if isinstance(lost, _LeaseLost) else action
        return _lease_lost(action_pk=action_pk, attempt_pk=attempt_pk, answer=answer, action=action, now=now)


class _LeaseLost(ConcurrentTransition):
    """The lease was lost, seen on the action's row as read under lock (kept for the log line)."""

    def __init__(self, action: Action) -> None:
        super().__init__("the lease was lost before recording")
        self.action = action


def _escalates(answer: Answer, contract: ReceiverContract | None) -> bool:
    """Whether the answer hands the action to a person: the owner is picked from its current row."""
    return answer.outcome == Outcome.NEEDS_REVIEW or (
        answer.outcome == Outcome.UNKNOWN and contract is not None and not contract.can_be_asked
    )


@dataclass(frozen=True)
class _Record:
    """A lease holder's record, run in memory and not yet written."""

    action: Action
    lease_token: uuid.UUID
    status: str


def _record_in_memory(
    *,
    action: Action,
    attempt_pk: int,
    lease_token: uuid.UUID,
    answer: Answer,
    contract: ReceiverContract | None,
    now: datetime,
    writes: Writes,
) -> _Record:
    """The lease holder's transition for the answer, in memory (its event and the answer on the
    attempt go to ``writes``): ``_records_write`` writes it."""
    status = _submission_apply(
        action=action, attempt_pk=attempt_pk, answer=answer, contract=contract, now=now, writes=writes
    )
    _attempt_answered(attempt_pk=attempt_pk, answer=answer, held_lease=True, now=now, writes=writes)
    return _Record(action=action, lease_token=lease_token, status=status)


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


def _attempt_answered(
    *, attempt_pk: int, answer: Answer, held_lease: bool, now: datetime, writes: Writes | None = None
) -> None:
    """What the receiver said, on the attempt: always, whether or not the lease was still held
    (with ``writes``, written with the record's other rows)."""
    attempt_answer_write(
        Attempt(
            pk=attempt_pk,
            response=answer.response_json(),
            error=answer.error_json(),
            outcome=answer.outcome.value,
            held_lease=held_lease,
            finished_at=now,
        ),
        writes=writes,
    )


def _lease_lost(
    *,
    action_pk: int,
    attempt_pk: int,
    answer: Answer,
    action: Action | None,
    now: datetime,
    writes: Writes | None = None,
) -> str:
    """The action moved on without this worker (its lease expired and was swept, or another
    holder took over): the answer is kept on the attempt as evidence, and nothing else."""
    _attempt_answered(attempt_pk=attempt_pk, answer=answer, held_lease=False, now=now, writes=writes)
    log.warning(
        "action_id=%s lease lost before recording (%s); the answer is kept on attempt %s",
        action.action_id if action is not None else action_pk,
        answer.summary(),
        attempt_pk,
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
                        action_pk=one.action.pk,
                        attempt_pk=one.attempt_pk,
                        answer=one.answer,
                        action=one.action,
                        now=now,
                        writes=writes,
                    )
                    continue
                action = one.action
                if _escalates(one.answer, one.contract):
                    action = Action.objects.select_for_update().get(pk=one.action.pk)
                record = _record_in_memory(
                    action=action,
                    attempt_pk=one.attempt_pk,
                    lease_token=one.lease_token,
                    answer=one.answer,
                    contract=one.contract,
                    now=now,
                    writes=writes,
                )
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
        return submission_record(
            action_pk=sent.action.pk,
            attempt_pk=sent.attempt_pk,
            lease_token=sent.lease_token,
            answer=sent.answer,
            contract=sent.contract,
            action=action,
        )
    except Exception as error:
        log.exception("action_id=%s: its record failed; its lease expires to reconciliation", sent.action.action_id)
        return error


def _submission_apply(
    *,
    action: Action,
    attempt_pk: int,
    answer: Answer,
    contract: ReceiverContract | None,
    now: datetime,
    writes: Writes,
) -> str:
    """The lease holder's transition for the answer (in memory, inside submission_record's transaction)."""
    if answer.outcome == Outcome.UNKNOWN and contract is not None and not contract.can_be_asked:
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


# --- sweeps --------------------------------------------------------------------------------


def sweep_authorized(*, now: datetime | None = None, limit: int = 50, budget_seconds: float | None = None) -> int:
    """Dispatch AUTHORIZED actions whose publish was lost (broker down, process died at commit).

    The claims skip locked rows (SKIP LOCKED), so several sweepers and workers never wait on
    each other. A grace period leaves fresh approvals to their own on-commit publish. Without
    rate limits, the actions are claimed in batches (``submission_begin_batch``: one commit per
    batch) and each batch is sent before the next is claimed; with rate limits, each action
    first takes its receiver's token and is claimed on its own.
    """
    now = now or timezone.now()
    budget = budget_seconds if budget_seconds is not None else settings.SWEEP_INTERVAL_SECONDS
    cutoff = now - timedelta(seconds=settings.SWEEP_INTERVAL_SECONDS / 2)
    if not throttling_enabled():
        return _sweep_authorized_in_batches(cutoff=cutoff, limit=limit, budget=budget)
    pks = list(
        Action.objects.filter(status=S.AUTHORIZED, status_changed_at__lt=cutoff)
        .order_by("status_changed_at")
        .values_list("pk", flat=True)[:limit]
    )
    started = time.monotonic()
    dispatched = 0
    for pk in pks:
        if time.monotonic() - started > budget:
            break
        if dispatch_wait(action_pk=pk) > 0:
            continue  # its receiver's bucket is empty: a later sweep sends it
        if execution_dispatch(action_pk=pk, skip_locked=True) not in ("taken", "stale"):
            dispatched += 1
    return dispatched


def sweep_batch_size() -> int:
    """How many actions the sweep claims per transaction. It sends them one after the other, so
    the last one's lease, and the sweep task's own soft time limit, must outlast the calls
    before it: each may take the provider timeout."""
    window = min(settings.LEASE_SECONDS, getattr(settings, "CELERY_TASK_SOFT_TIME_LIMIT", settings.LEASE_SECONDS))
    fits = window // max(settings.PROVIDER_TIMEOUT_SECONDS, 1) - 1
    return max(1, min(settings.DISPATCH_BATCH_SIZE, fits))


def _sweep_authorized_in_batches(*, cutoff: datetime, limit: int, budget: float) -> int:
    started = time.monotonic()
    dispatched = 0
    size = sweep_batch_size()
    while dispatched < limit and time.monotonic() - started <= budget:
        claims = submission_begin_batch(limit=min(size, limit - dispatched), authorized_before=cutoff)
        claimed = [claim for claim in claims if claim.outcome == ClaimOutcome.CLAIMED]
        for claim in claimed:
            assert claim.action is not None and claim.attempt is not None and claim.lease_token is not None
            try:
                submission_send_and_record(action=claim.action, attempt=claim.attempt, lease_token=claim.lease_token)
            except Exception:
                # The rest of the batch holds committed leases too: send them. This one's lease
                # expires to UNKNOWN and reconciliation, as after a crash.
                log.exception("action_id=%s: its send or record failed", claim.action.action_id)
        dispatched += len(claimed)
        if not claims:
            break  # nothing left to claim (or every one left is locked by someone else)
    return dispatched


def sweep_expired_leases(*, now: datetime | None = None, limit: int = 200) -> int:
    """SUBMITTING past its lease goes to UNKNOWN, never straight back to a retry (section 6)."""
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        expired = list(
            Action.objects.select_for_update(skip_locked=True)
            .filter(status=S.SUBMITTING, lease_expires_at__lt=now)
            .order_by("lease_expires_at")[:limit]
        )
        for action in expired:
            delay = kind_for(action.kind).contract().lookup_visibility_delay
            action_transition(
                action=action,
                transition="mark_unknown",
                actor=Actor.system("lease-sweeper"),
                reason=f"The lease expired at {action.lease_expires_at:%H:%M:%S} with no recorded outcome; "
                "reconciliation will ask the receiver before anything else.",
                evidence={"lease_token": str(action.lease_token), "lease_expires_at": str(action.lease_expires_at)},
                now=now,
                next_reconcile_at=now + delay,
            )
    return len(expired)
