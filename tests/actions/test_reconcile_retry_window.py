"""When a not-found lookup permits sending again with the same key (``retry_allowed``), decided
in memory with a receiver whose lookups are *not* authoritative: only the key retention can make
a resend safe, and only while the first attempt is inside it by the safety margin."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from actions.engine.dispatch import submission_record
from actions.engine.reconcile import reconcile_action
from actions.kinds.base import Answer, Outcome
from actions.kinds.refund import RefundReceiver
from actions.models import Action, ActionEvent, ActionStatus, Attempt, AttemptKind
from actions.providers.base import AmbiguousError
from actions.services import Actor
from tests.actions.test_dispatcher_fence import claimed
from tests.actions.test_reconciliation import FakeReceiver, guarantees

pytestmark = pytest.mark.django_db(transaction=True)
S = ActionStatus
RETENTION = timedelta(hours=24)


@pytest.fixture(autouse=True)
def margin(settings: Any) -> timedelta:
    settings.KEY_RETENTION_MARGIN_SECONDS = 3600
    return timedelta(seconds=3600)


def unknown_first_sent_at(agent_actor: Actor, first: datetime) -> Action:
    action, attempt, token = claimed(agent_actor)
    timeout = AmbiguousError("read timed out", code="timeout")
    submission_record(
        action_pk=action.pk, attempt_pk=attempt.pk, lease_token=token, answer=Answer(Outcome.UNKNOWN, error=timeout)
    )
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
