"""Reconciliation: UNKNOWN is a state, not a guess (docs/architecture.md section 7).

For an UNKNOWN action the receiver is asked first, by the action id in its metadata:

- found: record the receiver's status (SUCCEEDED, SETTLING or FAILED_FINAL) and book it on the target;
- not found, inside the receiver's key retention (minus a safety margin): re-sending the same
  request with the same key is safe, because the receiver replays or executes it once;
- not found, past retention: retry only when the lookup is authoritative and the receiver's
  lookup visibility delay has passed since the last attempt;
- inconclusive (the lookup failed): stay UNKNOWN, count the failure, back off with jitter;
- the escalation policy's limit reached, or a receiver with no lookup and no keys: NEEDS_REVIEW,
  assigned to a named person, and polling stops.

SETTLING actions are polled by the receiver's reference until the effect is final.

Every pass has the shape of a submission: a committed claim (a reconciler lease and a lookup
attempt row), the lookup outside any transaction, and a recording transaction that only the
lease holder may complete. Two reconcilers racing on one action therefore produce one outcome.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from actions.engine.dispatch import submission_send_and_record
from actions.engine.escalation import action_escalate
from actions.engine.faults import fault_point
from actions.engine.leases import Lease, attempt_start, lease_take
from actions.engine.ledger import duplicate_key
from actions.engine.outcomes import apply_outcome, next_reconcile_time, not_before_retry_after
from actions.engine.send import receiver_for
from actions.foundation.clock import database_clock_now
from actions.foundation.tracing import traced
from actions.foundation.trail import Actor
from actions.kinds.base import Lookup, LookupVerdict, Receiver, ReceiverContract
from actions.models import Action, ActionStatus, Attempt, AttemptKind, Discrepancy, DiscrepancyKind

log = logging.getLogger(__name__)
S = ActionStatus
ACTOR = Actor.system("reconciler")


# --- claim ---------------------------------------------------------------------------------


def reconcile_claim(
    *, action_pk: int, now: datetime, published_mark: datetime | None = None
) -> tuple[Action, Attempt, uuid.UUID] | None:
    """Take the reconciler's lease on a due UNKNOWN or SETTLING action, or return None.

    The lease is the action's lease token (free while UNKNOWN or SETTLING) and pushes the next
    reconciliation past the lease, so a reconciler that dies mid-way is replaced after it.
    ``published_mark``: the sweep that published this task moved ``next_reconcile_at`` to this
    mark; the task may take the action while the mark is still there (see reconcile_publish_due).
    """
    with transaction.atomic(durable=True):
        action = (
            Action.objects.select_for_update(skip_locked=True)
            .filter(pk=action_pk, status__in=[S.UNKNOWN, S.SETTLING])
            .first()
        )
        if action is None:
            return None
        due = action.next_reconcile_at is None or action.next_reconcile_at <= now
        if not due and not (published_mark is not None and action.next_reconcile_at == published_mark):
            return None
        token = uuid.uuid4()
        action.lease_token = token
        action.lease_expires_at = now + timedelta(seconds=settings.LEASE_SECONDS)
        action.next_reconcile_at = action.lease_expires_at
        action.reconcile_attempts += 1
        action.save(update_fields=["lease_token", "lease_expires_at", "next_reconcile_at", "reconcile_attempts"])
        attempt = attempt_start(action, AttemptKind.LOOKUP, token=token, now=now)
    return action, attempt, token


def reconcile_request_now(*, action_pk: int, now: datetime) -> bool:
    """The receiver said something changed for this action (a webhook): make it due now.

    Only an UNKNOWN or SETTLING action whose reconciler lease is free moves; the receiver's
    word is not recorded as the outcome here. The reconciliation asks the receiver as always
    and applies its answer through the normal path, so a forged or stale notice can at most
    cause one more lookup. Returns whether it moved; the caller publishes the task.
    """
    moved = (
        Action.objects.filter(pk=action_pk, status__in=[S.UNKNOWN, S.SETTLING])
        .filter(Q(lease_token__isnull=True) | Q(lease_expires_at__lte=now))
        .filter(Q(next_reconcile_at__isnull=True) | Q(next_reconcile_at__gt=now))
        .update(next_reconcile_at=now)
    )
    return bool(moved)


# --- lookup (outside any transaction) ------------------------------------------------------


def receiver_lookup(*, action: Action, receiver: Receiver) -> Lookup:
    assert not transaction.get_connection().in_atomic_block, "a network call must not run inside a transaction"
    return receiver.lookup(action)


# --- decide and record ---------------------------------------------------------------------


def _failures_in_window(action: Action, now: datetime) -> int:
    since = now - timedelta(seconds=settings.RECONCILE_WINDOW_SECONDS)
    return Attempt.objects.filter(
        action=action, kind=AttemptKind.LOOKUP, outcome=LookupVerdict.INCONCLUSIVE, started_at__gte=since
    ).count()


def retry_allowed(*, action: Action, contract: ReceiverContract, now: datetime) -> tuple[bool, str]:
    """Whether a not-found lookup allows re-sending the request with the same key, and why."""
    guarantees = contract
    margin = timedelta(seconds=settings.KEY_RETENTION_MARGIN_SECONDS)
    first = action.first_attempt_at or now
    retention = guarantees.key_retention
    if guarantees.honours_keys and retention is not None and now < first + retention - margin:
        return True, (
            "Not found, and the first attempt is inside the receiver's key retention: re-sending with the "
            "same key is replayed or executed once."
        )
    if not guarantees.lookup_authoritative:
        return False, "Not found, but the receiver's lookups are not authoritative: a person must decide."
    visible_after = (action.last_attempt_at or first) + guarantees.lookup_visibility_delay
    if now < visible_after:
        return False, f"Not found yet, but the lookup may still be catching up until {visible_after:%H:%M:%S}."
    return True, "Authoritative not-found after the receiver's visibility delay: retry with the same key."


@traced("action.reconcile", outcome=str)
def reconcile_action(
    *,
    action_pk: int,
    receiver: Receiver | None = None,
    now: datetime | None = None,
    published_mark: datetime | None = None,
) -> str:
    """One reconciliation pass for one action. Returns what happened, for logs and tests."""
    now = now or database_clock_now()
    claimed = reconcile_claim(action_pk=action_pk, now=now, published_mark=published_mark)
    if claimed is None:
        return "not_due"
    action, attempt, token = claimed
    receiver = receiver or receiver_for(action)
    contract = receiver.contract

    if action.status == S.UNKNOWN and not contract.supports_lookup:
        # docs/architecture.md section 4: a receiver with no lookup can never give the evidence a retry needs.
        fault_point("during_reconciliation")
        outcome = _record(
            action_pk=action_pk, attempt_pk=attempt.pk, token=token, lookup=None, contract=contract, now=now
        )
        assert isinstance(outcome, str)
        return outcome

    lookup = receiver_lookup(action=action, receiver=receiver)
    fault_point("during_reconciliation")
    result = _record(action_pk=action_pk, attempt_pk=attempt.pk, token=token, lookup=lookup, contract=contract, now=now)
    if isinstance(result, Lease):
        # The retry's SUBMITTING row and attempt are committed: now send, outside any transaction.
        return submission_send_and_record(
            action=result.action, attempt=result.attempt, lease_token=result.token, receiver=receiver
        )
    return result


def _record(
    *,
    action_pk: int,
    attempt_pk: int,
    token: uuid.UUID,
    lookup: Lookup | None,
    contract: ReceiverContract,
    now: datetime,
) -> str | Lease:
    """Record one pass. ``now`` is the time of the claim, so the lookup started no earlier: every
    decision (visibility delay, key retention, the failure window) is taken as of that instant,
    never as of the later moment the answer is recorded.

    The lookup goes on its attempt whether or not the pass still holds the lease; then, for the
    holder, each verdict has its step: found (``apply_outcome``), duplicate, not found,
    inconclusive, and a settling action's poll (``_record_settling``)."""
    with transaction.atomic(durable=True):
        action = Action.objects.select_for_update().get(pk=action_pk)
        holds = action.status in (S.UNKNOWN, S.SETTLING) and action.lease_token == token
        verdict = lookup.verdict if lookup is not None else "no_lookup"
        Attempt.objects.filter(pk=attempt_pk).update(
            response=lookup.response_json() if lookup is not None else None,
            error=lookup.error_json() if lookup is not None else None,
            outcome=verdict,
            held_lease=holds,
            finished_at=timezone.now(),
        )
        if not holds:
            return "lease_lost"
        action.lease_token = None
        action.lease_expires_at = None
        evidence = {"attempt_id": attempt_pk, "verdict": verdict}

        if lookup is None:
            action_escalate(
                action=action,
                actor=ACTOR,
                now=now,
                reason="The receiver has no lookup: only a person can find out what happened.",
                evidence=evidence,
            )
            return action.status

        if action.status == S.SETTLING:
            return _record_settling(action=action, lookup=lookup, now=now, evidence=evidence)

        if lookup.verdict == LookupVerdict.FOUND:
            return _found_apply(action=action, lookup=lookup, source="reconciliation", now=now, evidence=evidence)
        if lookup.verdict == LookupVerdict.DUPLICATE:
            return _record_duplicate(action=action, lookup=lookup, now=now, evidence=evidence)
        if lookup.verdict == LookupVerdict.NOT_FOUND:
            return _record_not_found(action=action, contract=contract, now=now, evidence=evidence)
        return _record_inconclusive(action=action, lookup=lookup, now=now, evidence=evidence)


def _record_duplicate(*, action: Action, lookup: Lookup, now: datetime, evidence: dict[str, Any]) -> str:
    """The receiver holds more than one effect for the action: a discrepancy, and a person."""
    references = [effect.reference for effect in lookup.effects]
    # The ledger audit may have stored this duplicate first, under the same key: one row, and the
    # action still goes to a person (a second insert would roll the escalation back, every sweep).
    Discrepancy.objects.get_or_create(
        kind=DiscrepancyKind.DUPLICATE_EFFECT,
        action=action,
        provider_reference=duplicate_key(references),
        defaults={"details": {"effects": references, "found_by": "reconciliation"}},
    )
    action_escalate(
        action=action,
        actor=ACTOR,
        now=now,
        reason=f"The receiver has {len(references)} effects for this action ({', '.join(references)}).",
        evidence={**evidence, "effects": references},
    )
    return action.status


def _record_not_found(
    *, action: Action, contract: ReceiverContract, now: datetime, evidence: dict[str, Any]
) -> str | Lease:
    """Nothing at the receiver: a retry with the same key where the contract allows it, a person
    where no later lookup could allow it, otherwise another lookup later."""
    if action.attempt_count >= settings.RECONCILE_MAX_FAILURES:
        # Every send so far was answered ambiguously and left no effect: sending again
        # would only repeat that, so the escalation policy applies to retries too.
        action_escalate(
            action=action,
            actor=ACTOR,
            now=now,
            reason=f"Sent {action.attempt_count} times with the same key and still nothing at the "
            f"receiver (policy: {settings.RECONCILE_MAX_FAILURES}).",
            evidence=evidence,
        )
        return action.status
    allowed, why = retry_allowed(action=action, contract=contract, now=now)
    if allowed:
        return _retry(action=action, now=now, reason=why, evidence=evidence)
    if not contract.lookup_authoritative:
        # No later lookup can turn this not-found into evidence for a retry.
        action_escalate(action=action, actor=ACTOR, now=now, reason=why, evidence=evidence)
        return action.status
    action.next_reconcile_at = next_reconcile_time(action=action, now=now)
    action.save(update_fields=["lease_token", "lease_expires_at", "next_reconcile_at"])
    return "too_early"


def _record_inconclusive(*, action: Action, lookup: Lookup, now: datetime, evidence: dict[str, Any]) -> str:
    """The lookup reached no conclusion: it counts against the escalation policy, and the
    receiver is asked again later."""
    failures = _failures_in_window(action, now)
    action.reconcile_failures = failures
    if failures >= settings.RECONCILE_MAX_FAILURES:
        action_escalate(
            action=action,
            actor=ACTOR,
            now=now,
            reason=f"{failures} reconciliation attempts in a row could not reach a conclusion "
            f"(policy: {settings.RECONCILE_MAX_FAILURES} within {settings.RECONCILE_WINDOW_SECONDS // 3600} h). "
            f"Last error: {lookup.error}.",
            evidence=evidence,
        )
        return action.status
    # A rate-limited lookup (429 with Retry-After) is not asked again before the receiver said.
    action.next_reconcile_at = not_before_retry_after(
        action=action, error=lookup.error, due=next_reconcile_time(action=action, now=now), now=now
    )
    action.save(update_fields=["lease_token", "lease_expires_at", "next_reconcile_at", "reconcile_failures"])
    return "inconclusive"


def _found_apply(*, action: Action, lookup: Lookup, source: str, now: datetime, evidence: dict[str, Any]) -> str:
    """The receiver found the effect: what it says of it is the action's outcome."""
    return apply_outcome(
        action=action, answer=lookup.effects[0].answer(), actor=ACTOR, now=now, source=source, evidence=evidence
    )


def _record_settling(*, action: Action, lookup: Lookup, now: datetime, evidence: dict[str, Any]) -> str:
    if lookup.verdict == LookupVerdict.FOUND:
        status = _found_apply(action=action, lookup=lookup, source="settlement", now=now, evidence=evidence)
        if status == S.SETTLING:
            action.next_reconcile_at = next_reconcile_time(action=action, now=now)
            action.save(update_fields=["lease_token", "lease_expires_at", "next_reconcile_at"])
            return "still_pending"
        return status
    action.next_reconcile_at = next_reconcile_time(action=action, now=now)
    action.save(update_fields=["lease_token", "lease_expires_at", "next_reconcile_at"])
    return "inconclusive"


def _retry(*, action: Action, now: datetime, reason: str, evidence: dict[str, Any]) -> Lease:
    """UNKNOWN -> SUBMITTING with the same key and a new lease; the send happens after commit."""
    return lease_take(action=action, transition="retry", actor=ACTOR, reason=reason, evidence=evidence, now=now)


# --- sweep ---------------------------------------------------------------------------------


def reconcile_due(*, now: datetime | None = None, limit: int = 200) -> list[int]:
    """Ids of UNKNOWN and SETTLING actions whose next reconciliation is due, oldest first."""
    now = now or database_clock_now()
    return list(
        Action.objects.filter(status__in=[S.UNKNOWN, S.SETTLING], next_reconcile_at__lte=now)
        .order_by("next_reconcile_at")
        .values_list("pk", flat=True)[:limit]
    )


def reconcile_publish_due(*, now: datetime | None = None, limit: int = 200) -> list[tuple[int, datetime]]:
    """Mark due actions as published and return (pk, mark) for one task each.

    The mark moves ``next_reconcile_at`` one lease ahead, so the next sweeps do not publish the
    action again while its task waits in the queue (the chaos run showed sweeps every second
    flooding the queue with duplicates, starving real work). If the message is lost (a broker
    flush or restart), the action becomes due again when the mark passes and is published anew.
    Rows are taken with SKIP LOCKED, so concurrent sweeps split the work.
    """
    now = now or database_clock_now()
    mark = now + timedelta(seconds=settings.LEASE_SECONDS)
    with transaction.atomic(durable=True):
        pks = list(
            Action.objects.select_for_update(skip_locked=True)
            .filter(status__in=[S.UNKNOWN, S.SETTLING], next_reconcile_at__lte=now)
            .order_by("next_reconcile_at")
            .values_list("pk", flat=True)[:limit]
        )
        Action.objects.filter(pk__in=pks).update(next_reconcile_at=mark)
    return [(pk, mark) for pk in pks]
