"""The reconcile sweep publishes each due action once per lease, never a flood of duplicates.

Regression test for what the 5,000-action chaos run found: sweeping every second and
publishing every due action each time filled the queue with duplicates faster than workers
could drain them, and real reconciliation waited behind them.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from actions.engine.claim import submission_begin
from actions.engine.dispatch import submission_record
from actions.engine.reconcile import reconcile_claim, reconcile_publish_due
from actions.kinds.base import Answer, Outcome
from actions.models import Action, ActionStatus
from actions.providers.base import AmbiguousError
from actions.services import Actor, action_propose_refund
from tests.factories import make_order, make_request

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def unknown_action(agent_actor: Actor, monkeypatch: pytest.MonkeyPatch) -> Action:
    monkeypatch.setattr("actions.publish.dispatch_enqueue", lambda pk: None)
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
