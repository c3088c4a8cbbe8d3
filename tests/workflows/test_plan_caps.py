"""The caps on autonomy count a plan the policy approved before the coordinator creates its
money step's action, from either door: another plan, or a lone proposal on the same order. And
they count an approval stamped a moment after the deciding proposal's own clock, which is what a
proposal that waited for the order's lock meets. (tests/concurrency/test_cap_race.py races
proposals made together, with threads.)"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from actions.kinds.refund.proposal import action_propose_refund
from actions.models import Action, ActionStatus, Order, Workflow, WorkflowState
from actions.services import Actor
from actions.workflows.coordinator import workflow_advance
from actions.workflows.services import workflow_propose
from approvals.models import Approval, ApprovalPolicy
from tests.factories import make_order, make_request
from tests.workflows.conftest import refund_parameters

pytestmark = pytest.mark.django_db

W = WorkflowState


@pytest.fixture(autouse=True)
def no_publish(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)
    monkeypatch.setattr("actions.foundation.publish.workflow_advance_enqueue", lambda workflow_id: None)


@pytest.fixture
def order() -> Order:
    order = make_order(number="4900", captured="100.00")
    for number in (1, 2, 3):
        make_request(order, number)
    return order


def plan(agent: Any, order: Order, request_number: int) -> Workflow:
    return workflow_propose(
        template="refund_with_notice",
        parameters=refund_parameters(
            order_number=order.number, request_number=request_number, amount="10.00", case=f"t-{request_number}"
        ),
        proposer=Actor.for_agent(agent),
    ).workflow


def test_the_third_plan_waits_for_a_manager_before_any_refund_exists(agent: Any, order: Order) -> None:
    assert [plan(agent, order, n).state for n in (1, 2)] == [W.AUTHORIZED, W.AUTHORIZED]
    assert not Action.objects.filter(order=order).exists()  # the coordinator has not run yet

    third = plan(agent, order, 3)

    assert third.state == W.PROPOSED
    held = third.events.get(transition="auto_approval_held").reason
    assert f"Auto-approval cap for order {order.number} reached: 2 refunds" in held
    assert "(at most 2). 2 of the auto-approved refunds are steps of workflow plans still to run." in held


def test_a_lone_refund_counts_the_plans_approved_before_their_refunds_exist(agent: Any, order: Order) -> None:
    plan(agent, order, 1)
    plan(agent, order, 2)

    lone = action_propose_refund(
        order_number=order.number,
        request_number=3,
        amount="10.00",
        currency="EUR",
        reason_code="damaged",
        proposer=Actor.for_agent(agent),
    ).action

    assert lone.status == ActionStatus.PROPOSED
    assert not Approval.objects.filter(action=lone).exists()


def test_a_plan_counts_once_whether_its_refund_exists_or_not(agent: Any, order: Order) -> None:
    """Once the coordinator has created a plan's refund, with its own auto-approval, the plan's
    binding stops counting: the second plan on the order is the second auto-approval, not the third."""
    first = plan(agent, order, 1)
    workflow_advance(workflow_id=first.workflow_id)
    assert Approval.objects.filter(action__order=order, policy=ApprovalPolicy.AUTO).count() == 1

    assert plan(agent, order, 2).state == W.AUTHORIZED
    assert plan(agent, order, 3).state == W.PROPOSED


def test_the_agents_daily_cap_counts_its_plans_still_to_run(agent: Any, settings: Any) -> None:
    settings.AUTO_APPROVAL_AGENT_DAILY_AMOUNTS = {"EUR": Decimal("25.00")}
    orders = [make_order(captured="100.00") for _ in range(3)]
    for each in orders:
        make_request(each, 1)

    states = [plan(agent, each, 1).state for each in orders]

    assert states == [W.AUTHORIZED, W.AUTHORIZED, W.PROPOSED]


def test_an_approval_stamped_after_the_proposals_clock_still_counts(agent: Any, order: Order) -> None:
    """A proposal reads its clock, then waits for the order's lock while two others are approved
    and committed: their approvals are stamped after its clock, and it is still the third."""
    clock = timezone.now()
    for number in (1, 2):
        action_propose_refund(
            order_number=order.number,
            request_number=number,
            amount="10.00",
            currency="EUR",
            reason_code="damaged",
            proposer=Actor.for_agent(agent),
            now=clock,
        )
    late = workflow_propose(
        template="refund_with_notice",
        parameters=refund_parameters(order_number=order.number, request_number=3, amount="10.00", case="t-3"),
        proposer=Actor.for_agent(agent),
        now=clock - timedelta(milliseconds=5),
    ).workflow

    assert late.state == W.PROPOSED
