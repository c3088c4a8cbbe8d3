"""The reconcile sweep publishes each due action once per lease, never a flood of duplicates.

Regression test for what the 5,000-action chaos run found: sweeping every second and
publishing every due action each time filled the queue with duplicates faster than workers
could drain them, and real reconciliation waited behind them.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection

from actions.engine.claim import submission_begin
from actions.engine.reconcile import reconcile_claim, reconcile_due, reconcile_publish_due
from actions.engine.record import submission_record
from actions.kinds.base import Answer, Outcome
from actions.kinds.refund.proposal import action_propose_refund
from actions.models import Action, ActionStatus
from actions.providers.base import AmbiguousError
from actions.services import Actor
from tests.actions.test_reconciliation import authorized_refund
from tests.approvals.test_policy_pins import other_session  # noqa: F401 -- a fixture
from tests.factories import make_order, make_request

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def unknown_action(agent_actor: Actor, monkeypatch: pytest.MonkeyPatch) -> Action:
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)
    order = make_order(captured="100.00")
    request = make_request(order)
    action = action_propose_refund(
        order_number=order.number,
        request_number=request.number,
        amount="20.00",
        currency="EUR",
        reason_code="damaged",
        proposer=agent_actor,
    ).action
    claim = submission_begin(action_pk=action.pk)
    assert claim.attempt is not None and claim.lease_token is not None
    answer = Answer(Outcome.UNKNOWN, error=AmbiguousError("read timed out"))
    submission_record(action_pk=action.pk, attempt_pk=claim.attempt.pk, lease_token=claim.lease_token, answer=answer)
    action.refresh_from_db()
    assert action.status == ActionStatus.UNKNOWN
    return action


def test_a_due_action_is_published_once_until_its_mark_passes(unknown_action: Action, settings: Any) -> None:
    """Invariant 8 without starvation: one message per lease; a lost one is published again."""
    assert unknown_action.next_reconcile_at is not None
    now = unknown_action.next_reconcile_at + timedelta(seconds=1)

    first = reconcile_publish_due(now=now)
    again = reconcile_publish_due(now=now + timedelta(seconds=1))

    assert [pk for pk, _ in first] == [unknown_action.pk]
    assert again == []
    # The message was lost (a broker flush): once the mark passes, it is published anew.
    later = reconcile_publish_due(now=first[0][1] + timedelta(seconds=1))
    assert [pk for pk, _ in later] == [unknown_action.pk]


@pytest.mark.parametrize("status", [ActionStatus.NEEDS_REVIEW, ActionStatus.AUTHORIZED, ActionStatus.SUCCEEDED])
def test_only_actions_in_reconciliation_are_due_or_published(
    unknown_action: Action, status: str, agent_actor: Actor
) -> None:
    """A stale ``next_reconcile_at`` on an action a person holds (or that left reconciliation)
    is not a reason to ask the receiver: polling stopped when it left UNKNOWN or SETTLING."""
    assert unknown_action.next_reconcile_at is not None
    now = unknown_action.next_reconcile_at + timedelta(seconds=1)
    other = authorized_refund(agent_actor)
    Action.objects.filter(pk=other.pk).update(status=status, next_reconcile_at=unknown_action.next_reconcile_at)
    Action.objects.filter(pk=unknown_action.pk).update(status=ActionStatus.SETTLING)

    assert reconcile_due(now=now) == [unknown_action.pk]
    assert [pk for pk, _ in reconcile_publish_due(now=now)] == [unknown_action.pk]


@pytest.mark.postgres
def test_the_sweep_skips_an_action_a_reconciler_holds_locked_at_once(
    unknown_action: Action,
    other_session: psycopg.Connection[Any],  # noqa: F811 -- the imported fixture
) -> None:
    """Two sweeps (or a sweep and a reconciler recording) never wait on each other's rows: the
    locked action is left to this sweep's next pass, not waited for."""
    assert unknown_action.next_reconcile_at is not None
    now = unknown_action.next_reconcile_at + timedelta(seconds=1)
    other_session.execute("SELECT id FROM actions_action WHERE id = %s FOR UPDATE", [unknown_action.pk])
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '2s'")  # a wait instead of a skip fails here
    try:
        assert reconcile_publish_due(now=now) == []
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    other_session.rollback()
    assert [pk for pk, _ in reconcile_publish_due(now=now)] == [unknown_action.pk]


def test_the_published_task_may_claim_and_a_stale_duplicate_may_not(unknown_action: Action) -> None:
    assert unknown_action.next_reconcile_at is not None
    now = unknown_action.next_reconcile_at + timedelta(seconds=1)
    [(pk, old_mark)] = reconcile_publish_due(now=now)
    [(_, mark)] = reconcile_publish_due(now=old_mark + timedelta(seconds=1))
    at = old_mark + timedelta(seconds=2)

    assert reconcile_claim(action_pk=pk, now=at, published_mark=old_mark) is None
    claimed = reconcile_claim(action_pk=pk, now=at, published_mark=mark)

    assert claimed is not None
    assert Action.objects.get(pk=pk).lease_token == claimed[2]


def test_the_broker_says_how_many_messages_wait_in_a_queue() -> None:
    """Read through kombu from the broker the tests run on (Redis in CI)."""
    import uuid

    from actions.foundation.publish import queue_backlog
    from console.celery import app

    queue = f"test-backlog-{uuid.uuid4().hex[:8]}"
    assert queue_backlog(queue) == 0
    for _ in range(3):
        app.send_task("actions.tasks.no_such_task", queue=queue)
    try:
        assert queue_backlog(queue) == 3
    finally:
        with app.connection_for_write() as connection:
            connection.default_channel.queue_purge(queue)


def test_the_sweep_publishes_no_reconciliation_while_the_queue_is_deep(
    unknown_action: Action, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Backpressure (found by the 10,000-action chaos run: 130,000 messages queued, nine in ten
    reconciliations of the same few hundred actions, published again every lease while the
    first ones waited their turn). While the queue is deep the due actions keep their due time;
    once it is short they are published."""
    from actions import tasks

    published: list[tuple[int, str]] = []
    monkeypatch.setattr(tasks.reconcile, "delay", lambda pk, mark: published.append((pk, mark)))
    Action.objects.filter(pk=unknown_action.pk).update(next_reconcile_at=unknown_action.next_reconcile_at)
    due_at = unknown_action.next_reconcile_at
    assert due_at is not None
    Action.objects.filter(pk=unknown_action.pk).update(next_reconcile_at=due_at - timedelta(hours=1))
    settings.RECONCILE_PUBLISH_MAX_BACKLOG = 1000

    monkeypatch.setattr(tasks, "queue_backlog", lambda: 5000)
    assert tasks.sweep_reconcile() == 0
    assert published == []
    assert Action.objects.get(pk=unknown_action.pk).next_reconcile_at == due_at - timedelta(hours=1)

    monkeypatch.setattr(tasks, "queue_backlog", lambda: 12)
    assert tasks.sweep_reconcile() == 1
    assert [pk for pk, _ in published] == [unknown_action.pk]

    # A broker that cannot say how deep its queue is does not stop the sweep.
    Action.objects.filter(pk=unknown_action.pk).update(next_reconcile_at=due_at - timedelta(hours=1))
    monkeypatch.setattr(tasks, "queue_backlog", lambda: None)
    assert tasks.sweep_reconcile() == 1


def test_every_periodic_task_expires_once_it_waited_as_long_as_its_stale_threshold() -> None:
    """A sweep queued for as long as its stale threshold is superseded by the next; one that
    waited an interval behind another sweep still runs."""
    from django.conf import settings as django_settings

    schedule: dict[str, dict[str, Any]] = django_settings.CELERY_BEAT_SCHEDULE
    for name, entry in schedule.items():
        expires = entry["options"]["expires"]
        assert expires == entry["schedule"] * django_settings.SCHEDULE_STALE_PERIODS, name
        assert expires > entry["schedule"], name
