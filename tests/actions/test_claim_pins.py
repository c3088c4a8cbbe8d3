"""The claim (``actions.engine.claim.submission_begin``) pinned where mutation testing looks: what
it writes to the trail and the attempt, whom it names, what it returns when someone else got
there first, and which rows it waits for or skips. PostgreSQL: the row locks are the point."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from django.db import OperationalError, connection
from django.utils import timezone

from actions.engine.claim import ClaimOutcome, submission_begin
from actions.models import Action, ActionEvent, ActionStatus, Attempt, AttemptKind, Order
from actions.services import Actor
from approvals.models import Approval, Decision
from tests.actions.test_reconciliation import AMOUNT, authorized_refund
from tests.approvals.test_policy_pins import other_session  # noqa: F401 -- a fixture

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
S = ActionStatus


@pytest.fixture(autouse=True)
def no_publish(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)


def begin_event(action: Action) -> ActionEvent:
    return ActionEvent.objects.get(action=action, transition="begin_submission")


def test_a_claim_reserves_takes_the_lease_and_says_so_in_the_trail(agent_actor: Actor, settings: Any) -> None:
    action = authorized_refund(agent_actor)
    approval = Approval.objects.get(action=action, decision=Decision.APPROVE)
    version = Order.objects.get(actions=action).version
    now = timezone.now() - timedelta(seconds=5)

    claim = submission_begin(action_pk=action.pk, now=now)

    assert claim.outcome == ClaimOutcome.CLAIMED and claim.failures == []
    assert claim.action is not None and claim.action.pk == action.pk and claim.action.status == S.SUBMITTING
    expires_at = now + timedelta(seconds=settings.LEASE_SECONDS)
    stored = Action.objects.get(pk=action.pk)
    assert (stored.status, stored.lease_token, stored.lease_expires_at) == (S.SUBMITTING, claim.lease_token, expires_at)
    assert claim.attempt is not None
    attempt = Attempt.objects.get(action=action)
    assert (attempt.pk, attempt.kind, attempt.lease_token, attempt.started_at) == (
        claim.attempt.pk,
        AttemptKind.SUBMIT,
        claim.lease_token,
        now,
    )
    order = Order.objects.get(actions=action)
    assert (order.reserved_amount, order.version) == (AMOUNT, version + 1)
    event = begin_event(action)
    assert (event.from_state, event.to_state, event.created_at) == (S.AUTHORIZED, S.SUBMITTING, now)
    assert event.actor_label == "system:dispatcher"
    assert event.reason == "Reserved; submitting to the receiver."
    assert event.evidence == {
        "approval_id": approval.pk,
        "order_version": version,
        "approved_version": approval.order_version,
        "group_id": None,
        "attempt": 1,
        "lease_expires_at": expires_at.isoformat(),
    }


def test_a_claim_without_a_time_takes_the_clocks_and_names_the_caller(agent_actor: Actor) -> None:
    action = authorized_refund(agent_actor)
    before = timezone.now()

    claim = submission_begin(action_pk=action.pk, actor=Actor.system("sweeper"))

    assert claim.outcome == ClaimOutcome.CLAIMED
    event = begin_event(action)
    # The engine's clock is the database's, read through this host's (actions.foundation.clock):
    # the two agree to well within a second.
    slack = timedelta(seconds=1)
    assert before - slack <= event.created_at <= timezone.now() + slack
    assert event.actor_label == "system:sweeper"


def test_a_second_claim_finds_it_taken_and_changes_nothing(agent_actor: Actor) -> None:
    action = authorized_refund(agent_actor)
    first = submission_begin(action_pk=action.pk)
    assert first.outcome == ClaimOutcome.CLAIMED

    second = submission_begin(action_pk=action.pk)

    assert second.outcome == ClaimOutcome.TAKEN
    assert second.action is not None and second.action.pk == action.pk and second.action.status == S.SUBMITTING
    assert (second.attempt, second.lease_token, second.failures) == (None, None, [])
    assert Attempt.objects.filter(action=action).count() == 1
    assert Order.objects.get(actions=action).reserved_amount == AMOUNT, "reserved once"
    assert Action.objects.get(pk=action.pk).lease_token == first.lease_token


def test_a_claim_for_an_action_not_yet_approved_is_turned_away(agent_actor: Actor) -> None:
    action = authorized_refund(agent_actor)
    Approval.objects.filter(action=action).delete()
    Action.objects.filter(pk=action.pk).update(status=S.PROPOSED)

    claim = submission_begin(action_pk=action.pk)

    assert claim.outcome == ClaimOutcome.TAKEN and claim.action is not None and claim.action.status == S.PROPOSED
    assert not Attempt.objects.filter(action=action).exists()
    assert Order.objects.get(actions=action).reserved_amount == Decimal("0.00")


@pytest.mark.parametrize("approved", [True, False], ids=["approved", "without-approval"])
def test_the_sweeps_claim_skips_an_action_another_worker_holds(
    agent_actor: Actor,
    other_session: psycopg.Connection[Any],  # noqa: F811 -- the imported fixture
    approved: bool,
) -> None:
    action = authorized_refund(agent_actor)
    if not approved:
        Approval.objects.filter(action=action).delete()
    other_session.execute("SELECT id FROM actions_action WHERE id = %s FOR UPDATE", [action.pk])
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '2s'")  # a wait instead of a skip fails here
    try:
        claim = submission_begin(action_pk=action.pk, skip_locked=True)
        assert (claim.outcome, claim.action) == (ClaimOutcome.TAKEN, None)
        # A dispatcher's claim (no skip) waits for the row instead: here, until the timeout.
        with pytest.raises(OperationalError, match="lock timeout"):
            submission_begin(action_pk=action.pk)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    assert Action.objects.get(pk=action.pk).status == S.AUTHORIZED
