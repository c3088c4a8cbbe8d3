"""Auto-approvals at once on one order, on PostgreSQL with one connection per thread.

The cap on autonomy per order (at most AUTO_APPROVAL_TARGET_MAX_COUNT auto-approvals, 2 by
default) holds however the proposals arrive. The order is locked while each one is weighed
against the cap, and every approval committed before the lock was granted counts, even one
stamped a moment after the waiting proposal's own clock. A plan the policy approved counts
before the coordinator has created its refund.

Three ``refund_with_notice`` plans posted together were answered AUTHORIZED all three; now two
are, and the third waits for a manager, its answer naming the cap, with no approval and no
action written for it. Three lone refunds proposed together: two are auto-approved.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from actions.agents.services import agent_token_issue
from actions.kinds.refund.proposal import action_propose_refund
from actions.models import Action, ActionStatus, Order, Workflow, WorkflowState
from actions.services import Actor
from approvals.models import WorkflowApproval
from tests.factories import make_agent, make_order, make_request, make_user
from tests.threads import run_at_once
from tests.workflows.conftest import refund_parameters

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

W = WorkflowState
ROUNDS = 6  # a fresh order each round, so that more than one interleaving is likely
PLANS = 3


@pytest.fixture(autouse=True)
def no_publish(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)
    monkeypatch.setattr("actions.foundation.publish.workflow_advance_enqueue", lambda workflow_id: None)


@pytest.fixture
def agent(transactional_db: Any) -> Any:
    agent = make_agent(make_user("otto.owner", "agent"))
    assert agent.owner.pk is not None  # loaded here, so the threads never lazy-load it
    return agent


@pytest.fixture
def token(agent: Any) -> str:
    return agent_token_issue(agent=agent, label="test").plain


def order_with_requests(number: str) -> Order:
    order = make_order(number=number, captured="100.00")
    for request_number in range(1, PLANS + 1):
        make_request(order, request_number)
    return order


def propose_plan(token: str, order: Order, request_number: int) -> Any:
    body = {
        "template": "refund_with_notice",
        "parameters": refund_parameters(
            order_number=order.number, request_number=request_number, amount="10.00", case=f"ticket-{request_number}"
        ),
    }
    # A client per call: each thread sends its own request, on its own connection.
    return Client().post(
        "/api/v1/workflows", data=body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )


def test_three_plans_at_once_on_one_order_authorize_two_and_leave_the_third_to_a_manager(token: str) -> None:
    for round_number in range(ROUNDS):
        order = order_with_requests(f"48{round_number:02d}")

        responses = run_at_once(*(lambda n=n, order=order: propose_plan(token, order, n) for n in range(1, PLANS + 1)))

        assert [response.status_code for response in responses] == [201] * PLANS, [r.content for r in responses]
        answers = [response.json() for response in responses]
        states = sorted(answer["state"] for answer in answers)
        assert states == [W.AUTHORIZED, W.AUTHORIZED, W.PROPOSED], answers
        held = next(answer for answer in answers if answer["state"] == W.PROPOSED)
        # The answer names the cap and the order, so the agent is not told it will run.
        assert f"Auto-approval cap for order {order.number} reached" in held["next"], held
        assert "at most 2" in held["next"], held
        # Nothing of an approval was written for the held plan: no plan approval, no child.
        workflow = Workflow.objects.get(workflow_id=held["workflow_id"])
        assert workflow.state == W.PROPOSED
        assert not WorkflowApproval.objects.filter(workflow=workflow).exists()
        assert not Action.objects.filter(action_id__startswith=workflow.workflow_id).exists()
        assert WorkflowApproval.objects.filter(workflow__parameters__order_number=order.number).count() == 2


def test_three_lone_refunds_at_once_on_one_order_auto_approve_two(agent: Any) -> None:
    for round_number in range(ROUNDS):
        order = order_with_requests(f"49{round_number:02d}")

        actions = run_at_once(
            *(
                lambda n=n, order=order: (
                    action_propose_refund(
                        order_number=order.number,
                        request_number=n,
                        amount="10.00",
                        currency="EUR",
                        reason_code="damaged",
                        proposer=Actor.for_agent(agent),
                    ).action
                )
                for n in range(1, PLANS + 1)
            )
        )

        statuses = sorted(action.status for action in actions)
        assert statuses == [ActionStatus.AUTHORIZED, ActionStatus.AUTHORIZED, ActionStatus.PROPOSED]
        held = next(action for action in actions if action.status == ActionStatus.PROPOSED)
        reason = held.events.get(transition="auto_approval_held").reason
        assert f"Auto-approval cap for order {order.number} reached: 2 refunds" in reason
