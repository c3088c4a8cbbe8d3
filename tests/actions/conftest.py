"""Fixtures shared by the tests of the intent log: an order with a refund request, a proposal
builder with sensible defaults, and a recorder standing in for the dispatch publisher."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from actions.kinds.refund.proposal import action_propose_refund
from actions.models import Action, ActionEvent, Order, RefundRequest
from actions.services import Actor, ProposalResult
from approvals.models import Approval
from tests.factories import make_order, make_request


@pytest.fixture
def dispatched(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The action pks whose dispatch was published, instead of publishing to the broker.

    The approval service imports ``dispatch_enqueue`` at call time, so replacing the module
    attribute is enough. The dispatcher itself belongs to another part of the code base.
    """
    calls: list[int] = []
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", calls.append)
    return calls


@pytest.fixture
def order(db: Any) -> Order:
    """A EUR order of 100.00 paid two days ago, with refund request 1."""
    order = make_order(number="4821", currency="EUR", captured="100.00")
    make_request(order, 1)
    return order


@pytest.fixture
def refund_request(order: Order) -> RefundRequest:
    return RefundRequest.objects.get(order=order, number=1)


@pytest.fixture
def propose(order: Order, agent_actor: Actor, dispatched: list[int]) -> Callable[..., ProposalResult]:
    """Propose a refund of request 1 on ``order`` as the support agent; keywords override."""

    def _propose(**overrides: Any) -> ProposalResult:
        arguments: dict[str, Any] = {
            "order_number": order.number,
            "request_number": 1,
            "amount": "40.00",
            "currency": "EUR",
            "reason_code": "damaged",
            "evidence": "Photo of the broken mug in ticket 991.",
            "proposer": agent_actor,
        }
        arguments.update(overrides)
        return action_propose_refund(**arguments)

    return _propose


@pytest.fixture
def row_counts(db: Any) -> Callable[[], dict[str, int]]:
    """Count the rows the proposal service could have written, by table."""

    def _counts() -> dict[str, int]:
        return {
            "actions": Action.objects.count(),
            "events": ActionEvent.objects.count(),
            "approvals": Approval.objects.count(),
        }

    return _counts
