"""Siblings of one grouped decision racing to reserve, on PostgreSQL with a connection per thread.

Whatever the interleaving, every member reserves exactly once (none goes stale because of a
sibling), the group's version chain ends where the order's version is, and the order's money adds
up. A separately approved proposal racing with them is the one thing that changes the order from
outside the group: either it goes first and every member goes stale, or a member goes first and it
goes stale; never a mix, and never a reservation at a version its approval did not allow.
"""

from __future__ import annotations

from typing import Any

import pytest

from actions.engine.claim import ClaimOutcome, submission_begin
from actions.models import Action, ActionStatus, Order
from actions.services import Actor
from approvals.models import ApprovalGroup
from approvals.services import approval_decide, approval_decide_group
from tests.approvals.test_reservation import assert_order_money_adds_up
from tests.concurrency.test_reservation_race import propose
from tests.factories import make_order
from tests.threads import run_at_once

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

S = ActionStatus
ROUNDS = 4
MEMBERS = 4


@pytest.fixture(autouse=True)
def manual_decisions(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.AUTO_APPROVAL_ENABLED = False
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)


def test_grouped_siblings_racing_each_reserve_once_and_none_goes_stale(manager: Any, agent_actor: Actor) -> None:
    for _ in range(ROUNDS):
        order = make_order(captured="500.00")
        members = [propose(agent_actor, order, amount="25.00") for _ in range(MEMBERS)]
        version = Order.objects.get(pk=order.pk).version
        approval_decide_group(action_pks=[m.pk for m in members], user=manager)

        claims = run_at_once(*[(lambda pk=m.pk: submission_begin(action_pk=pk)) for m in members])

        assert [c.outcome for c in claims] == [ClaimOutcome.CLAIMED] * MEMBERS
        after = Order.objects.get(pk=order.pk)
        assert after.version == version + MEMBERS
        assert ApprovalGroup.objects.get(approvals__action=members[0]).next_version == after.version
        assert_order_money_adds_up(order)


def test_a_separate_approval_racing_a_group_makes_one_side_stale_never_a_mix(
    manager: Any, second_manager: Any, agent_actor: Actor
) -> None:
    for _ in range(ROUNDS):
        order = make_order(captured="500.00")
        members = [propose(agent_actor, order, amount="25.00") for _ in range(MEMBERS)]
        separate = propose(agent_actor, order, amount="30.00")
        approval_decide_group(action_pks=[m.pk for m in members], user=manager)
        approval_decide(action_pk=separate.pk, user=second_manager, decision="approve")

        claimers = [m.pk for m in members] + [separate.pk]
        run_at_once(*[(lambda pk=pk: submission_begin(action_pk=pk)) for pk in claimers])

        group_statuses = set(Action.objects.filter(pk__in=[m.pk for m in members]).values_list("status", flat=True))
        separate_status = Action.objects.get(pk=separate.pk).status
        assert (group_statuses, separate_status) in [({S.SUBMITTING}, S.STALE), ({S.STALE}, S.SUBMITTING)]
        assert_order_money_adds_up(order)
