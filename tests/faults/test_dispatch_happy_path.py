from __future__ import annotations

from typing import Any

import pytest

from actions.kinds.refund.proposal import action_propose_refund
from actions.models import Action, ActionStatus
from tests.factories import make_order, make_request
from tests.processes import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.processes, pytest.mark.django_db(transaction=True)]


def test_an_auto_approved_refund_reaches_succeeded_through_a_real_worker(
    workers: Any, live_sandbox: Any, agent_actor: Any
) -> None:
    """Invariants 1, 2 and 5: one approved action, one refund at the sandbox, money adds up."""
    order = make_order(captured="100.00")
    live_sandbox.seed_charge(order.charge_reference, 10000, "eur")
    request = make_request(order)
    workers.start()

    result = action_propose_refund(
        order_number=order.number,
        request_number=request.number,
        amount="20.00",
        currency="EUR",
        reason_code="damaged",
        proposer=agent_actor,
    )
    assert result.action.status == ActionStatus.AUTHORIZED

    action = wait_until(
        lambda: Action.objects.filter(pk=result.action.pk, status=ActionStatus.SUCCEEDED).first(),
        what="the action to succeed",
    )
    refunds = [r for r in live_sandbox.ledger() if r["metadata"].get("action_id") == action.action_id]
    assert len(refunds) == 1
    assert action.provider_reference == refunds[0]["id"]
    order.refresh_from_db()
    assert (order.refunded_amount, order.reserved_amount) == (20, 0)
