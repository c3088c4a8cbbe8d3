"""A real worker killed at each fault point (docs/architecture.md section 9), then a fresh worker recovers.

The doomed worker runs with ``CONSOLE_FAULT_POINTS=<point>`` and SIGKILLs itself at that
instant. Its dispatch message was not acknowledged (acks_late), so the broker would hand it to
another worker once its visibility timeout passes; the test does that redelivery at once, with
kombu's own restore, instead of waiting for the timeout. The fresh worker runs without fault
points and with beat, so the lease sweep and the reconciliation sweep run as in production.

Whatever the instant, the sandbox's own ledger ends with exactly one refund for the action, the
action ends SUCCEEDED with that refund's reference, and the order's money adds up.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
import redis
from django.utils import timezone
from kombu import Connection

from actions.kinds.refund.proposal import action_propose_refund
from actions.models import Action, ActionStatus, Attempt, AttemptKind, Order
from actions.services import Actor
from tests.approvals.test_reservation import assert_order_money_adds_up
from tests.factories import make_order, make_request
from tests.processes import WorkerPool, wait_until
from tests.providers.sandbox_client import SandboxClient

pytestmark = [pytest.mark.postgres, pytest.mark.processes, pytest.mark.django_db(transaction=True)]

S = ActionStatus
DRAIN_SECONDS = 45


@pytest.fixture(autouse=True)
def short_timings(settings: Any) -> Iterator[None]:
    """Short leases and sweeps, set before any worker starts (workers copy them)."""
    settings.LEASE_SECONDS = 4
    settings.SWEEP_INTERVAL_SECONDS = 1
    settings.PROVIDER_TIMEOUT_SECONDS = 1
    settings.RECONCILE_BASE_BACKOFF_SECONDS = 1
    settings.PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS = 0
    yield


@pytest.fixture(autouse=True)
def beat_stopped_with_its_worker(workers: WorkerPool) -> Iterator[None]:
    """Stop every worker with SIGTERM before the pool's SIGKILL: ``--beat`` runs beat in a child
    process that a SIGKILLed worker leaves behind, still publishing sweeps to the broker."""
    yield
    for worker in workers.workers:
        worker.stop()


def propose_auto_approved(*, sandbox: SandboxClient, proposer: Actor) -> Action:
    order = make_order(captured="100.00")
    sandbox.seed_charge(order.charge_reference, 10000, "eur")
    request = make_request(order)
    result = action_propose_refund(
        order_number=order.number,
        request_number=request.number,
        amount="20.00",
        currency="EUR",
        reason_code="damaged",
        proposer=proposer,
    )
    assert result.action.status == S.AUTHORIZED, "auto-approved: its dispatch is published on commit"
    return result.action


def refunds_for(sandbox: SandboxClient, action: Action) -> list[dict[str, Any]]:
    return [r for r in sandbox.ledger() if r["metadata"].get("action_id") == action.action_id]


def unacknowledged_messages(broker_url: str) -> int:
    return int(redis.Redis.from_url(broker_url).hlen("unacked"))


def redeliver_unacknowledged(broker_url: str) -> None:
    """What the broker does once the visibility timeout has passed, without waiting for it."""
    with Connection(broker_url, transport_options={"visibility_timeout": 0}) as connection:
        connection.default_channel.qos.restore_visible(num=100)


def dispatch_results(log: str) -> list[str]:
    """The return values of the dispatch tasks a worker finished, from its log."""
    return [
        line.rsplit(": ", 1)[-1].strip("'")
        for line in log.splitlines()
        if "Task actions.tasks.dispatch[" in line and " succeeded in " in line
    ]


# What the doomed worker left behind at each instant: the action's status, and how many
# refunds the sandbox had stored.
LEFT_BEHIND = {
    "before_provider_call": (S.SUBMITTING, 0),
    "after_provider_answer": (S.SUBMITTING, 1),
    "after_record": (S.SUCCEEDED, 1),
}


@pytest.mark.parametrize("point", list(LEFT_BEHIND))
def test_a_worker_killed_at_a_fault_point_is_recovered_by_a_fresh_worker_without_a_second_refund(
    point: str, workers: WorkerPool, live_sandbox: SandboxClient, broker_url: str, agent_actor: Actor
) -> None:
    """Invariants 1, 2, 3 and 5: whatever instant a worker dies at, one approved action causes
    at most one refund; the action ends SUCCEEDED with that refund's reference; the redelivered
    dispatch message finds nothing left to do; the order's money adds up."""
    doomed = workers.start(fault_points=point)
    action = propose_auto_approved(sandbox=live_sandbox, proposer=agent_actor)

    wait_until(lambda: not doomed.alive, timeout=DRAIN_SECONDS, what=f"the worker to kill itself at {point}")
    assert doomed.process.returncode == -signal.SIGKILL
    status_at_death, refunds_at_death = LEFT_BEHIND[point]
    assert Action.objects.get(pk=action.pk).status == status_at_death
    assert len(refunds_for(live_sandbox, action)) == refunds_at_death
    assert unacknowledged_messages(broker_url) == 1, "the dying worker had not acknowledged its message"

    redeliver_unacknowledged(broker_url)
    fresh = workers.start(beat=True)
    final = wait_until(
        lambda: Action.objects.filter(pk=action.pk, status=S.SUCCEEDED).first(),
        timeout=DRAIN_SECONDS,
        what="the fresh worker to bring the action to SUCCEEDED",
    )
    wait_until(lambda: dispatch_results(fresh.log()), timeout=DRAIN_SECONDS, what="the redelivered dispatch")
    assert dispatch_results(fresh.log()) == ["taken"], "the redelivered dispatch must find nothing to do"

    [refund] = refunds_for(live_sandbox, action)
    assert final.provider_reference == refund["id"]
    assert refund["amount"] == 2000
    assert_order_money_adds_up(final.order)
    order = Order.objects.get(pk=final.order_id)
    assert (order.refunded_amount, order.reserved_amount) == (Decimal("20.00"), 0)
    [charge] = [c for c in live_sandbox.control("GET", "ledger")["charges"] if c["id"] == order.charge_reference]
    assert charge["amount_refunded"] == 2000

    transitions = list(final.events.values_list("transition", flat=True))
    assert transitions.count("begin_submission") == 1
    submissions = Attempt.objects.filter(action=final, kind=AttemptKind.SUBMIT).order_by("started_at", "pk")
    if point == "after_record":
        # Recorded before the kill: nothing for the lease sweep or the reconciler to do.
        assert "mark_unknown" not in transitions
        assert submissions.count() == 1
    else:
        # The lease expired with no outcome: UNKNOWN first (never straight to a retry), then the
        # reconciler asked the sandbox before anything else.
        assert "mark_unknown" in transitions
        assert Attempt.objects.filter(action=final, kind=AttemptKind.LOOKUP).exists()
        assert submissions[0].finished_at is None, "the doomed worker never recorded its attempt"
    if point == "before_provider_call":
        # Authoritatively not found, inside key retention: one retry with the same key.
        assert transitions.count("retry") == 1
        assert [a.idempotency_key for a in submissions] == [action.idempotency_key] * 2
    if point == "after_provider_answer":
        # Found by the action id in the sandbox's metadata: recorded, no retry.
        assert "retry" not in transitions
        assert transitions[-1] == "reconcile_found"


def test_a_worker_killed_during_reconciliation_leaves_the_action_to_the_next_reconciler(
    workers: WorkerPool, live_sandbox: SandboxClient, broker_url: str, agent_actor: Actor
) -> None:
    """Invariants 1, 7 and 8: a reconciler that dies between the receiver's answer and the
    record holds a lease that expires; the next reconciler asks the receiver again and records
    the one refund, without resending the request."""
    from actions.tasks import reconcile

    live_sandbox.fault(mode="commit_then_500")  # the refund is stored, the answer is lost
    doomed = workers.start(fault_points="during_reconciliation")
    action = propose_auto_approved(sandbox=live_sandbox, proposer=agent_actor)
    unknown = wait_until(
        lambda: Action.objects.filter(pk=action.pk, status=S.UNKNOWN).first(),
        what="the 500 after commit to leave the action UNKNOWN",
    )
    assert unknown.next_reconcile_at is not None
    wait_until(lambda: timezone.now() > unknown.next_reconcile_at, what="the reconciliation to be due")

    reconcile.delay(action.pk)
    wait_until(lambda: not doomed.alive, timeout=DRAIN_SECONDS, what="the worker to kill itself mid-reconciliation")
    assert doomed.process.returncode == -signal.SIGKILL
    [lookup] = Attempt.objects.filter(action=action, kind=AttemptKind.LOOKUP)
    assert lookup.finished_at is None, "the doomed reconciler never recorded its lookup"
    assert Action.objects.get(pk=action.pk).status == S.UNKNOWN

    redeliver_unacknowledged(broker_url)
    workers.start(beat=True)
    final = wait_until(
        lambda: Action.objects.filter(pk=action.pk, status=S.SUCCEEDED).first(),
        timeout=DRAIN_SECONDS,
        what="the next reconciler to record the refund",
    )

    [refund] = refunds_for(live_sandbox, action)
    assert final.provider_reference == refund["id"]
    assert Attempt.objects.filter(action=final, kind=AttemptKind.SUBMIT).count() == 1, "found, never resent"
    assert list(final.events.values_list("transition", flat=True))[-1] == "reconcile_found"
    assert_order_money_adds_up(final.order)
