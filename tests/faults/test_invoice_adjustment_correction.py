"""The ledger audit for invoice adjustments, and the correction: voiding a duplicate credit note
through the same engine, interrupted as well.

The audit reads the accounting system's credit notes (per bill) and flags a credit note nobody
can trace, two credit notes for one action, and amounts that differ. A duplicate is corrected by
a credit-note-void action: proposed from the finding, approved by a manager, sent by the engine.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from actions.engine.dispatch import execution_dispatch
from actions.engine.invariants import audit_effects
from actions.engine.ledger import ledger_audit_run
from actions.engine.reconcile import reconcile_action
from actions.foundation.trail import Actor
from actions.kinds.invoice_adjustment.contract import credit_notes_by_bill
from actions.kinds.invoice_adjustment.corrections import discrepancy_void_duplicate
from actions.kinds.invoice_adjustment.proposal import action_propose_invoice_adjustment
from actions.kinds.registry import kind_for
from actions.models import Action, ActionStatus, Discrepancy, DiscrepancyKind
from approvals.services import approval_decide
from tests.factories import make_adjustment_request, make_bill, make_user
from tests.processes import WorkerPool, wait_until
from tests.providers.accounting_client import AccountingSandboxClient

pytestmark = [pytest.mark.postgres, pytest.mark.processes, pytest.mark.django_db(transaction=True)]
S = ActionStatus


@pytest.fixture(autouse=True)
def setup(settings: Any, live_accounting: AccountingSandboxClient, live_sandbox: Any) -> None:
    settings.ACCOUNTING_TIMEOUT_SECONDS = 1
    settings.RECONCILE_BASE_BACKOFF_SECONDS = 1


@pytest.fixture
def succeeded(live_accounting: AccountingSandboxClient, agent_actor: Actor, monkeypatch: pytest.MonkeyPatch) -> Action:
    """A 20.00 EUR adjustment that the accounting system saved and the console recorded."""
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)
    bill = make_bill(amount="200.00")
    live_accounting.seed_invoice(invoice_id=bill.accounting_reference, number=bill.number, total="200.00")
    request = make_adjustment_request(bill)
    action = action_propose_invoice_adjustment(
        bill_number=bill.number,
        adjustment_number=request.number,
        amount="20.00",
        currency="EUR",
        reason_code="price_mismatch",
        proposer=agent_actor,
    ).action
    assert execution_dispatch(action_pk=action.pk) == S.SUCCEEDED
    action.refresh_from_db()
    return action


def audit_later() -> None:
    ledger_audit_run(now=timezone.now() + timedelta(hours=1))


def test_the_audit_flags_a_duplicate_an_untraceable_credit_note_and_an_amount_that_differs(
    live_accounting: AccountingSandboxClient, succeeded: Action
) -> None:
    duplicate = live_accounting.plant_credit_note(Reference=succeeded.action_id, Total="20.00")
    stranger = live_accounting.plant_credit_note(Reference="typed-by-hand", Total="5.00")
    audit_later()
    found = {(d.kind, d.provider_reference) for d in Discrepancy.objects.all()}
    [twice] = Discrepancy.objects.filter(kind=DiscrepancyKind.DUPLICATE_EFFECT, action=succeeded)
    assert sorted(twice.details["effects"]) == sorted([duplicate["CreditNoteID"], succeeded.provider_reference])
    assert (DiscrepancyKind.EFFECT_WITHOUT_ACTION, stranger["CreditNoteID"]) in found

    Discrepancy.objects.all().delete()
    live_accounting.reset()
    live_accounting.plant_credit_note(Reference=succeeded.action_id, Total="25.00")
    audit_later()
    kinds = set(Discrepancy.objects.values_list("kind", flat=True))
    assert DiscrepancyKind.AMOUNT_MISMATCH in kinds


def test_the_ledger_lists_credit_notes_per_bill(live_accounting: AccountingSandboxClient, succeeded: Action) -> None:
    effects = list(kind_for("invoice-adjustment").receiver().ledger())
    listing = credit_notes_by_bill(effects)
    assert [e.reference for e in listing[succeeded.payload["invoice_id"]]] == [succeeded.provider_reference]


def _void_proposed(live_accounting: AccountingSandboxClient, succeeded: Action) -> tuple[Action, str]:
    duplicate = live_accounting.plant_credit_note(Reference=succeeded.action_id, Total="20.00")
    audit_later()
    finding = Discrepancy.objects.get(kind=DiscrepancyKind.DUPLICATE_EFFECT)
    admin = make_user("adam.admin", "admin", is_staff=True)
    void = discrepancy_void_duplicate(
        discrepancy_pk=finding.pk, user=admin, note="The second credit note is a duplicate."
    )
    assert void.status == S.PROPOSED  # a correction is always a person's decision
    assert discrepancy_void_duplicate(discrepancy_pk=finding.pk, user=admin, note="again").pk == void.pk
    manager = make_user("maria.manager", "manager", limits={"EUR": "500"})
    approval_decide(action_pk=void.pk, user=manager, decision="approve", note="Void it.")
    return void, duplicate["CreditNoteID"]


def _assert_voided_once(
    live_accounting: AccountingSandboxClient, void: Action, duplicate_id: str, original: Action
) -> None:
    void.refresh_from_db()
    assert (void.status, void.provider_reference) == (S.SUCCEEDED, duplicate_id)
    statuses = {note["CreditNoteID"]: note["Status"] for note in live_accounting.ledger()}
    assert statuses[duplicate_id] == "VOIDED"
    assert statuses[original.provider_reference] in ("AUTHORISED", "PAID")
    assert audit_effects().ok


def test_a_duplicate_credit_note_is_voided_through_the_engine(
    live_accounting: AccountingSandboxClient, succeeded: Action, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant 13: a compensation runs at most once, and only for an effect that is confirmed."""
    void, duplicate_id = _void_proposed(live_accounting, succeeded)
    assert execution_dispatch(action_pk=void.pk) == S.SUCCEEDED
    _assert_voided_once(live_accounting, void, duplicate_id, succeeded)
    # The audit is clean again: a voided credit note is not an effect.
    Discrepancy.objects.all().delete()
    audit_later()
    assert not Discrepancy.objects.exists()


@pytest.mark.parametrize("mode", ["commit_then_500", "commit_then_drop", "fail_before_commit"])
def test_an_interrupted_void_is_reconciled_by_reading_the_credit_note(
    live_accounting: AccountingSandboxClient, succeeded: Action, mode: str
) -> None:
    void, duplicate_id = _void_proposed(live_accounting, succeeded)
    live_accounting.fault(mode=mode, action_id=void.action_id)

    assert execution_dispatch(action_pk=void.pk) == S.UNKNOWN

    # Voiding is a "set" step: the credit note's status is the evidence; voided or not, the
    # reconciler either records it or sets it again.
    assert reconcile_action(action_pk=void.pk, now=timezone.now() + timedelta(seconds=30)) == S.SUCCEEDED
    _assert_voided_once(live_accounting, void, duplicate_id, succeeded)


def test_a_void_whose_worker_is_killed_after_the_accounting_system_answered_is_recorded_once(
    live_accounting: AccountingSandboxClient,
    succeeded: Action,
    workers: WorkerPool,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings.LEASE_SECONDS = 3
    settings.SWEEP_INTERVAL_SECONDS = 1
    monkeypatch.undo()  # the approval publishes the dispatch to the real workers
    first = workers.start(fault_points="after_provider_answer")
    void, duplicate_id = _void_proposed(live_accounting, succeeded)
    wait_until(lambda: not first.alive, timeout=30, what="the worker to die after the void")
    workers.start(beat=True)
    wait_until(
        lambda: Action.objects.filter(pk=void.pk, status__in=[S.SUCCEEDED, S.NEEDS_REVIEW]).first(),
        timeout=60,
        what="the void to drain",
    )
    _assert_voided_once(live_accounting, void, duplicate_id, succeeded)
    assert succeeded.bill is not None
    succeeded.bill.refresh_from_db()
    assert succeeded.bill.adjusted_amount == Decimal("20.00")
