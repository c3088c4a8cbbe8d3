"""The lease-plus-attempt block (actions/engine/leases.py), pinned field by field.

Every send starts with one committed record of intent: the transition that takes the lease, its
audit event, and the attempt that names the token (docs/architecture.md section 6, invariant 3). The scenario
tests reach ``lease_take`` through the claim and the reconciler but read back only the state, so
mutmut's mutants of the event's reason and evidence, of its time and of the attempt's start time
survived them (tests/MUTATION.md). Each assertion here fails on one of those mutants.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from actions.engine.leases import lease_take
from actions.foundation.trail import action_transition
from actions.kinds import kind_for
from actions.models import Action, ActionEvent, ActionStatus, ActorKind, AttemptKind
from actions.services import Actor
from tests.actions.test_reconciliation import authorized_refund

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

DISPATCHER = Actor(kind=ActorKind.SYSTEM, label="system:dispatcher")


@pytest.fixture(autouse=True)
def no_broker(dispatched: list[int]) -> list[int]:
    return dispatched


def test_taking_a_lease_records_the_transition_its_event_and_the_attempt_at_the_callers_time(
    agent_actor: Actor,
) -> None:
    """The lease, the audit event and the attempt all carry the caller's ``now`` (not the clock's),
    the event keeps the caller's reason and evidence plus the lease's expiry, and the attempt names
    the same token and key as the action, with the request the kind would send."""
    action = authorized_refund(agent_actor)
    # An hour in the past, so that a mutant falling back to the clock cannot pass by accident.
    now = timezone.now() - timedelta(hours=1)
    expires_at = now + timedelta(seconds=settings.LEASE_SECONDS)

    with transaction.atomic():
        lease = lease_take(
            action=action,
            transition="begin_submission",
            actor=DISPATCHER,
            reason="Reserved; submitting to the receiver.",
            evidence={"approval_id": 7, "attempt": 1},
            now=now,
        )

    action.refresh_from_db()
    assert action.status == ActionStatus.SUBMITTING
    assert (action.lease_token, action.lease_expires_at) == (lease.token, expires_at)
    assert action.status_changed_at == now
    assert (action.first_attempt_at, action.last_attempt_at, action.attempt_count) == (now, now, 1)

    event = ActionEvent.objects.filter(action=action).latest("pk")
    assert (event.transition, event.from_state, event.to_state) == (
        "begin_submission",
        ActionStatus.AUTHORIZED,
        ActionStatus.SUBMITTING,
    )
    assert event.created_at == now
    assert event.reason == "Reserved; submitting to the receiver."
    assert event.evidence == {"approval_id": 7, "attempt": 1, "lease_expires_at": expires_at.isoformat()}
    assert event.actor_label == "system:dispatcher"

    attempt = lease.attempt
    attempt.refresh_from_db()
    assert attempt.action_id == action.pk
    assert attempt.kind == AttemptKind.SUBMIT
    assert attempt.lease_token == lease.token
    assert attempt.idempotency_key == action.idempotency_key
    assert attempt.started_at == now
    assert attempt.request == kind_for(action.kind).request_body(action)


def test_a_second_lease_on_the_same_action_counts_a_second_attempt_and_keeps_the_first_time(
    agent_actor: Actor,
) -> None:
    """A retry's lease replaces the token and moves ``last_attempt_at``; ``first_attempt_at`` stays
    the first send's time, and each lease has its own attempt row."""
    action = authorized_refund(agent_actor)
    first_at = timezone.now() - timedelta(hours=2)
    with transaction.atomic():
        first = lease_take(
            action=action, transition="begin_submission", actor=DISPATCHER, reason="first", evidence={}, now=first_at
        )
    with transaction.atomic():
        action.refresh_from_db()
        action_transition_to_unknown(action, now=first_at + timedelta(minutes=1))
    second_at = first_at + timedelta(minutes=5)
    with transaction.atomic():
        action.refresh_from_db()
        second = lease_take(
            action=action, transition="retry", actor=DISPATCHER, reason="second", evidence={}, now=second_at
        )

    action.refresh_from_db()
    assert first.token != second.token and action.lease_token == second.token
    assert (action.first_attempt_at, action.last_attempt_at, action.attempt_count) == (first_at, second_at, 2)
    assert first.attempt.pk != second.attempt.pk
    assert second.attempt.started_at == second_at


def action_transition_to_unknown(action: Action, *, now: datetime) -> None:
    """The lease sweep's move, done directly: the first send's outcome is not known."""
    action_transition(
        action=action,
        transition="mark_unknown",
        actor=DISPATCHER,
        reason="lease ran out",
        evidence={},
        now=now,
        next_reconcile_at=now,
    )
