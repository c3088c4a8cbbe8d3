"""Settlement decided in memory: the reconciler's pass over a SETTLING action, without the sandbox.

``tests/actions/test_settlement.py`` drives the same path through the sandbox's process, which
the mutation runs leave out; these tests pin each branch of ``_record_settling`` with a receiver
that answers what the test says: still pending (poll again, keep the reservation), settled as
succeeded (refunded money), settled as failed (reservation released), or no answer (poll again).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from actions.engine.reconcile import reconcile_action
from actions.engine.record import submission_record
from actions.kinds.base import Answer, Effect, Lookup, LookupVerdict, Outcome
from actions.kinds.refund.contract import refund_contract
from actions.models import Action, ActionEvent, ActionStatus, Attempt, AttemptKind
from actions.providers.base import LookupFailed
from actions.services import Actor
from tests.actions.test_dispatcher_fence import claimed
from tests.actions.test_reconciliation import AMOUNT, guarantees, order_money

pytestmark = pytest.mark.django_db(transaction=True)
S = ActionStatus
REFERENCE = "re_settling_1"


def refund_effect(action: Action, status: str, outcome: Outcome) -> Effect:
    return Effect(
        reference=REFERENCE,
        status=status,
        outcome=outcome,
        amount_minor=int(AMOUNT * 100),
        currency="EUR",
        action_id=action.action_id,
        raw={"id": REFERENCE, "status": status},
    )


class SettlingReceiver:
    """Answers every lookup with ``self.answer``."""

    def __init__(self, answer: Lookup) -> None:
        self.contract = refund_contract(guarantees(keys=True, lookup=True, authoritative=True))
        self.answer = answer
        self.lookups = 0

    def lookup(self, action: Action) -> Lookup:
        self.lookups += 1
        return self.answer

    def send(self, action: Action) -> Answer:
        raise AssertionError("a settling refund is never sent again")

    def ledger(self, window: object = None) -> Iterator[Effect]:
        return iter(())


def settling(agent_actor: Actor) -> Action:
    """A refund the receiver accepted as pending: SETTLING, its amount reserved, its poll due."""
    action, attempt, token = claimed(agent_actor)
    pending = refund_effect(action, "pending", Outcome.PENDING)
    submission_record(
        action_pk=action.pk, attempt_pk=attempt.pk, lease_token=token, answer=Answer(Outcome.PENDING, effect=pending)
    )
    Action.objects.filter(pk=action.pk).update(next_reconcile_at=timezone.now() - timedelta(seconds=1))
    action.refresh_from_db()
    assert action.status == S.SETTLING and action.provider_reference == REFERENCE
    assert order_money(action) == (Decimal("0.00"), AMOUNT)
    return action


def action_updates(queries: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in queries.captured_queries if q["sql"].startswith('UPDATE "actions_action"')]


def last_action_update_columns(queries: CaptureQueriesContext) -> list[str]:
    """The columns the last UPDATE of an action wrote, in order."""
    [*_, last] = action_updates(queries)
    return re.findall(r'"(\w+)" = ', last.split(" SET ", 1)[1].split(" WHERE ", 1)[0])


def assert_writes_only_the_poll_columns(queries: CaptureQueriesContext) -> None:
    """A poll that changes nothing but the lease and the next poll writes only those columns: a
    whole-row save would also rewrite the money and the payload from a copy read earlier."""
    assert last_action_update_columns(queries) == ["lease_token", "lease_expires_at", "next_reconcile_at"]


def last_event(action: Action) -> ActionEvent:
    return ActionEvent.objects.filter(action=action).order_by("-pk").first()  # type: ignore[return-value]


def test_a_refund_still_pending_is_polled_again_and_keeps_its_reservation(agent_actor: Actor, settings: Any) -> None:
    action = settling(agent_actor)
    receiver = SettlingReceiver(
        Lookup(LookupVerdict.FOUND, effects=[refund_effect(action, "pending", Outcome.PENDING)])
    )
    events_before = ActionEvent.objects.filter(action=action).count()
    now = timezone.now()

    with CaptureQueriesContext(connection) as queries:
        assert reconcile_action(action_pk=action.pk, receiver=receiver, now=now) == "still_pending"
    assert_writes_only_the_poll_columns(queries)

    action.refresh_from_db()
    assert action.status == S.SETTLING and receiver.lookups == 1
    assert (action.lease_token, action.lease_expires_at) == (None, None), "the reconciler's lease is given back"
    base = settings.RECONCILE_BASE_BACKOFF_SECONDS
    assert action.next_reconcile_at is not None
    # next_reconcile_time: the provider's lookup visibility delay, the base backoff, up to a quarter more jitter.
    visibility = settings.PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS
    assert now + timedelta(seconds=base) <= action.next_reconcile_at
    assert action.next_reconcile_at <= now + timedelta(seconds=visibility + base * 1.25 + 1)
    assert order_money(action) == (Decimal("0.00"), AMOUNT)
    assert ActionEvent.objects.filter(action=action).count() == events_before, "nothing happened to record"
    lookup = Attempt.objects.get(action=action, kind=AttemptKind.LOOKUP)
    assert (lookup.outcome, lookup.held_lease) == (LookupVerdict.FOUND, True)


def test_a_refund_the_receiver_settled_becomes_refunded_money_recorded_by_the_reconciler(agent_actor: Actor) -> None:
    action = settling(agent_actor)
    receiver = SettlingReceiver(
        Lookup(LookupVerdict.FOUND, effects=[refund_effect(action, "succeeded", Outcome.SUCCEEDED)])
    )
    now = timezone.now()

    assert reconcile_action(action_pk=action.pk, receiver=receiver, now=now) == S.SUCCEEDED

    action.refresh_from_db()
    assert action.status == S.SUCCEEDED
    assert (action.lease_token, action.lease_expires_at) == (None, None)
    assert order_money(action) == (AMOUNT, Decimal("0.00"))
    event = last_event(action)
    lookup = Attempt.objects.get(action=action, kind=AttemptKind.LOOKUP)
    assert (event.transition, event.from_state, event.to_state) == ("settle", S.SETTLING, S.SUCCEEDED)
    assert event.actor_label == "system:reconciler" and event.created_at == now
    assert event.reason == f"The receiver settled it: {REFERENCE} succeeded."
    assert event.evidence == {
        "answer": f"{REFERENCE} succeeded",
        "source": "settlement",
        "attempt_id": lookup.pk,
        "verdict": LookupVerdict.FOUND,
    }


def test_a_refund_the_receiver_failed_releases_its_reservation(agent_actor: Actor) -> None:
    action = settling(agent_actor)
    receiver = SettlingReceiver(
        Lookup(LookupVerdict.FOUND, effects=[refund_effect(action, "failed", Outcome.FAILED_FINAL)])
    )

    assert reconcile_action(action_pk=action.pk, receiver=receiver) == S.FAILED_FINAL

    action.refresh_from_db()
    assert action.status == S.FAILED_FINAL
    assert order_money(action) == (Decimal("0.00"), Decimal("0.00"))
    assert last_event(action).to_state == S.FAILED_FINAL


@pytest.mark.parametrize("verdict", [LookupVerdict.INCONCLUSIVE, LookupVerdict.NOT_FOUND])
def test_a_settling_refund_with_no_answer_is_polled_again(agent_actor: Actor, verdict: str) -> None:
    """No answer about a refund the receiver already accepted proves nothing: ask again later,
    keeping the reservation; never a retry, never a failure."""
    action = settling(agent_actor)
    error = LookupFailed("timed out", code="timeout") if verdict == LookupVerdict.INCONCLUSIVE else None
    receiver = SettlingReceiver(Lookup(verdict, error=error))
    now = timezone.now()

    with CaptureQueriesContext(connection) as queries:
        assert reconcile_action(action_pk=action.pk, receiver=receiver, now=now) == "inconclusive"
    assert_writes_only_the_poll_columns(queries)

    action.refresh_from_db()
    assert action.status == S.SETTLING
    assert (action.lease_token, action.lease_expires_at) == (None, None)
    assert action.next_reconcile_at is not None and action.next_reconcile_at > now
    assert order_money(action) == (Decimal("0.00"), AMOUNT)
    assert Attempt.objects.filter(action=action, kind=AttemptKind.SUBMIT).count() == 1, "nothing was sent again"
