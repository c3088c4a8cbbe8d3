"""Execution: reserve, call the receiver outside any transaction, record what it said.

Every outside call has the same shape: a committed record first (the SUBMITTING row with its
lease, and the attempt with the request), then the call with no transaction open and no row
locked, then one transaction that records the answer, but only while the caller still holds
the lease (invariant 3).
"""

from __future__ import annotations

import logging
import os
import random
import signal
import time
import uuid
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from actions.models import Action, ActionKind, ActionStatus, Attempt, Order, Remedy
from actions.outcomes import Answer, Outcome, answer_from_refund, answer_from_submission_error
from actions.owners import owner_pick
from actions.providers.base import CreateRefund, Provider, ProviderError, ProviderGuarantees
from actions.providers.money import to_minor_units
from actions.providers.stripe_adapter import StripeProvider
from actions.services import Actor, action_transition

log = logging.getLogger(__name__)
S = ActionStatus


# --- the configured receiver ---------------------------------------------------------------


@lru_cache(maxsize=1)
def provider_from_settings() -> Provider:
    """One provider per process, built from settings (the sandbox in development and tests)."""
    return StripeProvider(
        api_key=settings.PROVIDER_API_KEY,
        api_base=settings.PROVIDER_API_BASE,
        timeout_seconds=settings.PROVIDER_TIMEOUT_SECONDS,
        key_retention=timedelta(seconds=settings.PROVIDER_KEY_RETENTION_SECONDS),
        lookup_visibility_delay=timedelta(seconds=settings.PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS),
    )


# --- fault points --------------------------------------------------------------------------

FAULT_POINTS = (
    "before_provider_call",
    "after_provider_answer",
    "during_reconciliation",
    "after_record",
)


def fault_point(name: str) -> None:
    """Kill this process here if the fault point is switched on; inert otherwise.

    Read from the environment at every call (not from settings at import), so a test can start
    a worker with ``CONSOLE_FAULT_POINTS=after_provider_answer`` and a fresh worker without it.
    ``name@0.1`` kills with probability 0.1 (the chaos run).
    """
    raw = os.environ.get("CONSOLE_FAULT_POINTS", "")
    if not raw:
        return
    for entry in raw.split(","):
        point, _, probability = entry.strip().partition("@")
        if point != name:
            continue
        if probability and random.random() >= float(probability):
            continue
        log.warning("fault point %s: killing worker process %s", name, os.getpid())
        os.kill(os.getpid(), signal.SIGKILL)


# --- money and follow-ups that go with outcomes ---------------------------------------------


def order_book_success(action: Action) -> None:
    """SUCCEEDED: the reserved amount becomes refunded money, in the same transaction."""
    assert action.order_id is not None, "a refund always targets an order"
    Order.objects.filter(pk=action.order_id).update(
        reserved_amount=F("reserved_amount") - action.amount,
        refunded_amount=F("refunded_amount") + action.amount,
    )


def order_release(action: Action) -> None:
    """FAILED_FINAL: the reservation is released; the customer still expects their money."""
    assert action.order_id is not None, "a refund always targets an order"
    Order.objects.filter(pk=action.order_id).update(reserved_amount=F("reserved_amount") - action.amount)


def _remedy_open(action: Action) -> Remedy:
    return Remedy.objects.create(
        action=action,
        amount=action.amount,
        currency=action.currency,
        owner=owner_pick(kind=action.kind),
        note="Opened automatically: the refund failed for good. Choose store credit, a manual transfer or a cheque.",
    )


def next_reconcile_time(*, action: Action, now: datetime) -> datetime:
    """When to ask the receiver next: after its lookup visibility delay, with backoff and jitter."""
    base = settings.RECONCILE_BASE_BACKOFF_SECONDS * (2 ** min(action.reconcile_failures, 6))
    jitter = random.uniform(0, base * 0.25)
    delay = max(settings.PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS, 0) + base + jitter
    return now + timedelta(seconds=delay)


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

    Runs inside the caller's transaction, with the action row locked, and books the order's
    money and any remedy in that same transaction.
    """
    evidence = {"answer": answer.summary(), "source": source, **(evidence or {})}
    reference = answer.provider_reference
    outcome = answer.outcome
    status = action.status

    if outcome == Outcome.UNKNOWN and status != S.SUBMITTING:
        raise ValueError("an inconclusive answer for an action that is not submitting belongs to the reconciler")
    if outcome == Outcome.NEEDS_REVIEW:
        action_escalate(
            action=action, actor=actor, now=now, reason=f"Needs a person: {answer.summary()}.", evidence=evidence
        )
        return action.status

    if status == S.SUBMITTING:
        if outcome == Outcome.SUCCEEDED:
            action_transition(
                action=action,
                transition="record_success",
                actor=actor,
                reason="The receiver confirmed the refund.",
                evidence=evidence,
                now=now,
                provider_reference=reference,
            )
        elif outcome == Outcome.PENDING:
            action_transition(
                action=action,
                transition="record_pending",
                actor=actor,
                reason="The receiver accepted the refund; its final status is pending.",
                evidence=evidence,
                now=now,
                provider_reference=reference,
            )
            action.next_reconcile_at = now + timedelta(seconds=settings.RECONCILE_BASE_BACKOFF_SECONDS)
            action.save(update_fields=["next_reconcile_at"])
        elif outcome == Outcome.FAILED_FINAL:
            action_transition(
                action=action,
                transition="record_failure",
                actor=actor,
                reason=f"The receiver's answer proves the refund did not and will not happen: {answer.summary()}.",
                evidence=evidence,
                now=now,
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
                next_reconcile_at=next_reconcile_time(action=action, now=now),
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
            action.next_reconcile_at = now + timedelta(seconds=settings.RECONCILE_BASE_BACKOFF_SECONDS)
            action.save(update_fields=["next_reconcile_at"])
    elif status == S.SETTLING:
        if outcome == Outcome.PENDING:
            return status  # still pending: the settlement poller keeps asking
        action_transition(
            action=action,
            transition="settle",
            actor=actor,
            reason=f"The receiver settled the refund: {answer.summary()}.",
            evidence=evidence,
            now=now,
            succeeded=outcome == Outcome.SUCCEEDED,
        )
    else:
        raise ValueError(f"cannot apply a receiver's answer to an action in {status}")

    if action.status == S.SUCCEEDED:
        order_book_success(action)
    elif action.status == S.FAILED_FINAL:
        order_release(action)
        _remedy_open(action)
    return action.status


def action_escalate(*, action: Action, actor: Actor, now: datetime, reason: str, evidence: dict[str, Any]) -> Any:
    """Hand the action to a named person: the owner finance already set, if they are still an
    active member able to resolve it, otherwise the owner group's member with the fewest open items."""
    current = action.owner
    if current is not None and current.is_active and current.has_perm("actions.resolve_action"):
        owner = current
    else:
        owner = owner_pick(kind=action.kind)
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
        owner=owner,
        due_at=now + timedelta(hours=settings.REVIEW_DUE_HOURS),
    )
    return owner


# --- dispatch ------------------------------------------------------------------------------


def submission_request_body(action: Action) -> dict[str, Any]:
    """What is sent to the receiver, recorded on the attempt before sending."""
    return {
        "charge": action.payload.get("charge", ""),
        "amount": action.payload["amount"],
        "currency": action.currency,
        "idempotency_key": action.idempotency_key,
        "metadata": {"action_id": action.action_id},
    }


def refund_request_for(action: Action) -> CreateRefund:
    return CreateRefund(
        idempotency_key=action.idempotency_key,
        charge=action.payload["charge"],
        amount_minor=to_minor_units(action.amount, action.currency),
        currency=action.currency.lower(),
        metadata={"action_id": action.action_id},
    )


def provider_submit(*, action: Action, provider: Provider | None = None) -> Answer:
    """Call the receiver. Never inside a transaction: the call may take seconds or hang."""
    assert not transaction.get_connection().in_atomic_block, "a network call must not run inside a transaction"
    provider = provider or provider_from_settings()
    try:
        return answer_from_refund(provider.create_refund(refund_request_for(action)))
    except ProviderError as error:
        return answer_from_submission_error(error)


def execution_dispatch(*, action_pk: int, skip_locked: bool = False) -> str:
    """Claim an authorized action, submit it once, record the answer. Safe to run twice."""
    from approvals.services import ClaimOutcome, submission_begin

    # Only refunds go to the refund provider: a compensation is recovered by finance by hand.
    if not Action.objects.filter(pk=action_pk, kind=ActionKind.REFUND).exists():
        return "manual"
    claim = submission_begin(action_pk=action_pk, skip_locked=skip_locked)
    if claim.outcome != ClaimOutcome.CLAIMED:
        return claim.outcome.value
    assert claim.action is not None and claim.attempt is not None and claim.lease_token is not None
    return submission_send_and_record(action=claim.action, attempt=claim.attempt, lease_token=claim.lease_token)


def submission_send_and_record(
    *, action: Action, attempt: Attempt, lease_token: uuid.UUID, provider: Provider | None = None
) -> str:
    """The call and the record, for a caller that holds a freshly committed lease."""
    provider = provider or provider_from_settings()
    # A worker that stalled between its claim and the call (a long GC pause, a suspended VM)
    # must not start a call that could outlast its lease: by then the lease sweeper may have
    # handed the action to reconciliation or a person. The attempt stays unanswered and the
    # lease expires, as if the worker had died here.
    margin = timedelta(seconds=settings.PROVIDER_TIMEOUT_SECONDS)
    if action.lease_expires_at is not None and timezone.now() + margin > action.lease_expires_at:
        log.warning("action_id=%s lease nearly expired before the provider call; not sending", action.action_id)
        return "lease_too_short"
    fault_point("before_provider_call")
    answer = provider_submit(action=action, provider=provider)
    fault_point("after_provider_answer")
    status = submission_record(
        action_pk=action.pk,
        attempt_pk=attempt.pk,
        lease_token=lease_token,
        answer=answer,
        guarantees=provider.guarantees,
    )
    fault_point("after_record")
    return status


def submission_record(
    *,
    action_pk: int,
    attempt_pk: int,
    lease_token: uuid.UUID,
    answer: Answer,
    guarantees: ProviderGuarantees | None = None,
) -> str:
    """Record the receiver's answer: on the attempt always, on the action only for the lease holder.

    A late worker whose lease expired (and was swept to UNKNOWN) still stores what the receiver
    said on its attempt row: reconciliation and people read it as evidence.
    """
    now = timezone.now()
    with transaction.atomic(durable=True):
        action = Action.objects.select_for_update().get(pk=action_pk)
        holds_lease = action.status == S.SUBMITTING and action.lease_token == lease_token
        Attempt.objects.filter(pk=attempt_pk).update(
            response=answer.response_json(),
            error=answer.error_json(),
            outcome=answer.outcome.value,
            held_lease=holds_lease,
            finished_at=now,
        )
        if not holds_lease:
            log.warning(
                "action_id=%s lease lost before recording (%s); the answer is kept on attempt %s",
                action.action_id,
                answer.summary(),
                attempt_pk,
            )
            return "lease_lost"
        if (
            answer.outcome == Outcome.UNKNOWN
            and guarantees is not None
            and not guarantees.supports_lookup
            and not guarantees.honours_idempotency_keys
        ):
            # No reconciliation could ever tell what happened (DESIGN.md section 4, SUBMITTING ->
            # NEEDS_REVIEW): hand it to a person now rather than after a pass that can only give up.
            action_escalate(
                action=action,
                actor=Actor.system("dispatcher"),
                now=now,
                reason=f"The outcome is unknown ({answer.summary()}) and the receiver has no lookup and no "
                "idempotency keys: only a person can find out what happened.",
                evidence={"answer": answer.summary(), "source": "submission", "attempt_id": attempt_pk},
            )
            return action.status
        return apply_outcome(
            action=action,
            answer=answer,
            actor=Actor.system("dispatcher"),
            now=now,
            source="submission",
            evidence={"attempt_id": attempt_pk},
        )


# --- sweeps --------------------------------------------------------------------------------


def sweep_authorized(*, now: datetime | None = None, limit: int = 50, budget_seconds: float | None = None) -> int:
    """Dispatch AUTHORIZED actions whose publish was lost (broker down, process died at commit).

    Each claim uses SKIP LOCKED, so several sweepers and workers never wait on each other.
    A grace period leaves fresh approvals to their own on-commit publish.
    """
    now = now or timezone.now()
    budget = budget_seconds if budget_seconds is not None else settings.SWEEP_INTERVAL_SECONDS
    cutoff = now - timedelta(seconds=settings.SWEEP_INTERVAL_SECONDS / 2)
    pks = list(
        Action.objects.filter(status=S.AUTHORIZED, kind=ActionKind.REFUND, status_changed_at__lt=cutoff)
        .order_by("status_changed_at")
        .values_list("pk", flat=True)[:limit]
    )
    started = time.monotonic()
    dispatched = 0
    for pk in pks:
        if time.monotonic() - started > budget:
            break
        if execution_dispatch(action_pk=pk, skip_locked=True) not in ("taken", "stale"):
            dispatched += 1
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
            action_transition(
                action=action,
                transition="mark_unknown",
                actor=Actor.system("lease-sweeper"),
                reason=f"The lease expired at {action.lease_expires_at:%H:%M:%S} with no recorded outcome; "
                "reconciliation will ask the receiver before anything else.",
                evidence={"lease_token": str(action.lease_token), "lease_expires_at": str(action.lease_expires_at)},
                now=now,
                next_reconcile_at=now + timedelta(seconds=settings.PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS),
            )
    return len(expired)
