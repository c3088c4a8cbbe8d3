"""Invoice adjustments under crashes: the seed's test, and the kind's cells of the crash matrix.

A real Celery worker is SIGKILLed at a named fault point, a fresh worker drains the action,
and both systems are inspected: the console's records and the accounting sandbox's own ledger.

Windows: before the call to the accounting system; after it answered, before recording; during
reconciliation; after recording, before the task is acknowledged. Outcomes (sandbox faults):
success, a 500 after commit, a timeout after commit.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.core.management import call_command

from actions.kinds.invoice_adjustment.proposal import action_propose_invoice_adjustment
from actions.models import Action, ActionStatus, Bill
from tests.factories import make_adjustment_request, make_bill
from tests.processes import WorkerPool, wait_until
from tests.providers.accounting_client import AccountingSandboxClient

pytestmark = [pytest.mark.postgres, pytest.mark.processes, pytest.mark.django_db(transaction=True)]

WINDOWS = ["before_provider_call", "after_provider_answer", "during_reconciliation", "after_record"]
OUTCOMES = ["success", "500_after_commit", "timeout_after_commit"]
FINAL = {ActionStatus.SUCCEEDED, ActionStatus.FAILED_FINAL, ActionStatus.NEEDS_REVIEW}
AMOUNT = Decimal("20.00")


@pytest.fixture
def fast_policy(settings: Any, live_sandbox: Any) -> None:
    # Short leases and sweeps so that each cell drains in seconds; copied into the workers.
    settings.LEASE_SECONDS = 3
    settings.SWEEP_INTERVAL_SECONDS = 1
    settings.PROVIDER_TIMEOUT_SECONDS = 1
    settings.ACCOUNTING_TIMEOUT_SECONDS = 1
    settings.RECONCILE_BASE_BACKOFF_SECONDS = 1
    settings.PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS = 0
    settings.ACCOUNTING_LOOKUP_VISIBILITY_DELAY_SECONDS = 0


def _wait_dead(worker: Any) -> None:
    wait_until(lambda: not worker.alive, timeout=30, what=f"worker {worker.name} to die at its fault point")
    assert worker.process.returncode == -9, f"the worker exited with {worker.process.returncode}, not SIGKILL"


def _bill_in_both_systems(sandbox: AccountingSandboxClient) -> Bill:
    bill = make_bill(amount="200.00")
    sandbox.seed_invoice(
        invoice_id=bill.accounting_reference, number=bill.number, total="200.00", Contact=bill.supplier_name
    )
    return bill


def _propose(bill: Bill, agent_actor: Any) -> Action:
    request = make_adjustment_request(bill)
    return action_propose_invoice_adjustment(
        bill_number=bill.number,
        adjustment_number=request.number,
        amount=str(AMOUNT),
        currency="EUR",
        reason_code="price_mismatch",
        proposer=agent_actor,
    ).action


def audit_against_the_accounting_ledger(sandbox: AccountingSandboxClient) -> None:
    """The accounting sandbox's own ledger, read independently of the console's client:
    - at most one live credit note per action;
    - every SUCCEEDED adjustment has exactly one, and it is the recorded reference;
    - per bill, credit notes allocated <= the bill's original amount due."""
    notes = [note for note in sandbox.ledger() if note["Status"] != "VOIDED"]
    by_action: dict[str, list[dict[str, Any]]] = {}
    for note in notes:
        by_action.setdefault(note["Reference"], []).append(note)
    assert all(len(found) <= 1 for found in by_action.values()), by_action
    for action in Action.objects.filter(kind="invoice-adjustment", status=ActionStatus.SUCCEEDED):
        [note] = by_action[action.action_id]
        assert note["CreditNoteID"] == action.provider_reference
    for invoice in sandbox.invoices():
        allocated = sum(
            Decimal(str(note["Total"])) for note in notes if (note.get("InvoiceID") == invoice["InvoiceID"])
        )
        assert allocated <= Decimal(str(invoice["Total"])), invoice
        assert Decimal(str(invoice["AmountDue"])) == Decimal(str(invoice["Total"])) - allocated


def test_an_adjustment_interrupted_after_the_accounting_system_accepted_it_is_resumed_without_a_second_credit_note(
    workers: WorkerPool, live_accounting: AccountingSandboxClient, agent_actor: Any, fast_policy: None
) -> None:
    """The seed's test. Invariant 1: "One approved action causes at most one effect at the
    receiver, whatever crashes, timeouts, duplicate events, concurrent workers and redeliveries
    happen." Invariant 2: "Every SUCCEEDED action has exactly one effect at the receiver, and its
    reference is recorded."

    The worker is killed after the accounting system saved the credit note and before the
    console recorded it. A fresh worker resumes; both systems are then inspected.
    """
    bill = _bill_in_both_systems(live_accounting)
    first = workers.start(fault_points="after_provider_answer")
    action = _propose(bill, agent_actor)
    assert action.status == ActionStatus.AUTHORIZED
    _wait_dead(first)

    # The interruption: the accounting system has the credit note, the console does not know.
    action.refresh_from_db()
    assert action.status == ActionStatus.SUBMITTING
    assert len(live_accounting.credit_notes_for(action.action_id)) == 1

    workers.start(beat=True)
    final = wait_until(
        lambda: Action.objects.filter(pk=action.pk, status__in=FINAL).first(), timeout=60, what="the resume"
    )

    # The accounting system: one credit note, referenced by the action id, allocated once.
    [note] = live_accounting.credit_notes_for(action.action_id)
    [invoice] = [i for i in live_accounting.invoices() if i["InvoiceID"] == bill.accounting_reference]
    assert Decimal(str(invoice["AmountDue"])) == Decimal("180.00")
    # The console: SUCCEEDED with that credit note, booked once on the bill, nothing reserved.
    assert (final.status, final.provider_reference) == (ActionStatus.SUCCEEDED, note["CreditNoteID"])
    bill.refresh_from_db()
    assert (bill.adjusted_amount, bill.reserved_amount) == (AMOUNT, Decimal("0"))
    assert final.events.filter(transition="mark_unknown").exists()
    audit_against_the_accounting_ledger(live_accounting)
    call_command("audit_effects")


@pytest.mark.parametrize("outcome", OUTCOMES)
@pytest.mark.parametrize("window", WINDOWS)
def test_an_adjustment_whose_worker_is_killed_in_any_window_leaves_one_credit_note(
    window: str,
    outcome: str,
    workers: WorkerPool,
    live_accounting: AccountingSandboxClient,
    agent_actor: Any,
    fast_policy: None,
) -> None:
    """Invariants 1, 2, 3, 5 and 8 for invoice adjustments: whatever window the worker dies in
    and whatever the accounting system answered, a fresh worker drains the action to one credit
    note, and the audit against the accounting sandbox's own ledger passes."""
    bill = _bill_in_both_systems(live_accounting)
    action_id = f"invoice-adjustment:bill-{bill.number}:adjustment-1"
    if outcome == "500_after_commit":
        live_accounting.fault(mode="commit_then_500", action_id=action_id)
    elif outcome == "timeout_after_commit":
        live_accounting.fault(mode="commit_then_timeout", action_id=action_id, sleep_seconds=2)

    first = workers.start(fault_points="after_provider_answer" if window == "during_reconciliation" else window)
    action = _propose(bill, agent_actor)
    assert action.action_id == action_id
    _wait_dead(first)
    if window == "during_reconciliation":
        reconciler = workers.start(fault_points="during_reconciliation", beat=True)
        _wait_dead(reconciler)

    workers.start(beat=True)
    final = wait_until(
        lambda: Action.objects.filter(pk=action.pk, status__in=FINAL).first(),
        timeout=60,
        what=f"the adjustment to drain after a kill {window} with {outcome}",
    )
    [note] = live_accounting.credit_notes_for(action.action_id)
    assert (final.status, final.provider_reference) == (ActionStatus.SUCCEEDED, note["CreditNoteID"])
    audit_against_the_accounting_ledger(live_accounting)
    call_command("audit_effects")
