"""What an auto-approved proposal reads (issue 18): each agent's webhook and each currency's caps
once per proposal, not once per event or per scope. The outbox row and the caps still apply: an
agent with a webhook gets a delivery for each state change, and an admin's cap row still wins."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from actions.models import ActionStatus, AgentWebhook, AgentWebhookDelivery
from actions.services import Actor, action_propose_refund
from approvals.models import AutoApprovalCap, CapScope
from tests.factories import make_order, make_request

pytestmark = pytest.mark.django_db
S = ActionStatus


@pytest.fixture(autouse=True)
def no_publish(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("actions.publish.dispatch_enqueue", lambda pk: None)


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
    assert reads_of(queries, "actions_agentwebhook") == 1
    assert reads_of(queries, "approvals_autoapprovalcap") == 1


def test_an_agent_with_a_webhook_still_gets_both_state_changes_of_one_proposal(agent_actor: Actor) -> None:
    assert agent_actor.agent is not None
    AgentWebhook.objects.create(agent=agent_actor.agent, url="https://hooks.example.test/console", secret="s" * 32)
    action = propose(agent_actor)
    types = sorted(AgentWebhookDelivery.objects.filter(action=action).values_list("event_type", flat=True))
    assert types == ["action.authorized", "action.proposed"]


def test_an_admins_cap_row_still_overrides_the_settings_for_its_scope_only(agent_actor: Actor) -> None:
    AutoApprovalCap.objects.create(scope=CapScope.AGENT, currency="EUR", max_amount=Decimal("15.00"), window_hours=24)
    assert propose(agent_actor).status == S.AUTHORIZED
    # 10 + 10 passes the agent's cap of 15; the per-order cap (settings) is not what held it.
    held = propose(agent_actor)
    assert held.status == S.PROPOSED
