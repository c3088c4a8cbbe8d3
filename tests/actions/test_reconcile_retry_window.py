"""When a not-found lookup permits sending again with the same key (``retry_allowed``), decided
in memory with a receiver whose lookups are *not* authoritative: only the key retention can make
a resend safe, and only while the first attempt is inside it by the safety margin."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from actions.engine.reconcile import reconcile_action
from actions.kinds.base import Outcome
from actions.kinds.refund.contract import RefundReceiver
from actions.models import Action, ActionEvent, ActionStatus, Attempt, AttemptKind
from actions.services import Actor
from tests.actions.test_reconciliation import FakeReceiver, guarantees, unknown_without_receiver
from tests.actions.test_settlement_decisions import assert_writes_only_the_poll_columns

pytestmark = pytest.mark.django_db(transaction=True)
S = ActionStatus
RETENTION = timedelta(hours=24)


@pytest.fixture(autouse=True)
def margin(settings: Any) -> timedelta:
    settings.KEY_RETENTION_MARGIN_SECONDS = 3600
    return timedelta(seconds=3600)


def unknown_first_sent_at(agent_actor: Actor, first: datetime) -> Action:
    action = unknown_without_receiver(agent_actor)
    Action.objects.filter(pk=action.pk).update(first_attempt_at=first, last_attempt_at=first, next_reconcile_at=None)
    return action


def keyed_receiver_with_unreliable_lookups() -> FakeReceiver:
    # Nothing at the receiver: every lookup is not-found; a resend creates the refund.
    return FakeReceiver(guarantees(keys=True, lookup=True, authoritative=False, key_retention=RETENTION))


def test_inside_the_key_retention_a_not_found_is_sent_again_with_the_same_key(
    agent_actor: Actor, margin: timedelta
) -> None:
    now = timezone.now()
    first = now - (RETENTION - margin) + timedelta(seconds=1)  # one second inside
    action = unknown_first_sent_at(agent_actor, first)
    fake = keyed_receiver_with_unreliable_lookups()

    assert reconcile_action(action_pk=action.pk, receiver=RefundReceiver(fake), now=now) == S.SUCCEEDED

    assert fake.calls == ["find_refunds", "create_refund"]
    retry = ActionEvent.objects.get(action=action, transition="retry")
    assert retry.reason == (
        "Not found, and the first attempt is inside the receiver's key retention: re-sending with the "
        "same key is replayed or executed once."
    )
    [first_send, resend] = Attempt.objects.filter(action=action, kind=AttemptKind.SUBMIT).order_by("pk")
    assert resend.idempotency_key == first_send.idempotency_key


@pytest.mark.parametrize("past", [timedelta(0), timedelta(hours=30)], ids=["at-the-margin", "long-past"])
def test_at_or_past_the_retention_less_its_margin_a_person_decides(
    agent_actor: Actor, margin: timedelta, past: timedelta, finance: Any
) -> None:
    now = timezone.now()
    first = now - (RETENTION - margin) - past
    action = unknown_first_sent_at(agent_actor, first)
    fake = keyed_receiver_with_unreliable_lookups()

    assert reconcile_action(action_pk=action.pk, receiver=RefundReceiver(fake), now=now) == S.NEEDS_REVIEW

    assert fake.calls == ["find_refunds"], "nothing was sent again"
    escalation = ActionEvent.objects.get(action=action, transition="escalate")
    assert escalation.reason.startswith(
        "Not found, but the receiver's lookups are not authoritative: a person must decide."
    )


# --- an authoritative receiver: the lookup visibility delay ------------------------------------

VISIBILITY = timedelta(seconds=60)


def authoritative_receiver_without_retention() -> FakeReceiver:
    return FakeReceiver(guarantees(keys=True, lookup=True, authoritative=True, visibility=VISIBILITY))


def unknown_sent_at(agent_actor: Actor, *, first: datetime, last: datetime) -> Action:
    action = unknown_first_sent_at(agent_actor, first)
    Action.objects.filter(pk=action.pk).update(last_attempt_at=last)
    return action


def test_an_authoritative_not_found_inside_the_visibility_delay_waits(agent_actor: Actor) -> None:
    """The lookup may not show a refund created a moment ago yet: not found proves nothing until
    the visibility delay has passed since the *last* send (not the first)."""
    now = timezone.now()
    action = unknown_sent_at(agent_actor, first=now - timedelta(hours=2), last=now - VISIBILITY + timedelta(seconds=1))
    fake = authoritative_receiver_without_retention()

    with CaptureQueriesContext(connection) as queries:
        assert reconcile_action(action_pk=action.pk, receiver=RefundReceiver(fake), now=now) == "too_early"
    assert_writes_only_the_poll_columns(queries)

    assert fake.calls == ["find_refunds"], "nothing was sent again"
    action.refresh_from_db()
    assert action.status == S.UNKNOWN and action.next_reconcile_at is not None and action.next_reconcile_at > now


@pytest.mark.parametrize("after", [timedelta(0), timedelta(minutes=5)], ids=["at-the-delay", "long-after"])
def test_an_authoritative_not_found_after_the_visibility_delay_is_sent_again(
    agent_actor: Actor, after: timedelta
) -> None:
    now = timezone.now()
    action = unknown_sent_at(agent_actor, first=now - timedelta(hours=2), last=now - VISIBILITY - after)
    fake = authoritative_receiver_without_retention()

    assert reconcile_action(action_pk=action.pk, receiver=RefundReceiver(fake), now=now) == S.SUCCEEDED

    assert fake.calls == ["find_refunds", "create_refund"]
    retry = ActionEvent.objects.get(action=action, transition="retry")
    assert retry.reason == "Authoritative not-found after the receiver's visibility delay: retry with the same key."


def test_the_lookup_refuses_to_run_inside_a_transaction(agent_actor: Actor) -> None:
    from django.db import transaction

    from actions.engine.reconcile import receiver_lookup

    action = unknown_first_sent_at(agent_actor, timezone.now())
    fake = authoritative_receiver_without_retention()
    with (
        transaction.atomic(),
        pytest.raises(AssertionError, match=r"^a network call must not run inside a transaction$"),
    ):
        receiver_lookup(action=action, receiver=RefundReceiver(fake))
    assert fake.calls == []


def test_a_published_task_reconciles_its_action_before_the_mark_passes(agent_actor: Actor) -> None:
    """The sweep moved ``next_reconcile_at`` to the mark when it published the task; the task runs
    before the mark and still takes the action (reconcile_publish_due)."""
    now = timezone.now()
    action = unknown_sent_at(agent_actor, first=now - timedelta(hours=2), last=now - timedelta(hours=2))
    mark = now + timedelta(seconds=30)
    Action.objects.filter(pk=action.pk).update(next_reconcile_at=mark)
    fake = authoritative_receiver_without_retention()

    assert reconcile_action(action_pk=action.pk, receiver=RefundReceiver(fake), now=now, published_mark=mark) == (
        S.SUCCEEDED
    )
    assert fake.calls == ["find_refunds", "create_refund"]


class TakenOverDuringTheSend(FakeReceiver):
    """While the retry's call is in flight, its lease runs out and another worker takes the action."""

    def create_refund(self, req):  # type: ignore[no-untyped-def]
        Action.objects.filter(action_id=req.metadata["action_id"]).update(lease_token=uuid.uuid4())
        return super().create_refund(req)


def test_the_retrys_answer_is_fenced_by_the_retrys_own_lease(agent_actor: Actor) -> None:
    now = timezone.now()
    action = unknown_sent_at(agent_actor, first=now - timedelta(hours=2), last=now - timedelta(hours=2))
    fake = TakenOverDuringTheSend(guarantees(keys=True, lookup=True, authoritative=True))

    assert reconcile_action(action_pk=action.pk, receiver=RefundReceiver(fake), now=now) == "lease_lost"

    stored = Action.objects.get(pk=action.pk)
    assert stored.status == S.SUBMITTING, "the answer is the new holder's to record, or reconciliation's"
    resend = Attempt.objects.filter(action=action, kind=AttemptKind.SUBMIT).order_by("-pk").first()
    assert resend is not None and resend.held_lease is False and resend.outcome == Outcome.SUCCEEDED.value
