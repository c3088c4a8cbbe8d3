"""A real worker killed inside the invalidation: the fresh worker drives the action on.

A defect once found here: a worker killed between STALE and the policy's new decision left a small
refund waiting for a manager for ever. The re-decision now shares the invalidation's
transaction, so a kill at ``during_invalidation`` (after the STALE transition, before the
re-decision, inside the transaction) rolls both back: the action is still AUTHORIZED, and the
AUTHORIZED sweep of a fresh worker claims it, invalidates it and lets the policy decide again.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings

from actions.engine.invariants import check_effects
from actions.foundation.publish import dispatch_enqueue
from actions.kinds.refund.contract import RefundReceiver, provider_from_settings
from actions.kinds.refund.proposal import action_propose_refund
from actions.models import Action, ActionStatus, Order
from actions.provider_events.services import webhook_receive
from actions.services import Actor
from approvals.models import Approval, ApprovalPolicy, Decision
from harness.sandboxes.payment.webhooks import sign
from tests.factories import make_order, make_request
from tests.processes import WorkerPool, wait_until
from tests.providers.sandbox_client import SandboxClient

pytestmark = [pytest.mark.postgres, pytest.mark.processes, pytest.mark.django_db(transaction=True)]

S = ActionStatus


@pytest.fixture(autouse=True)
def short_timings(settings: Any) -> Iterator[None]:
    settings.LEASE_SECONDS = 4
    settings.SWEEP_INTERVAL_SECONDS = 1
    settings.PROVIDER_TIMEOUT_SECONDS = 1
    settings.RECONCILE_BASE_BACKOFF_SECONDS = 1
    settings.PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS = 0
    yield


@pytest.fixture(autouse=True)
def beat_stopped_with_its_worker(workers: WorkerPool) -> Iterator[None]:
    yield
    for worker in workers.workers:
        worker.stop()


def outside_refund(order: Order, amount_minor: int) -> None:
    """The order changes under the approval: a refund made at the provider, told by webhook."""
    body = json.dumps(
        {
            "id": f"evt_outside_{order.pk}",
            "type": "refund.created",
            "data": {
                "object": {
                    "id": f"re_outside_{order.pk}",
                    "object": "refund",
                    "amount": amount_minor,
                    "charge": order.charge_reference,
                    "currency": "eur",
                    "metadata": {},
                    "status": "succeeded",
                }
            },
        }
    ).encode()
    webhook_receive(payload=body, signature=sign(body, settings.PROVIDER_WEBHOOK_SECRET, int(time.time())))


def test_a_worker_killed_inside_the_invalidation_leaves_no_policy_action_stale(
    workers: WorkerPool, live_sandbox: SandboxClient, agent_actor: Actor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant 8: nothing is left without a way forward. The kill rolls back the STALE with
    the re-decision; the fresh worker's sweep claims the action, the policy decides again
    against the changed order, and the refund is made once (invariant 1)."""
    order = make_order(captured="100.00")
    live_sandbox.seed_charge(order.charge_reference, 10000, "eur")
    # The dispatch is held back until the doomed worker is up, so it is the one that claims.
    held: list[int] = []
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", held.append)
    action = action_propose_refund(
        order_number=order.number,
        request_number=make_request(order).number,
        amount="20.00",
        currency="EUR",
        reason_code="damaged",
        proposer=agent_actor,
    ).action
    assert action.status == S.AUTHORIZED, "auto-approved"
    outside_refund(order, 3000)
    assert held == [action.pk]

    doomed = workers.start(fault_points="during_invalidation")
    monkeypatch.undo()
    dispatch_enqueue(action.pk)
    wait_until(lambda: not doomed.alive, timeout=45, what="the worker to kill itself inside the invalidation")
    assert doomed.process.returncode == -signal.SIGKILL
    action.refresh_from_db()
    assert action.status == S.AUTHORIZED, "the STALE transition died with its transaction"
    assert not action.events.filter(transition="invalidate").exists()
    assert live_sandbox.ledger() == []

    workers.start(beat=True)
    wait_until(
        lambda: Action.objects.get(pk=action.pk).status == S.SUCCEEDED, timeout=60, what="the fresh worker to drive it"
    )

    transitions = list(action.events.values_list("transition", "to_state"))
    assert ("invalidate", "STALE") in transitions
    assert transitions[transitions.index(("invalidate", "STALE")) + 1] == ("reopen", "PROPOSED")
    approvals = list(Approval.objects.filter(action=action, decision=Decision.APPROVE).order_by("pk"))
    assert [a.policy for a in approvals] == [ApprovalPolicy.AUTO, ApprovalPolicy.AUTO]
    order.refresh_from_db()
    assert approvals[1].order_version != approvals[0].order_version
    refunds = [r for r in live_sandbox.ledger() if r["metadata"].get("action_id") == action.action_id]
    assert len(refunds) == 1
    provider_from_settings.cache_clear()
    report = check_effects(ledger=list(RefundReceiver(provider_from_settings()).ledger()))
    assert [v for v in report.violations if v.invariant in (5, 8)] == []
