"""A dispatch publish lost between the approval's commit and the broker (docs/architecture.md section 6).

The approval commits, then its on-commit publish never reaches the broker (the process died,
the broker was down). Nothing is lost: the periodic AUTHORIZED sweep claims the row itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
import redis

from actions.kinds.refund.proposal import action_propose_refund
from actions.models import Action, ActionEvent, ActionStatus, Order
from actions.services import Actor
from approvals.services import approval_decide
from tests.approvals.test_reservation import assert_order_money_adds_up
from tests.factories import make_order, make_request
from tests.processes import WorkerPool, wait_until
from tests.providers.sandbox_client import SandboxClient

pytestmark = [pytest.mark.postgres, pytest.mark.processes, pytest.mark.django_db(transaction=True)]

S = ActionStatus


@pytest.fixture(autouse=True)
def short_timings(settings: Any) -> Iterator[None]:
    settings.SWEEP_INTERVAL_SECONDS = 1
    settings.LEASE_SECONDS = 4
    settings.PROVIDER_TIMEOUT_SECONDS = 1
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    yield


@pytest.fixture(autouse=True)
def beat_stopped_with_its_worker(workers: WorkerPool) -> Iterator[None]:
    """Stop every worker with SIGTERM before the pool's SIGKILL: ``--beat`` runs beat in a child
    process that a SIGKILLed worker leaves behind, still publishing sweeps to the broker."""
    yield
    for worker in workers.workers:
        worker.stop()


@pytest.fixture
def lost_publishes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The on-commit publish runs, and its message never reaches the broker."""
    lost: list[int] = []
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lost.append)
    return lost


def test_an_approval_whose_publish_was_lost_is_dispatched_by_the_authorized_sweep(
    workers: WorkerPool,
    live_sandbox: SandboxClient,
    broker_url: str,
    agent_actor: Actor,
    manager: Any,
    lost_publishes: list[int],
) -> None:
    """Invariants 1, 2 and 8: nothing is lost. A manager's approval whose dispatch message
    never reached the broker still ends SUCCEEDED, with exactly one refund at the sandbox."""
    order = make_order(captured="100.00")
    live_sandbox.seed_charge(order.charge_reference, 10000, "eur")
    request = make_request(order)
    proposal = action_propose_refund(
        order_number=order.number,
        request_number=request.number,
        amount="40.00",  # above the auto-approval threshold: a manager decides
        currency="EUR",
        reason_code="damaged",
        proposer=agent_actor,
    )
    assert proposal.action.status == S.PROPOSED

    approval_decide(action_pk=proposal.action.pk, user=manager, decision="approve")

    assert lost_publishes == [proposal.action.pk], "the publish ran on commit, and was lost"
    assert redis.Redis.from_url(broker_url).llen("console") == 0, "no message reached the broker"
    assert Action.objects.get(pk=proposal.action.pk).status == S.AUTHORIZED

    workers.start(beat=True)
    action = wait_until(
        lambda: Action.objects.filter(pk=proposal.action.pk, status=S.SUCCEEDED).first(),
        timeout=30,
        what="the AUTHORIZED sweep to dispatch the action",
    )

    [refund] = [r for r in live_sandbox.ledger() if r["metadata"].get("action_id") == action.action_id]
    assert action.provider_reference == refund["id"]
    assert refund["amount"] == 4000
    claim = ActionEvent.objects.get(action=action, transition="begin_submission")
    assert claim.actor_label == "system:dispatcher"
    assert_order_money_adds_up(order)
    order = Order.objects.get(pk=order.pk)
    assert (order.refunded_amount, order.reserved_amount) == (Decimal("40.00"), 0)
