"""What an auto-approved proposal reads: each agent's webhook and each currency's caps
once per proposal, not once per event or per scope. The outbox row and the caps still apply: an
agent with a webhook gets a delivery for each state change, and an admin's cap row still wins."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from actions.kinds.refund.proposal import action_propose_refund
from actions.models import ActionEvent, ActionStatus, AgentWebhook, AgentWebhookDelivery
from actions.services import Actor
from approvals.models import AutoApprovalCap, CapScope
from tests.factories import make_order, make_request

pytestmark = pytest.mark.django_db
S = ActionStatus


@pytest.fixture(autouse=True)
def no_publish(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)


def propose(proposer: Actor, amount: str = "10.00") -> Any:
    order = make_order(captured="100.00")
    request = make_request(order)
    return action_propose_refund(
        order_number=order.number,
        request_number=request.number,
        amount=amount,
        currency="EUR",
        reason_code="damaged",
        proposer=proposer,
    ).action


def reads_of(queries: CaptureQueriesContext, table: str) -> int:
    return sum(1 for q in queries.captured_queries if q["sql"].startswith("SELECT") and f'FROM "{table}"' in q["sql"])


def test_an_auto_approved_proposal_reads_the_agents_webhook_and_the_caps_once(agent_actor: Actor) -> None:
    with CaptureQueriesContext(connection) as queries:
        action = propose(agent_actor)
    assert action.status == S.AUTHORIZED
    # The webhook is read with the agent's lock (a join), once for both events.
    webhook_reads = [q["sql"] for q in queries.captured_queries if '"actions_agentwebhook"' in q["sql"]]
    assert len(webhook_reads) == 1, webhook_reads
    assert reads_of(queries, "approvals_autoapprovalcap") == 1


def test_an_agent_with_a_webhook_still_gets_both_state_changes_of_one_proposal(agent_actor: Actor) -> None:
    assert agent_actor.agent is not None
    AgentWebhook.objects.create(agent=agent_actor.agent, url="https://hooks.example.test/console", secret="s" * 32)
    action = propose(agent_actor)
    types = sorted(AgentWebhookDelivery.objects.filter(action=action).values_list("event_type", flat=True))
    assert types == ["action.authorized", "action.proposed"]


def test_an_agents_inactive_webhook_gets_nothing(agent_actor: Actor) -> None:
    assert agent_actor.agent is not None
    AgentWebhook.objects.create(
        agent=agent_actor.agent, url="https://hooks.example.test/console", secret="s" * 32, is_active=False
    )
    action = propose(agent_actor)
    assert action.status == S.AUTHORIZED
    assert not AgentWebhookDelivery.objects.filter(action=action).exists()


def test_an_admins_cap_row_still_overrides_the_settings_for_its_scope_only(agent_actor: Actor) -> None:
    AutoApprovalCap.objects.create(scope=CapScope.AGENT, currency="EUR", max_amount=Decimal("15.00"), window_hours=24)
    assert propose(agent_actor).status == S.AUTHORIZED
    # 10 + 10 passes the agent's cap of 15 (each on an order of its own, far under the per-order
    # cap of the settings): the agent's row is what holds it, and the hold says so.
    held = propose(agent_actor)
    assert held.status == S.PROPOSED
    reasons = " ".join(ActionEvent.objects.filter(action=held).values_list("reason", flat=True))
    assert "cap for this agent" in reasons and "15.00 EUR" in reasons


def test_an_admins_agent_cap_row_does_not_cap_an_order(agent_actor: Actor) -> None:
    """The agent scope's row applies to the agent only: two refunds on one order under the
    settings' per-order cap (EUR 50, two approvals) are both approved although the agent's row
    is lower than their sum would be on the order."""
    AutoApprovalCap.objects.create(scope=CapScope.AGENT, currency="EUR", max_amount=Decimal("100.00"), window_hours=24)
    AutoApprovalCap.objects.create(scope=CapScope.TARGET, currency="EUR", max_amount=Decimal("15.00"), window_hours=24)
    order = make_order(captured="100.00")
    first, second = make_request(order), make_request(order)
    statuses = [
        action_propose_refund(
            order_number=order.number,
            request_number=request.number,
            amount="10.00",
            currency="EUR",
            reason_code="damaged",
            proposer=agent_actor,
        ).action.status
        for request in (first, second)
    ]
    # The target's row (15) holds the second on this order; the agent's (100) would not have.
    assert statuses == [S.AUTHORIZED, S.PROPOSED]
