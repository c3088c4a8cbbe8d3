"""The reconciler's claim (``actions.engine.reconcile.reconcile_claim``), pinned.

The reconciler takes a lease on one due UNKNOWN or SETTLING action before it asks the receiver
(invariant 3: only the holder of the current token records). Mutation testing showed that
nothing failed when the claim ignored which action it was given, or its status: it would have
taken a lease on whatever UNKNOWN row came first, or on an action in flight or settled.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from actions.engine.reconcile import reconcile_claim
from actions.kinds import kind_for
from actions.models import Action, ActionStatus, Attempt, AttemptKind
from actions.services import Actor
from tests.actions.test_reconciliation import authorized_refund, lookup_attempts, unknown_and_due
from tests.approvals.test_policy_pins import other_session  # noqa: F401 -- a fixture

S = ActionStatus


@pytest.mark.django_db
def test_the_claim_takes_the_action_it_was_given_and_no_other(agent_actor: Actor) -> None:
    first, second, third = (unknown_and_due(agent_actor) for _ in range(3))
    # Whichever way the table is ordered, one of these is not the first row it would give.
    for asked in (second, first, third):
        claimed = reconcile_claim(action_pk=asked.pk, now=timezone.now())
        assert claimed is not None and claimed[0].pk == asked.pk
        assert [
            a.pk for a in Action.objects.filter(pk__in=[first.pk, second.pk, third.pk], lease_token=claimed[2])
        ] == [asked.pk]
        assert len(lookup_attempts(asked)) == 1


@pytest.mark.django_db
@pytest.mark.parametrize("status", [S.AUTHORIZED, S.SUBMITTING, S.NEEDS_REVIEW, S.SUCCEEDED, S.FAILED_FINAL])
def test_only_an_unknown_or_settling_action_is_claimed_by_a_reconciler(agent_actor: Actor, status: str) -> None:
    action = unknown_and_due(agent_actor)
    Action.objects.filter(pk=action.pk).update(status=status)
    assert reconcile_claim(action_pk=action.pk, now=timezone.now()) is None
    stored = Action.objects.get(pk=action.pk)
    assert (stored.lease_token, stored.reconcile_attempts) == (action.lease_token, action.reconcile_attempts)
    assert lookup_attempts(action) == []


@pytest.mark.django_db
@pytest.mark.parametrize("status", [S.UNKNOWN, S.SETTLING])
def test_a_due_action_gets_a_lease_that_pushes_its_next_reconciliation_past_it(
    agent_actor: Actor, settings: Any, status: str
) -> None:
    settings.LEASE_SECONDS = 45
    action = unknown_and_due(agent_actor)
    Action.objects.filter(pk=action.pk).update(status=status, provider_reference="re_7")
    now = timezone.now()

    claimed = reconcile_claim(action_pk=action.pk, now=now)

    assert claimed is not None
    held, attempt, token = claimed
    stored = Action.objects.get(pk=action.pk)
    expiry = now + timedelta(seconds=45)
    assert (stored.lease_token, stored.lease_expires_at, stored.next_reconcile_at) == (token, expiry, expiry)
    assert stored.reconcile_attempts == action.reconcile_attempts + 1
    assert (held.lease_token, held.reconcile_attempts) == (token, stored.reconcile_attempts)
    assert stored.status == status, "a claim is a lease, not a transition"
    assert Attempt.objects.get(pk=attempt.pk) == attempt
    assert (attempt.kind, attempt.lease_token, attempt.idempotency_key, attempt.started_at) == (
        AttemptKind.LOOKUP,
        token,
        action.idempotency_key,
        now,
    )
    assert attempt.request == kind_for(action.kind).lookup_request(stored)
    assert attempt.request["for_status"] == status and attempt.request["refund_id"] == "re_7"


@pytest.mark.django_db
def test_each_claim_counts_one_more_reconciler_pass_and_is_not_a_change_of_the_action(agent_actor: Actor) -> None:
    """The action's page shows the passes ("3 passes, 1 inconclusive"); the API's ``updated_at``
    is the action's last change, which a lease is not (its state changes go through the trail)."""
    action = unknown_and_due(agent_actor)
    now = timezone.now()
    first = reconcile_claim(action_pk=action.pk, now=now)
    assert first is not None and first[0].next_reconcile_at is not None
    # The next pass, when the schedule says (once the first reconciler's lease has ended).
    assert reconcile_claim(action_pk=action.pk, now=first[0].next_reconcile_at) is not None
    stored = Action.objects.get(pk=action.pk)
    assert stored.reconcile_attempts == action.reconcile_attempts + 2
    assert stored.updated_at == action.updated_at
    assert len(lookup_attempts(action)) == 2


@pytest.mark.django_db
def test_an_action_is_due_from_its_next_reconciliation_time_on_or_when_it_has_none(agent_actor: Actor) -> None:
    action = unknown_and_due(agent_actor)
    at = timezone.now() + timedelta(minutes=5)
    Action.objects.filter(pk=action.pk).update(next_reconcile_at=at)
    assert reconcile_claim(action_pk=action.pk, now=at - timedelta(microseconds=1)) is None
    assert reconcile_claim(action_pk=action.pk, now=at) is not None

    other = unknown_and_due(agent_actor)
    Action.objects.filter(pk=other.pk).update(next_reconcile_at=None)
    assert reconcile_claim(action_pk=other.pk, now=timezone.now()) is not None


@pytest.mark.django_db
def test_a_published_task_may_take_its_action_early_only_while_its_mark_is_still_there(agent_actor: Actor) -> None:
    action = unknown_and_due(agent_actor)
    mark = timezone.now() + timedelta(minutes=5)
    Action.objects.filter(pk=action.pk).update(next_reconcile_at=mark)
    now = timezone.now()
    assert reconcile_claim(action_pk=action.pk, now=now, published_mark=mark - timedelta(seconds=1)) is None
    assert reconcile_claim(action_pk=action.pk, now=now, published_mark=None) is None
    assert reconcile_claim(action_pk=action.pk, now=now, published_mark=mark) is not None
    # The claim moved the mark on (to the lease's end): the same task's redelivery takes nothing.
    assert reconcile_claim(action_pk=action.pk, now=now, published_mark=mark) is None


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_row_another_reconciler_holds_is_skipped_without_waiting(
    agent_actor: Actor,
    other_session: psycopg.Connection[Any],  # noqa: F811 -- the imported fixture
) -> None:
    action = unknown_and_due(agent_actor)
    other_session.execute("SELECT id FROM actions_action WHERE id = %s FOR UPDATE", [action.pk])
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '2s'")  # a wait would become an error, not a pass
    assert reconcile_claim(action_pk=action.pk, now=timezone.now()) is None
    other_session.rollback()
    assert reconcile_claim(action_pk=action.pk, now=timezone.now()) is not None


@pytest.mark.django_db
def test_an_action_never_claimed_for_sending_has_nothing_to_reconcile(agent_actor: Actor) -> None:
    action = authorized_refund(agent_actor)
    assert reconcile_claim(action_pk=action.pk, now=timezone.now()) is None
    assert reconcile_claim(action_pk=action.pk + 10_000, now=timezone.now()) is None
