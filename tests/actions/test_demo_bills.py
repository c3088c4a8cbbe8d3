"""seed_demo adds supplier bills with purchase-order mismatches, in both systems."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command

from actions.models import Action, Bill
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
    assert len(bills) == 5 and all(bill.po_mismatch.get("summary") for bill in bills)
    registered = {invoice["InvoiceID"] for invoice in live_accounting.invoices()}
    assert {bill.accounting_reference for bill in bills} <= registered
    adjustments = Action.objects.filter(kind="invoice-adjustment")
    statuses = set(adjustments.values_list("status", flat=True))
    assert adjustments.count() == 5 and {"AUTHORIZED", "PROPOSED"} <= statuses
    counts = (Bill.objects.count(), Action.objects.count())

    call_command("seed_demo", "--sandbox", live_sandbox.url, stdout=_Sink(), stderr=_Sink())

    assert (Bill.objects.count(), Action.objects.count()) == counts
