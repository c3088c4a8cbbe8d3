"""The crash-window matrix with batched claims and many calls in flight.

A real dispatcher process (``manage.py dispatcher``) claims a batch of refunds in one transaction
and sends them all at once; it is SIGKILLed in each window while the other calls of its batch
are in flight, crossed with the provider outcomes that matter. Then a fresh Celery worker with
beat (the lease sweep, reconciliation) and a fresh dispatcher drain everything, and each refund
must exist exactly once at the sandbox, recorded, with ``audit_effects`` clean.

Windows: before the provider call, after the provider answered and before recording, during
reconciliation (the dispatcher leaves its batch unrecorded, then a reconciler dies), and after
recording and before the next claim.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command

from actions.kinds.refund.proposal import action_propose_refund
from actions.models import Action, ActionStatus
from tests.factories import make_order, make_request
from tests.processes import WorkerPool, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.processes, pytest.mark.django_db(transaction=True)]

WINDOWS = ["before_provider_call", "after_provider_answer", "during_reconciliation", "after_record"]
OUTCOMES = ["success", "500_after_commit", "timeout_after_commit"]
BATCH = 4


@pytest.fixture
def fast_policy(settings: Any, workers: WorkerPool) -> None:
    # Short leases and sweeps so that each cell drains in seconds; copied into the workers.
    settings.LEASE_SECONDS = 4
    settings.SWEEP_INTERVAL_SECONDS = 1
    settings.PROVIDER_TIMEOUT_SECONDS = 1
    settings.RECONCILE_BASE_BACKOFF_SECONDS = 1
    settings.PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS = 0
    # The dispatcher finds AUTHORIZED actions itself: no Celery dispatch per action, here or in
    # the workers (a re-decision by the policy in a worker would publish one).
    settings.DISPATCH_PUBLISH = False
    workers.extra_env["DISPATCH_PUBLISH"] = "0"


@pytest.mark.parametrize("outcome", OUTCOMES)
@pytest.mark.parametrize("window", WINDOWS)
def test_a_dispatcher_killed_with_a_batch_in_flight_leaves_one_effect_each_and_a_clean_audit(
    window: str, outcome: str, workers: WorkerPool, live_sandbox: Any, agent_actor: Any, fast_policy: None, finance: Any
) -> None:
    """Invariants 1, 2, 3, 5 and 8 with batching and concurrency on: whatever window the
    dispatcher dies in, with the rest of its batch in flight, and whatever the provider
    answered, every refund of the batch ends with exactly one effect and audit_effects passes."""
    actions = []
    for _ in range(BATCH):
        order = make_order(captured="100.00")
        live_sandbox.seed_charge(order.charge_reference, 10000, "eur")
        request = make_request(order)
        action_id = f"refund:order-{order.number}:request-{request.number}"
        if outcome == "500_after_commit":
            live_sandbox.fault(mode="commit_then_500", action_id=action_id)
        elif outcome == "timeout_after_commit":
            live_sandbox.fault(mode="commit_then_timeout", action_id=action_id, sleep_seconds=2)
        action = action_propose_refund(
            order_number=order.number,
            request_number=request.number,
            amount="20.00",
            currency="EUR",
            reason_code="damaged",
            proposer=agent_actor,
        ).action
        assert action.status == ActionStatus.AUTHORIZED
        actions.append(action)

    first_fault = "after_provider_answer" if window == "during_reconciliation" else window
    first = workers.start_dispatcher(fault_points=first_fault, concurrency=BATCH, batch=BATCH)
    first.wait_killed_at_fault_point()
    # The whole batch was claimed in one transaction before the first call.
    claimed = Action.objects.filter(pk__in=[a.pk for a in actions]).exclude(status=ActionStatus.AUTHORIZED).count()
    assert claimed == BATCH, f"{claimed} of {BATCH} claimed when the dispatcher died"
    if window == "during_reconciliation":
        reconciler = workers.start(fault_points="during_reconciliation", beat=True)
        reconciler.wait_killed_at_fault_point()

    workers.start(beat=True)
    workers.start_dispatcher()
    pks = [a.pk for a in actions]
    wait_until(
        lambda: Action.objects.filter(pk__in=pks, status=ActionStatus.SUCCEEDED).count() == BATCH,
        timeout=90,
        what=f"the batch to drain after a kill {window} with {outcome}",
    )

    ledger = live_sandbox.ledger()
    for action in Action.objects.filter(pk__in=pks):
        refunds = [r for r in ledger if r["metadata"].get("action_id") == action.action_id]
        assert len(refunds) == 1, f"{len(refunds)} refunds at the sandbox for {action.action_id}"
        assert action.provider_reference == refunds[0]["id"]
    # The independent audit: at most one effect, exactly one for SUCCEEDED, money adds up,
    # nothing stuck. It exits non-zero on any violation.
    call_command("audit_effects")
