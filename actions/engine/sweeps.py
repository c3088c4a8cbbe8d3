"""The sweeps of the dispatch path: AUTHORIZED actions whose publish was lost, and SUBMITTING
actions whose lease expired with no recorded outcome (docs/architecture.md section 6)."""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction

from actions.engine.claim import ClaimOutcome, submission_begin_batch
from actions.engine.dispatch import execution_dispatch, submission_send_and_record
from actions.engine.throttle import dispatch_wait, throttling_enabled
from actions.foundation.clock import database_clock_now
from actions.foundation.trail import Actor, action_transition
from actions.kinds import kind_for
from actions.models import Action, ActionStatus

log = logging.getLogger(__name__)
S = ActionStatus


def sweep_authorized(*, now: datetime | None = None, limit: int = 50, budget_seconds: float | None = None) -> int:
    """Dispatch AUTHORIZED actions whose publish was lost (broker down, process died at commit).

    The claims skip locked rows (SKIP LOCKED), so several sweepers and workers never wait on
    each other. A grace period leaves fresh approvals to their own on-commit publish. Without
    rate limits, the actions are claimed in batches (``submission_begin_batch``: one commit per
    batch) and each batch is sent before the next is claimed; with rate limits, each action
    first takes its receiver's token and is claimed on its own.
    """
    now = now or database_clock_now()
    budget = budget_seconds if budget_seconds is not None else sweep_budget_seconds()
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


def sweep_budget_seconds() -> float:
    """How long a sweep that does a receiver's or a coordinator's work keeps starting more: half
    the sweep interval. A host's periodic worker runs the period's sweeps one after another;
    one that took the whole interval (a backlog after a host was lost, a receiver answering
    slowly) would leave the others waiting past their stale threshold. The rest waits for the
    next period."""
    return settings.SWEEP_INTERVAL_SECONDS / 2


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
    now = now or database_clock_now()
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
