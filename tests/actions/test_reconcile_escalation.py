"""The escalation policy of reconciliation, decided in memory (no sandbox process).

RECONCILE_MAX_FAILURES inconclusive lookups within RECONCILE_WINDOW_SECONDS hand the action to a
named person (NEEDS_REVIEW) and stop the polling; fewer keep it UNKNOWN and back off. Only this
action's inconclusive *lookups* inside the window count.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from actions.engine.reconcile import reconcile_action
from actions.kinds.base import Answer, Effect, Lookup, LookupVerdict
from actions.kinds.refund.contract import RefundReceiver, refund_contract
from actions.models import Action, ActionEvent, ActionStatus, Attempt, AttemptKind
from actions.providers.base import LookupFailed
from actions.services import Actor
from tests.actions.test_reconciliation import FakeReceiver, guarantees, unknown_and_due
from tests.actions.test_settlement_decisions import last_action_update_columns

pytestmark = pytest.mark.django_db(transaction=True)
S = ActionStatus


class UnreachableLookups:
    """Every lookup fails: the receiver cannot say anything."""

    def __init__(self) -> None:
        self.contract = refund_contract(guarantees(keys=True, lookup=True, authoritative=True))
        self.lookups = 0

    def lookup(self, action: Action) -> Lookup:
        self.lookups += 1
        return Lookup(LookupVerdict.INCONCLUSIVE, error=LookupFailed(f"timed out ({self.lookups})", code="timeout"))

    def send(self, action: Action) -> Answer:
        raise AssertionError("nothing is sent while the outcome is unknown")

    def ledger(self, window: object = None) -> Iterator[Effect]:
        return iter(())


def one_pass(action: Action, receiver: UnreachableLookups) -> str:
    Action.objects.filter(pk=action.pk).update(next_reconcile_at=timezone.now() - timedelta(seconds=1))
    return reconcile_action(action_pk=action.pk, receiver=receiver)


def test_inconclusive_lookups_up_to_the_policy_then_a_named_person(
    agent_actor: Actor, finance: Any, settings: Any
) -> None:
    settings.RECONCILE_MAX_FAILURES = 3
    settings.RECONCILE_WINDOW_SECONDS = 24 * 3600
    action = unknown_and_due(agent_actor)
    receiver = UnreachableLookups()

    with CaptureQueriesContext(connection) as queries:
        assert [one_pass(action, receiver), one_pass(action, receiver)] == ["inconclusive", "inconclusive"]
    assert sorted(last_action_update_columns(queries)) == [
        "lease_expires_at",
        "lease_token",
        "next_reconcile_at",
        "reconcile_failures",
    ]
    action.refresh_from_db()
    assert (action.status, action.reconcile_failures) == (S.UNKNOWN, 2)
    assert action.next_reconcile_at is not None and action.next_reconcile_at > timezone.now()

    assert one_pass(action, receiver) == S.NEEDS_REVIEW

    action.refresh_from_db()
    assert (action.status, action.reconcile_failures, action.owner) == (S.NEEDS_REVIEW, 3, finance)
    event = ActionEvent.objects.filter(action=action).order_by("-pk").first()
    assert event is not None and event.transition == "escalate"
    assert event.reason.startswith(
        "3 reconciliation attempts in a row could not reach a conclusion (policy: 3 within 24 h). "
        "Last error: timed out (3) (code=timeout)."
    )
    assert receiver.lookups == 3


def test_only_this_actions_inconclusive_lookups_inside_the_window_count(
    agent_actor: Actor, finance: Any, settings: Any
) -> None:
    settings.RECONCILE_MAX_FAILURES = 3
    settings.RECONCILE_WINDOW_SECONDS = 3600
    action = unknown_and_due(agent_actor)
    neighbour = unknown_and_due(agent_actor)
    receiver = UnreachableLookups()
    # The neighbour's failed lookups are its own.
    for _ in range(3):
        one_pass(neighbour, receiver)
    assert Action.objects.get(pk=neighbour.pk).status == S.NEEDS_REVIEW
    # Failures of this action older than the window, a failed send: none of them count.
    assert [one_pass(action, receiver), one_pass(action, receiver)] == ["inconclusive", "inconclusive"]
    Attempt.objects.filter(action=action, kind=AttemptKind.LOOKUP).update(
        started_at=timezone.now() - timedelta(seconds=3600 + 60)
    )
    Attempt.objects.filter(action=action, kind=AttemptKind.SUBMIT).update(outcome=LookupVerdict.INCONCLUSIVE)
    # And a lookup inside the window that did conclude (not found) is no failure either.
    concluded = Attempt.objects.filter(action=action, kind=AttemptKind.LOOKUP).order_by("pk").first()
    assert concluded is not None
    Attempt.objects.filter(pk=concluded.pk).update(outcome=LookupVerdict.NOT_FOUND, started_at=timezone.now())

    assert one_pass(action, receiver) == "inconclusive"

    action.refresh_from_db()
    assert (action.status, action.reconcile_failures) == (S.UNKNOWN, 1)


def test_a_not_found_after_the_policys_number_of_sends_goes_to_a_person_not_another_send(
    agent_actor: Actor, finance: Any, settings: Any
) -> None:
    """Every send so far was answered ambiguously and left nothing: sending again would only
    repeat that, so the escalation policy applies to retries too."""
    settings.RECONCILE_MAX_FAILURES = 3
    action = unknown_and_due(agent_actor)
    Action.objects.filter(pk=action.pk).update(attempt_count=3, next_reconcile_at=timezone.now() - timedelta(seconds=1))
    fake = FakeReceiver(guarantees(keys=True, lookup=True, authoritative=True))

    assert reconcile_action(action_pk=action.pk, receiver=RefundReceiver(fake)) == S.NEEDS_REVIEW

    assert fake.calls == ["find_refunds"], "not sent a fourth time"
    stored = Action.objects.get(pk=action.pk)
    assert (stored.status, stored.owner) == (S.NEEDS_REVIEW, finance)
    escalation = ActionEvent.objects.get(action=action, transition="escalate")
    lookup = Attempt.objects.get(action=action, kind=AttemptKind.LOOKUP)
    assert (escalation.actor_label, escalation.reason.split(" Assigned to ")[0]) == (
        "system:reconciler",
        "Sent 3 times with the same key and still nothing at the receiver (policy: 3).",
    )
    assert {k: escalation.evidence[k] for k in ("attempt_id", "verdict")} == {
        "attempt_id": lookup.pk,
        "verdict": LookupVerdict.NOT_FOUND,
    }


def test_a_not_found_below_the_policys_number_of_sends_is_sent_again(agent_actor: Actor, settings: Any) -> None:
    settings.RECONCILE_MAX_FAILURES = 3
    action = unknown_and_due(agent_actor)
    Action.objects.filter(pk=action.pk).update(attempt_count=2, next_reconcile_at=timezone.now() - timedelta(seconds=1))
    fake = FakeReceiver(guarantees(keys=True, lookup=True, authoritative=True))

    assert reconcile_action(action_pk=action.pk, receiver=RefundReceiver(fake)) == S.SUCCEEDED
    assert fake.calls == ["find_refunds", "create_refund"]
