"""Shared builders for the tests of the security review's findings: each test replays an attack."""

from __future__ import annotations

from typing import Any

import pytest

from actions.kinds.refund.proposal import action_propose_refund
from actions.models import Action, Order
from actions.services import Actor
from tests.factories import make_order, make_request


@pytest.fixture(autouse=True)
def published(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", calls.append)
    return calls


def propose(proposer: Actor, *, amount: str = "120.00", order: Order | None = None, **extra: Any) -> Action:
    """Propose a refund as ``proposer`` on a new request (a new order unless one is given)."""
    order = order or make_order(captured="1000.00")
    request = make_request(order)
    return action_propose_refund(
        order_number=order.number,
        request_number=request.number,
        amount=amount,
        currency=order.currency,
        reason_code="damaged",
        evidence=extra.get("evidence", "Photos on the ticket."),
        proposer=proposer,
    ).action
