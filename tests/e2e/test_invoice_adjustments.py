"""Invoice adjustments in a real browser, against the live accounting sandbox.

A manager filters the inbox to invoice adjustments, reads the bill (amount due, the purchase-order
mismatch) and approves one above the auto-approval threshold. Then a member of accounts payable
opens an adjustment that needs review (the accounting system saved the credit note but its answer
was lost and lookups kept failing), looks it up, and records it as succeeded.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from actions.engine.dispatch import execution_dispatch
from actions.engine.reconcile import reconcile_action
from actions.foundation.trail import Actor
from actions.kinds.invoice_adjustment.proposal import action_propose_invoice_adjustment
from actions.models import Action, ActionEvent, ActionStatus, Bill
from tests.factories import PASSWORD, make_adjustment_request, make_bill, make_user
from tests.providers.accounting_client import AccountingSandboxClient

pytestmark = [pytest.mark.browser, pytest.mark.processes, pytest.mark.django_db(transaction=True)]
S = ActionStatus


def _adjustment(sandbox: AccountingSandboxClient, agent_actor: Actor, amount: str, number: str) -> Action:
    bill = make_bill(number=number, amount="300.00")
    sandbox.seed_invoice(invoice_id=bill.accounting_reference, number=bill.number, total="300.00")
    return action_propose_invoice_adjustment(
        bill_number=bill.number,
        adjustment_number=make_adjustment_request(bill).number,
        amount=amount,
        currency="EUR",
        reason_code="price_mismatch",
        evidence="PO-8812: 18.00 a unit; the bill charges 20.00.",
        proposer=agent_actor,
    ).action


def _log_in(page: Page, url: str, user: Any) -> None:
    page.goto(f"{url}/login/")
    page.get_by_label("Username").fill(user.username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{url}/")


def test_a_manager_approves_an_adjustment_and_accounts_payable_resolves_one_that_needs_review(
    live_server: Any,
    chromium_page: Callable[[], AbstractContextManager[Page]],
    live_accounting: AccountingSandboxClient,
    live_sandbox: Any,
    manager: Any,
    agent_actor: Actor,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Invariants 2, 5 and 8 end to end for invoice adjustments."""
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)
    settings.ACCOUNTING_TIMEOUT_SECONDS = 1
    payable = make_user("alex.payable", "accounts payable")
    to_approve = _adjustment(live_accounting, agent_actor, "120.00", "INV-7001")
    assert to_approve.status == S.PROPOSED  # above the kind's threshold: a manager decides

    # The one that needs review: saved at the accounting system, answer lost, lookups failing.
    review = _adjustment(live_accounting, agent_actor, "30.00", "INV-7002")
    live_accounting.fault(mode="commit_then_500", action_id=review.action_id)
    assert execution_dispatch(action_pk=review.pk) == S.UNKNOWN
    live_accounting.fault(mode="fail_before_commit", applies_to="lookup", times=settings.RECONCILE_MAX_FAILURES)
    now = timezone.now()
    for _ in range(settings.RECONCILE_MAX_FAILURES):
        now += timedelta(minutes=10)
        Action.objects.filter(pk=review.pk).update(next_reconcile_at=None)
        reconcile_action(action_pk=review.pk, now=now)
    review.refresh_from_db()
    assert (review.status, review.owner) == (S.NEEDS_REVIEW, payable)
    [note] = live_accounting.credit_notes_for(review.action_id)
    # A resolution needs the last lease to have passed; nothing else runs here.
    settings.LEASE_SECONDS = 0
    url = live_server.url

    with chromium_page() as page:
        _log_in(page, url, manager)
        page.goto(f"{url}/approvals/")
        page.locator("nav.filters").get_by_role("link", name="Invoice adjustment", exact=True).click()
        page.wait_for_url(f"{url}/approvals/?kind=invoice-adjustment")
        row = page.locator(f"#action-{to_approve.pk}")
        expect(row).to_contain_text("Bill INV-7001")
        row.get_by_role("link", name="Bill INV-7001").click()
        expect(page.get_by_test_id("bill-amount-due")).to_have_text("300.00 EUR")
        expect(page.get_by_test_id("po-mismatch")).to_contain_text("18.00 on the purchase order")
        row = page.locator(f"#action-{to_approve.pk}")
        row.get_by_label("Note for the audit trail").fill("PO price confirmed with purchasing.")
        row.get_by_role("button", name="Approve").click()
        expect(row).to_have_attribute("data-status", "AUTHORIZED")

    with chromium_page() as page:
        _log_in(page, url, payable)
        page.get_by_role("link", name="Review queue", exact=True).click()
        page.wait_for_url(f"{url}/review/")
        expect(page.locator(f"#queue-action-{review.pk}")).to_contain_text("Bill INV-7002")
        page.locator(f"#queue-action-{review.pk}").get_by_test_id("item-title").click()
        page.wait_for_url(f"{url}/review/actions/{review.pk}/")
        expect(page.get_by_test_id("bill-panel")).to_be_visible()
        page.get_by_role("button", name="Look up at the provider now").click()
        expect(page.get_by_test_id("lookup-summary")).to_contain_text(note["CreditNoteID"])
        form = page.locator("#resolve-succeeded")
        expect(form.get_by_label("Credit note id at the accounting system")).to_have_value(note["CreditNoteID"])
        form.get_by_label("Reason").fill("The 500 hid a credit note the accounting system saved.")
        form.get_by_role("button", name="Record as succeeded").click()
        expect(page.get_by_test_id("action-status")).to_have_text("Succeeded")

    to_approve.refresh_from_db()
    assert to_approve.status == S.AUTHORIZED
    review.refresh_from_db()
    assert (review.status, review.provider_reference) == (S.SUCCEEDED, note["CreditNoteID"])
    assert review.bill_id is not None
    bill = Bill.objects.get(pk=review.bill_id)
    assert (bill.adjusted_amount, bill.reserved_amount) == (Decimal("30.00"), Decimal("0"))
    event = ActionEvent.objects.filter(action=review).latest("pk")
    assert (event.transition, event.actor_user) == ("resolve_succeeded", payable)
    assert len(live_accounting.credit_notes_for(review.action_id)) == 1
