"""seed_demo adds supplier bills with purchase-order mismatches, in both systems."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command

from actions.models import Action, Bill, Workflow, WorkflowState
from tests.providers.accounting_client import AccountingSandboxClient

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


class _Sink:
    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def test_the_seed_registers_bills_with_the_accounting_sandbox_and_proposes_adjustments_once(
    live_sandbox: Any, live_accounting: AccountingSandboxClient, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)
    settings.DEBUG = True  # seed_demo refuses to run in production
    call_command("seed_demo", "--sandbox", live_sandbox.url, stdout=_Sink(), stderr=_Sink())

    bills = list(Bill.objects.order_by("number"))
    assert len(bills) == 7 and all(bill.po_mismatch.get("summary") for bill in bills)
    registered = {invoice["InvoiceID"] for invoice in live_accounting.invoices()}
    assert {bill.accounting_reference for bill in bills} <= registered
    adjustments = Action.objects.filter(kind="invoice-adjustment")
    statuses = set(adjustments.values_list("status", flat=True))
    assert adjustments.count() == 6 and {"AUTHORIZED", "PROPOSED", "NEEDS_REVIEW"} <= statuses
    # Accounts payable has one of its own to resolve: escalated to alex, its credit note saved
    # at the accounting system for his lookup to find.
    review = adjustments.get(status="NEEDS_REVIEW")
    assert review.owner is not None and review.owner.username == "alex"
    assert len(live_accounting.credit_notes_for(review.action_id)) == 1
    # A plan waits for a manager: payables-bot proposed it with the scopes the seed gave it, and
    # its email greets the supplier named on the bill.
    plan = Workflow.objects.get(template="po_mismatch_resolution")
    assert plan.state == WorkflowState.PROPOSED and plan.proposed_by_agent.name == "payables-bot"
    bill = Bill.objects.get(number=plan.parameters["bill_number"])
    email = next(step for step in plan.plan["steps"] if step["name"] == "email_supplier")
    assert email["payload"]["body"].startswith(f"Dear {bill.supplier_name},")
    counts = (Bill.objects.count(), Action.objects.count())

    call_command("seed_demo", "--sandbox", live_sandbox.url, stdout=_Sink(), stderr=_Sink())

    assert (Bill.objects.count(), Action.objects.count()) == counts
    assert Workflow.objects.count() == 1
