"""The crash-window matrix: a real worker SIGKILLed in each window, crossed with the provider
outcomes that matter, then a fresh worker drains and ``audit_effects`` must pass.

Windows (named fault points in actions/execution.py and actions/reconciliation.py):
- before the provider call;
- after the provider committed, before recording;
- during reconciliation (the action is first left unrecorded, then the reconciler dies);
- after recording success, before the ack.

Outcomes (sandbox faults): success, a 500 after commit, a timeout after commit.
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
FINAL = {ActionStatus.SUCCEEDED, ActionStatus.FAILED_FINAL, ActionStatus.NEEDS_REVIEW}


@pytest.fixture
def fast_policy(settings: Any) -> None:
    # Short leases and sweeps so that each cell drains in seconds; copied into the workers.
    settings.LEASE_SECONDS = 3
    settings.SWEEP_INTERVAL_SECONDS = 1
    settings.PROVIDER_TIMEOUT_SECONDS = 1
    settings.RECONCILE_BASE_BACKOFF_SECONDS = 1
    settings.PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS = 0


def _wait_dead(worker: Any) -> None:
    wait_until(lambda: not worker.alive, timeout=30, what=f"worker {worker.name} to die at its fault point")
    assert worker.process.returncode == -9, f"the worker exited with {worker.process.returncode}, not SIGKILL"


@pytest.mark.parametrize("outcome", OUTCOMES)
@pytest.mark.parametrize("window", WINDOWS)
def test_a_worker_killed_in_any_window_leaves_one_effect_and_a_clean_audit(
    window: str, outcome: str, workers: WorkerPool, live_sandbox: Any, agent_actor: Any, fast_policy: None, finance: Any
) -> None:
    """Invariants 1, 2, 3, 5 and 8: whatever window the worker dies in, and whatever the provider
    answered, a fresh worker drains the action to one effect and audit_effects passes."""
    order = make_order(captured="100.00")
    live_sandbox.seed_charge(order.charge_reference, 10000, "eur")
    request = make_request(order)
    action_id = f"refund:order-{order.number}:request-{request.number}"
    if outcome == "500_after_commit":
        live_sandbox.fault(mode="commit_then_500", action_id=action_id)
    elif outcome == "timeout_after_commit":
        live_sandbox.fault(mode="commit_then_timeout", action_id=action_id, sleep_seconds=2)

    if window == "during_reconciliation":
        # First leave the action unrecorded (the worker dies after the provider answered), then
        # let a reconciler take it and die mid-lookup.
        first = workers.start(fault_points="after_provider_answer")
    else:
        first = workers.start(fault_points=window)

    action = action_propose_refund(
        order_number=order.number,
        request_number=request.number,
        amount="20.00",
        currency="EUR",
        reason_code="damaged",
        proposer=agent_actor,
    ).action

    # after_record with an ambiguous answer: UNKNOWN is recorded, then the worker dies; the
    # fresh worker's reconciler finds the refund.
    _wait_dead(first)
    if window == "during_reconciliation":
        reconciler = workers.start(fault_points="during_reconciliation", beat=True)
        _wait_dead(reconciler)

    workers.start(beat=True)
    final = wait_until(
        lambda: Action.objects.filter(pk=action.pk, status__in=FINAL).first(),
        timeout=60,
        what=f"the action to drain after a kill {window} with {outcome}",
    )

    refunds = [r for r in live_sandbox.ledger() if r["metadata"].get("action_id") == action.action_id]
    assert len(refunds) == 1, f"{len(refunds)} refunds at the sandbox"
    assert final.status == ActionStatus.SUCCEEDED
    assert final.provider_reference == refunds[0]["id"]
    # The independent audit: at most one effect, exactly one for SUCCEEDED, money adds up,
    # nothing stuck. It exits non-zero on any violation.
    call_command("audit_effects")
