"""Reconciliation by real Celery workers: the beat sweep, and a worker killed mid-reconciliation.

The workers copy the console's timings from the test's settings when they start, so the sweeps
run every second and an UNKNOWN action is due about a second after it became UNKNOWN. The
receiver is the live sandbox, whose own ledger says how many refunds exist.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from actions.kinds.refund.proposal import action_propose_refund
from actions.models import Action, ActionEvent, ActionStatus, Order
from actions.services import Actor
from actions.tasks import sweep_reconcile
from tests.approvals.test_reservation import assert_order_money_adds_up
from tests.factories import make_order, make_request
from tests.processes import WorkerPool, wait_until
from tests.providers.sandbox_client import SandboxClient

pytestmark = [pytest.mark.postgres, pytest.mark.processes, pytest.mark.django_db(transaction=True)]

S = ActionStatus
DEADLINE_SECONDS = 30
LEASE_SECONDS = 4


@pytest.fixture(autouse=True)
def short_timings(settings: Any) -> None:
    """Set before any worker starts: workers read these from their environment."""
    settings.LEASE_SECONDS = LEASE_SECONDS
    settings.SWEEP_INTERVAL_SECONDS = 1
    settings.RECONCILE_BASE_BACKOFF_SECONDS = 1
    settings.PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS = 0


@pytest.fixture(autouse=True)
def beat_stopped_with_its_worker(workers: WorkerPool) -> Iterator[None]:
    """SIGTERM each worker before the pool's SIGKILL, so ``--beat``'s child process goes with it."""
    yield
    for worker in workers.workers:
        worker.stop()


def propose_auto_approved(sandbox: SandboxClient, proposer: Actor) -> Action:
    """Propose a refund the policy approves at once; its dispatch is published on commit."""
    order = make_order(captured="100.00")
    sandbox.seed_charge(order.charge_reference, 10000, "eur")
    request = make_request(order)
    action = action_propose_refund(
        order_number=order.number,
        request_number=request.number,
        amount="20.00",
        currency="EUR",
        reason_code="damaged",
        proposer=proposer,
    ).action
    assert action.status == S.AUTHORIZED
    return action


def in_status(action: Action, status: str) -> Action | None:
    return Action.objects.filter(pk=action.pk, status=status).first()


def assert_one_refund_recorded(sandbox: SandboxClient, action: Action) -> None:
    """Invariants 1, 2 and 5, from the receiver's ledger and the order's money."""
    action.refresh_from_db()
    refunds = [r for r in sandbox.ledger() if r["metadata"].get("action_id") == action.action_id]
    assert len(refunds) == 1, refunds
    assert action.status == S.SUCCEEDED
    assert action.provider_reference == refunds[0]["id"]
    assert action.attempt_count == 1, "found by reconciliation, never re-sent"
    events = list(ActionEvent.objects.filter(action=action).order_by("pk").values_list("transition", flat=True))
    assert events == ["propose", "approve", "begin_submission", "mark_unknown", "reconcile_found"]
    order = Order.objects.get(actions=action)
    assert (order.refunded_amount, order.reserved_amount) == (Decimal("20.00"), Decimal("0.00"))
    assert_order_money_adds_up(order)


def test_the_beat_sweep_reconciles_an_unknown_action_to_succeeded(
    workers: WorkerPool, live_sandbox: SandboxClient, agent_actor: Actor
) -> None:
    """Invariants 1, 2 and 8: the receiver committed and answered 500; nobody asks for a
    reconciliation, the periodic sweep alone finds the refund and records it, once."""
    live_sandbox.fault(mode="commit_then_500")
    workers.start(beat=True)

    action = propose_auto_approved(live_sandbox, agent_actor)

    wait_until(lambda: in_status(action, S.SUCCEEDED), timeout=DEADLINE_SECONDS, what="the sweep to reconcile it")
    assert_one_refund_recorded(live_sandbox, action)
    found = ActionEvent.objects.get(action=action, transition="reconcile_found")
    assert found.actor_label == "system:reconciler"


def test_a_worker_killed_mid_reconciliation_is_replaced_after_its_lease_without_a_second_refund(
    workers: WorkerPool, live_sandbox: SandboxClient, agent_actor: Actor
) -> None:
    """Invariants 1, 7 and 8: the reconciler dies between the receiver's answer and recording it;
    its lease keeps others off until it expires, then a fresh worker's sweep finishes the job with
    the refund that already exists."""
    live_sandbox.fault(mode="commit_then_500")
    doomed = workers.start(fault_points="during_reconciliation")
    action = propose_auto_approved(live_sandbox, agent_actor)
    unknown = wait_until(lambda: in_status(action, S.UNKNOWN), timeout=DEADLINE_SECONDS, what="UNKNOWN")
    wait_until(lambda: unknown.next_reconcile_at <= timezone.now(), interval=0.05, what="it to be due")

    sweep_reconcile.delay()  # what beat would publish

    wait_until(lambda: not doomed.alive, timeout=DEADLINE_SECONDS, what="the reconciler to die mid-way")
    assert doomed.process.returncode == -signal.SIGKILL
    abandoned = Action.objects.get(pk=action.pk)
    assert abandoned.status == S.UNKNOWN
    assert abandoned.lease_token is not None and abandoned.lease_expires_at is not None
    [lookup] = abandoned.attempts.filter(kind="lookup")
    assert lookup.finished_at is None, "the dead reconciler never recorded its answer"

    workers.start(beat=True)

    wait_until(lambda: in_status(action, S.SUCCEEDED), timeout=DEADLINE_SECONDS, what="a fresh worker to finish it")
    assert_one_refund_recorded(live_sandbox, action)
    found = ActionEvent.objects.get(action=action, transition="reconcile_found")
    assert found.created_at >= abandoned.lease_expires_at, "nobody took over before the lease expired"
    _, finished = action.attempts.filter(kind="lookup").order_by("pk")
    assert finished.held_lease is True and finished.outcome == "found"
