"""Several proposals on one order approved as ONE decision.

The members are bound to the order's version as the manager saw it, and their sum is checked
against the order's refundable balance and the manager's limit. Each member's reservation
raises the order's version; the group's version chain lets the next sibling reserve at the
version its siblings left, so none of them goes stale because of a sibling. Anything else that
changes the order still makes the rest stale, and separately approved proposals still go stale
as before (docs/architecture.md section 5).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.db.models import F

from actions.engine.claim import ClaimOutcome, submission_begin
from actions.models import Action, ActionEvent, ActionStatus, Order
from actions.services import Actor
from approvals.models import Approval, ApprovalGroup
from approvals.services import DecisionRefused, approval_decide, approval_decide_group
from tests.approvals.test_views import order_of, propose
from tests.factories import make_order

pytestmark = pytest.mark.django_db

S = ActionStatus


@pytest.fixture(autouse=True)
def manual_decisions(settings: Any) -> None:
    settings.AUTO_APPROVAL_ENABLED = False


@pytest.fixture(autouse=True)
def published(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", calls.append)
    return calls


def two_on_one_order(agent_actor: Actor, *, first: str = "40.00", second: str = "60.00", captured: str = "310.00"):
    order = make_order(captured=captured)
    return propose(agent_actor, amount=first, order=order), propose(agent_actor, amount=second, order=order)


def nothing_written(actions: list[Action]) -> None:
    assert not Approval.objects.filter(action__in=actions).exists()
    assert not ApprovalGroup.objects.exists()
    assert {a.status for a in Action.objects.filter(pk__in=[a.pk for a in actions])} == {S.PROPOSED}


def test_a_grouped_decision_lets_every_member_reserve_without_going_stale(
    manager: Any, agent_actor: Actor, published: list[int], django_capture_on_commit_callbacks: Any
) -> None:
    a, b = two_on_one_order(agent_actor)
    version = order_of(a).version

    with django_capture_on_commit_callbacks(execute=True):
        decision = approval_decide_group(action_pks=[a.pk, b.pk], user=manager, note="Both parcels damaged.")

    assert decision.group.size == 2 and decision.group.total_amount == Decimal("100.00")
    assert {ap.order_version for ap in decision.approvals} == {version}
    assert sorted(published) == sorted([a.pk, b.pk])
    # The second claim finds the order one version further on, because of its sibling only.
    assert submission_begin(action_pk=b.pk).outcome == ClaimOutcome.CLAIMED
    assert submission_begin(action_pk=a.pk).outcome == ClaimOutcome.CLAIMED
    order = Order.objects.get(pk=order_of(a).pk)
    assert order.version == version + 2
    assert order.reserved_amount == Decimal("100.00")
    assert {x.status for x in Action.objects.filter(pk__in=[a.pk, b.pk])} == {S.SUBMITTING}


def test_separately_approved_siblings_still_go_stale_and_say_so(manager: Any, agent_actor: Actor) -> None:
    a, b = two_on_one_order(agent_actor)
    approval_decide(action_pk=a.pk, user=manager, decision="approve")
    approval_decide(action_pk=b.pk, user=manager, decision="approve")

    assert submission_begin(action_pk=a.pk).outcome == ClaimOutcome.CLAIMED
    claim = submission_begin(action_pk=b.pk)

    assert claim.outcome == ClaimOutcome.STALE
    assert [f["binding"] for f in claim.failures] == ["order_version"]


def test_a_change_outside_the_group_still_makes_the_remaining_members_stale(manager: Any, agent_actor: Actor) -> None:
    a, b = two_on_one_order(agent_actor)
    approval_decide_group(action_pks=[a.pk, b.pk], user=manager)
    assert submission_begin(action_pk=a.pk).outcome == ClaimOutcome.CLAIMED
    # Something other than a sibling changes the order (a correction, an outside refund).
    Order.objects.filter(pk=order_of(a).pk).update(version=F("version") + 1)

    assert submission_begin(action_pk=b.pk).outcome == ClaimOutcome.STALE
    assert Action.objects.get(pk=b.pk).status == S.STALE


def test_a_group_whose_sum_exceeds_the_refundable_balance_is_refused_and_writes_nothing(
    manager: Any, agent_actor: Actor
) -> None:
    # Each fits on its own (200 <= 310), together they do not (400 > 310).
    a, b = two_on_one_order(agent_actor, first="200.00", second="200.00", captured="310.00")

    with pytest.raises(DecisionRefused) as refused:
        approval_decide_group(action_pks=[a.pk, b.pk], user=manager)

    assert refused.value.code == "over_refundable_balance"
    assert "400.00 EUR" in str(refused.value) and "310.00 EUR" in str(refused.value)
    nothing_written([a, b])


def test_a_group_whose_sum_exceeds_the_managers_limit_is_refused(second_manager: Any, agent_actor: Actor) -> None:
    # Mark may approve up to 100 EUR; each is within it, the sum is not.
    a, b = two_on_one_order(agent_actor, first="60.00", second="60.00")

    with pytest.raises(DecisionRefused) as refused:
        approval_decide_group(action_pks=[a.pk, b.pk], user=second_manager)

    assert refused.value.code == "over_limit"
    nothing_written([a, b])


def test_four_eyes_applies_to_each_member(manager: Any, agent_actor: Actor) -> None:
    mine = Actor.for_user(manager)
    order = make_order(captured="300.00")
    a = propose(agent_actor, amount="10.00", order=order)
    b = propose(mine, amount="20.00", order=order)

    with pytest.raises(DecisionRefused) as refused:
        approval_decide_group(action_pks=[a.pk, b.pk], user=manager)

    assert refused.value.code == "four_eyes"
    assert b.action_id in str(refused.value)
    nothing_written([a, b])


def test_proposals_on_different_orders_cannot_be_one_decision(manager: Any, agent_actor: Actor) -> None:
    a = propose(agent_actor, amount="10.00")
    b = propose(agent_actor, amount="20.00")

    with pytest.raises(DecisionRefused) as refused:
        approval_decide_group(action_pks=[a.pk, b.pk], user=manager)

    assert refused.value.code == "group_mixed_targets"
    nothing_written([a, b])


def test_a_member_no_longer_waiting_refuses_the_whole_decision(
    manager: Any, second_manager: Any, agent_actor: Actor
) -> None:
    a, b = two_on_one_order(agent_actor)
    approval_decide(action_pk=b.pk, user=second_manager, decision="reject")

    with pytest.raises(DecisionRefused) as refused:
        approval_decide_group(action_pks=[a.pk, b.pk], user=manager)

    assert refused.value.code == "not_waiting"
    assert Action.objects.get(pk=a.pk).status == S.PROPOSED
    assert not ApprovalGroup.objects.exists()


def test_one_proposal_is_not_a_group(manager: Any, agent_actor: Actor) -> None:
    a, _ = two_on_one_order(agent_actor)
    with pytest.raises(DecisionRefused) as refused:
        approval_decide_group(action_pks=[a.pk, a.pk], user=manager)
    assert refused.value.code == "group_too_small"


def test_the_trail_names_the_group(manager: Any, agent_actor: Actor) -> None:
    a, b = two_on_one_order(agent_actor)
    decision = approval_decide_group(action_pks=[a.pk, b.pk], user=manager)
    submission_begin(action_pk=a.pk)
    begin = ActionEvent.objects.get(action=a, transition="begin_submission")
    approve = ActionEvent.objects.get(action=a, transition="approve")
    assert approve.evidence["group_id"] == decision.group.pk
    assert begin.evidence["group_id"] == decision.group.pk
