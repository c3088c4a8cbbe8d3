"""The admin's correction for an invoice adjustment the accounting system holds twice:
from a SUCCEEDED adjustment's page, propose voiding the duplicate credit note the ledger audit
found. The void is a new action, PROPOSED for a manager (four eyes), never the credit note the
console recorded, and the discrepancy list's "compensate" does the same for an adjustment (never
a refund compensation)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils import timezone

from actions.engine.claim import ClaimOutcome, submission_begin
from actions.engine.ledger import ledger_audit_run
from actions.engine.record import submission_record
from actions.kinds.base import Answer, Effect
from actions.kinds.invoice_adjustment.contract import adjustment_contract, effect_from_credit_note
from actions.kinds.invoice_adjustment.proposal import action_propose_invoice_adjustment
from actions.models import Action, ActionEvent, ActionKind, ActionStatus, Discrepancy, DiscrepancyKind
from actions.providers.accounting.client import CreditNote
from actions.services import Actor
from approvals.models import Decision
from approvals.services import approval_decide
from tests.factories import make_adjustment_request, make_bill, make_user

pytestmark = pytest.mark.django_db
S = ActionStatus


@pytest.fixture(autouse=True)
def setup(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # The kind's ledger is read (through the fake below) only when an accounting system is configured.
    settings.ACCOUNTING_API_BASE = "http://accounting.invalid"
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)


def credit_note(action: Action, note_id: str) -> CreditNote:
    data = {
        "CreditNoteID": note_id,
        "CreditNoteNumber": f"CN-{note_id}",
        "Reference": action.action_id,
        "Status": "AUTHORISED",
        "Total": str(action.amount),
        "CurrencyCode": action.currency,
        "Type": "ACCPAYCREDIT",
        "InvoiceID": action.payload["invoice_id"],
    }
    return CreditNote.from_json(data)


class FakeAccountingLedger:
    """The accounting system's ledger as the audit reads it: these credit notes."""

    def __init__(self, effects: list[Effect]) -> None:
        self.effects = effects
        self.contract = adjustment_contract()

    def ledger(self, window: object = None) -> Iterator[Effect]:
        return iter(self.effects)


def succeeded_adjustment(agent_actor: Actor, manager: Any, note_id: str = "cn-first") -> Action:
    """A 20.00 EUR adjustment the accounting system saved as ``note_id`` and the console recorded."""
    bill = make_bill(amount="200.00")
    request = make_adjustment_request(bill)
    action = action_propose_invoice_adjustment(
        bill_number=bill.number,
        adjustment_number=request.number,
        amount="20.00",
        currency="EUR",
        reason_code="price_mismatch",
        proposer=agent_actor,
    ).action
    if action.status == S.PROPOSED:
        approval_decide(action_pk=action.pk, user=manager, decision=Decision.APPROVE)
    claim = submission_begin(action_pk=action.pk)
    assert claim.outcome == ClaimOutcome.CLAIMED
    assert claim.attempt is not None and claim.lease_token is not None
    effect = effect_from_credit_note(credit_note(action, note_id))
    submission_record(
        action_pk=action.pk,
        attempt_pk=claim.attempt.pk,
        lease_token=claim.lease_token,
        answer=Answer(outcome=effect.outcome, effect=effect),
    )
    action = Action.objects.get(pk=action.pk)
    assert (action.status, action.provider_reference) == (S.SUCCEEDED, note_id)
    return action


def duplicate_credit_note_found(action: Action, duplicate_id: str = "cn-second") -> Discrepancy:
    """The accounting system holds a second credit note for the action; the ledger audit finds it."""
    effects = [effect_from_credit_note(credit_note(action, ref)) for ref in (action.provider_reference, duplicate_id)]
    run = ledger_audit_run(
        receivers={
            # The refunds' ledger is empty here: only the accounting system holds anything.
            ActionKind.REFUND.value: FakeAccountingLedger([]),  # type: ignore[dict-item]
            ActionKind.INVOICE_ADJUSTMENT.value: FakeAccountingLedger(effects),  # type: ignore[dict-item]
        },
        now=timezone.now() + timedelta(hours=1),
    )
    assert not run.error, run.error
    return Discrepancy.objects.get(kind=DiscrepancyKind.DUPLICATE_EFFECT, action=action)


def page_url(action: Action) -> str:
    return f"/admin/actions/action/{action.pk}/void-credit-note/"


@pytest.fixture
def admin_client(client: Client, console_admin: User) -> Client:
    client.force_login(console_admin)
    return client


def test_an_admin_voids_the_duplicate_credit_note_of_a_succeeded_adjustment_through_a_proposal(
    admin_client: Client, agent_actor: Actor, manager: Any
) -> None:
    original = succeeded_adjustment(agent_actor, manager)
    events = list(ActionEvent.objects.filter(action=original).values_list("pk", flat=True))
    duplicate_credit_note_found(original)

    change_page = admin_client.get(f"/admin/actions/action/{original.pk}/change/").content.decode()
    form_page = admin_client.get(page_url(original)).content.decode()
    assert 'data-correction="void_credit_note"' in change_page
    assert 'data-kept="cn-first"' in form_page and 'data-duplicate="cn-second"' in form_page
    assert 'name="note"' in form_page

    done = admin_client.post(page_url(original), {"note": "The accounting system holds it twice."}, follow=True)
    again = admin_client.post(page_url(original), {"note": "Clicked twice."}, follow=True)

    [void] = Action.objects.filter(kind=ActionKind.CREDIT_NOTE_VOID)
    assert void.action_id == "credit-note-void:cn-second"  # the duplicate, never the adjustment's cn-first
    assert void.payload["credit_note"] == "cn-second"
    assert void.status == S.PROPOSED, "a correction waits for a manager's decision (four eyes)"
    assert void.amount == Decimal("20.00")
    assert any("waits for a manager" in str(m) for m in done.context["messages"])
    assert any("credit-note-void:cn-second" in str(m) for m in again.context["messages"])
    # The adjustment and its trail are the record of what happened: unchanged.
    original.refresh_from_db()
    assert (original.status, original.provider_reference) == (S.SUCCEEDED, "cn-first")
    assert list(ActionEvent.objects.filter(action=original).values_list("pk", flat=True)) == events


def test_with_no_duplicate_found_nothing_is_voided(admin_client: Client, agent_actor: Actor, manager: Any) -> None:
    original = succeeded_adjustment(agent_actor, manager)

    form_page = admin_client.get(page_url(original)).content.decode()
    response = admin_client.post(page_url(original), {"note": "Void it anyway."}, follow=True)

    assert "data-no-duplicate" in form_page and 'name="note"' not in form_page
    assert any("nothing to void" in str(m) for m in response.context["messages"])
    assert not Action.objects.filter(kind=ActionKind.CREDIT_NOTE_VOID).exists()


def test_the_void_is_offered_only_for_a_succeeded_adjustment(
    admin_client: Client, agent_actor: Actor, manager: Any
) -> None:
    bill = make_bill(amount="200.00")
    request = make_adjustment_request(bill)
    pending = action_propose_invoice_adjustment(
        bill_number=bill.number,
        adjustment_number=request.number,
        amount="90.00",  # above the auto-approval threshold: waits for a manager
        currency="EUR",
        reason_code="price_mismatch",
        proposer=agent_actor,
    ).action

    change_page = admin_client.get(f"/admin/actions/action/{pending.pk}/change/").content.decode()
    response = admin_client.post(page_url(pending), {"note": "Not yet."}, follow=True)

    assert pending.status == S.PROPOSED
    assert 'data-correction="void_credit_note"' not in change_page
    assert any("only a SUCCEEDED adjustment" in str(m) for m in response.context["messages"])
    assert not Action.objects.filter(kind=ActionKind.CREDIT_NOTE_VOID).exists()


@pytest.mark.parametrize("role", ["manager", "finance", "accounts payable"])
def test_staff_without_the_admin_role_cannot_void(client: Client, role: str, agent_actor: Actor, manager: Any) -> None:
    """Invariant 10: only admins correct."""
    original = succeeded_adjustment(agent_actor, manager)
    duplicate_credit_note_found(original)
    staff = make_user(f"staff.{role.replace(' ', '.')}", role, is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_action"))
    client.force_login(staff)

    change_page = client.get(f"/admin/actions/action/{original.pk}/change/")
    response = client.post(page_url(original), {"note": "Mine."})

    assert 'data-correction="void_credit_note"' not in change_page.content.decode()
    assert response.status_code == 403
    assert not Action.objects.filter(kind=ActionKind.CREDIT_NOTE_VOID).exists()


def test_the_discrepancy_lists_compensation_voids_an_adjustments_duplicate_instead_of_refunding(
    admin_client: Client, agent_actor: Actor, manager: Any
) -> None:
    """The discrepancy list's "Start a compensating action" on an adjustment's duplicate proposes
    the credit-note void, not a refund compensation (which would ask a customer for money)."""
    discrepancy = duplicate_credit_note_found(succeeded_adjustment(agent_actor, manager))

    done = admin_client.post(
        "/admin/actions/discrepancy/",
        {
            "action": "start_compensation",
            "_selected_action": [discrepancy.pk],
            "confirm": "yes",
            "note": "A second credit note.",
        },
        follow=True,
    )

    assert not Action.objects.filter(kind=ActionKind.COMPENSATION).exists()
    void = Action.objects.get(kind=ActionKind.CREDIT_NOTE_VOID)
    assert void.action_id == "credit-note-void:cn-second"
    assert any("voids the duplicate credit note" in str(m) for m in done.context["messages"])
    discrepancy.refresh_from_db()
    assert discrepancy.details["compensating_action"] == void.action_id
