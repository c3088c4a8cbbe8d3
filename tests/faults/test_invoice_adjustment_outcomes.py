"""The invoice-adjustment kind's answer table, row by row, from real accounting-sandbox faults.

Each test proposes an auto-approved adjustment of 20.00 EUR on a bill the accounting sandbox
holds, lets the sandbox answer in one way, and calls the dispatcher (and the reconciler) in this
process. What the console records is checked against what the accounting system actually
stored, in both systems:

| accounting system's answer                                   | state        |
|--------------------------------------------------------------|--------------|
| created, AUTHORISED and allocated to the bill                | SUCCEEDED    |
| validation error: over the amount due, voided bill, currency | FAILED_FINAL |
| Idempotency-Key reused with a different body                 | NEEDS_REVIEW |
| key in flight, rate limited, 5xx, timeout, dropped           | UNKNOWN      |

Reconciliation then looks up by Reference: inside key retention a re-send with the same key;
past it, a retry only on an authoritative not-found after the visibility delay; otherwise
escalation to accounts payable.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
import requests
from django.utils import timezone

from actions.engine.dispatch import execution_dispatch
from actions.engine.invariants import audit_effects
from actions.engine.reconcile import reconcile_action
from actions.foundation.trail import Actor
from actions.kinds.invoice_adjustment.proposal import action_propose_invoice_adjustment
from actions.models import Action, ActionStatus, Attempt, AttemptKind, Bill
from tests.factories import make_adjustment_request, make_bill, make_user
from tests.processes import wait_until
from tests.providers.accounting_client import AccountingSandboxClient

pytestmark = [pytest.mark.postgres, pytest.mark.processes, pytest.mark.django_db(transaction=True)]

S = ActionStatus
AMOUNT = Decimal("20.00")


@pytest.fixture(autouse=True)
def published(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", calls.append)
    return calls


@pytest.fixture(autouse=True)
def fast(settings: Any, live_accounting: AccountingSandboxClient, live_sandbox: Any) -> None:
    # The payment sandbox too: the audit reads every configured kind's ledger.
    settings.ACCOUNTING_TIMEOUT_SECONDS = 1
    settings.RECONCILE_BASE_BACKOFF_SECONDS = 1


@pytest.fixture
def accounts_payable(db: Any) -> Any:
    return make_user("alex.payable", "accounts payable")


@pytest.fixture
def authorized(live_accounting: AccountingSandboxClient, agent_actor: Actor) -> Callable[..., Action]:
    """An auto-approved 20.00 EUR adjustment on a 200.00 EUR bill that the sandbox holds too."""

    def _authorized(*, due_at_accounting: str = "200.00", currency_at_accounting: str = "EUR") -> Action:
        bill = make_bill(amount="200.00")
        live_accounting.seed_invoice(
            invoice_id=bill.accounting_reference,
            number=bill.number,
            total="200.00",
            AmountDue=due_at_accounting,
            currency=currency_at_accounting,
            Contact=bill.supplier_name,
        )
        request = make_adjustment_request(bill)
        result = action_propose_invoice_adjustment(
            bill_number=bill.number,
            adjustment_number=request.number,
            amount=str(AMOUNT),
            currency="EUR",
            reason_code="price_mismatch",
            proposer=agent_actor,
        )
        assert result.action.status == S.AUTHORIZED
        return result.action

    return _authorized


def bill_of(action: Action) -> Bill:
    assert action.bill_id is not None
    return Bill.objects.get(pk=action.bill_id)


def amount_due_at_accounting(sandbox: AccountingSandboxClient, action: Action) -> Decimal:
    [invoice] = [i for i in sandbox.invoices() if i["InvoiceID"] == action.payload["invoice_id"]]
    return Decimal(str(invoice["AmountDue"]))


def assert_both_systems_agree(sandbox: AccountingSandboxClient, action: Action) -> None:
    """One credit note, recorded as the action's reference, booked once on both sides."""
    action.refresh_from_db()
    [note] = sandbox.credit_notes_for(action.action_id)
    assert (action.status, action.provider_reference) == (S.SUCCEEDED, note["CreditNoteID"])
    bill = bill_of(action)
    assert (bill.adjusted_amount, bill.reserved_amount) == (AMOUNT, 0)
    assert amount_due_at_accounting(sandbox, action) == Decimal("180.00")
    assert audit_effects().ok


# --- created ------------------------------------------------------------------------------------


def test_a_credit_note_created_and_allocated_is_recorded_as_succeeded_with_its_reference(
    live_accounting: AccountingSandboxClient, authorized: Callable[..., Action]
) -> None:
    """Invariant 2: a SUCCEEDED action has exactly one effect, and its reference is recorded."""
    action = authorized()
    assert execution_dispatch(action_pk=action.pk) == S.SUCCEEDED
    assert_both_systems_agree(live_accounting, action)
    [note] = live_accounting.credit_notes_for(action.action_id)
    assert note["sandbox"]["idempotency_key"] == action.action_id


# --- validation errors: nothing saved -------------------------------------------------------------


@pytest.mark.parametrize(
    ("setup", "words"),
    [
        ({"due_at_accounting": "10.00"}, "amount due"),
        ({"currency_at_accounting": "USD"}, "not EUR"),
        ("voided", "voided"),
    ],
)
def test_a_validation_error_is_final_saves_nothing_and_releases_the_reservation(
    live_accounting: AccountingSandboxClient, authorized: Callable[..., Action], setup: Any, words: str
) -> None:
    action = authorized(**setup) if isinstance(setup, dict) else authorized()
    if setup == "voided":
        live_accounting.void_invoice(action.payload["invoice_id"])

    assert execution_dispatch(action_pk=action.pk) == S.FAILED_FINAL

    assert live_accounting.ledger() == []
    [attempt] = Attempt.objects.filter(action=action, kind=AttemptKind.SUBMIT)
    assert attempt.error is not None and words in attempt.error["message"]
    bill = bill_of(action)
    assert (bill.adjusted_amount, bill.reserved_amount) == (0, 0)


# --- the key reused with another body: a bug, for a person -----------------------------------------


def test_a_key_reused_with_a_different_body_needs_review_by_accounts_payable(
    live_accounting: AccountingSandboxClient, authorized: Callable[..., Action], accounts_payable: Any
) -> None:
    action = authorized()
    # Someone used the action's key with another body first (a bug elsewhere, or a changed payload).
    other = {
        "CreditNotes": [
            {
                "Type": "ACCPAYCREDIT",
                "Contact": {"Name": "Someone"},
                "Reference": "something-else",
                "CurrencyCode": "EUR",
                "LineItems": [{"Description": "x", "Quantity": 1, "UnitAmount": "1.00"}],
            }
        ]
    }
    answer = requests.put(
        f"{live_accounting.url}/api.xro/2.0/CreditNotes",
        data=json.dumps(other),
        headers={"Authorization": "Bearer t", "xero-tenant-id": "t", "Idempotency-Key": action.idempotency_key},
        timeout=5,
    )
    assert answer.status_code == 200

    assert execution_dispatch(action_pk=action.pk) == S.NEEDS_REVIEW

    action.refresh_from_db()
    assert action.owner == accounts_payable
    assert live_accounting.credit_notes_for(action.action_id) == []
    assert bill_of(action).reserved_amount == AMOUNT  # held until a person decides


# --- ambiguous answers: UNKNOWN, then reconciliation ------------------------------------------------


@pytest.mark.parametrize("mode", ["commit_then_timeout", "commit_then_500", "commit_then_drop"])
def test_a_committed_credit_note_whose_answer_was_lost_is_unknown_then_found_by_reference(
    live_accounting: AccountingSandboxClient, authorized: Callable[..., Action], mode: str
) -> None:
    """Invariants 1 and 7: the answer is lost after the accounting system saved the credit note;
    the console waits in UNKNOWN and reconciliation finds it by Reference, with no second one."""
    action = authorized()
    live_accounting.fault(mode=mode, action_id=action.action_id, sleep_seconds=1.5)

    assert execution_dispatch(action_pk=action.pk) == S.UNKNOWN
    assert len(live_accounting.credit_notes_for(action.action_id)) == 1

    later = timezone.now() + timedelta(seconds=30)
    assert reconcile_action(action_pk=action.pk, now=later) == S.SUCCEEDED
    assert_both_systems_agree(live_accounting, action)


@pytest.mark.parametrize("mode", ["fail_before_commit", "rate_limit"])
def test_a_refusal_before_commit_is_unknown_and_the_resend_inside_retention_creates_it_once(
    live_accounting: AccountingSandboxClient, authorized: Callable[..., Action], mode: str
) -> None:
    action = authorized()
    live_accounting.fault(mode=mode, action_id=action.action_id)

    assert execution_dispatch(action_pk=action.pk) == S.UNKNOWN
    assert live_accounting.ledger() == []

    later = timezone.now() + timedelta(seconds=30)
    assert reconcile_action(action_pk=action.pk, now=later) == S.SUCCEEDED
    assert_both_systems_agree(live_accounting, action)
    assert action.attempt_count == 2


def test_a_slow_answer_past_the_timeout_is_unknown_and_the_credit_note_exists_once(
    live_accounting: AccountingSandboxClient, authorized: Callable[..., Action]
) -> None:
    action = authorized()
    live_accounting.fault(mode="slow", action_id=action.action_id, sleep_seconds=2)

    assert execution_dispatch(action_pk=action.pk) == S.UNKNOWN
    # The accounting system finishes the request after the console gave up on it.
    wait_until(lambda: live_accounting.credit_notes_for(action.action_id), timeout=10, what="the slow credit note")

    assert reconcile_action(action_pk=action.pk, now=timezone.now() + timedelta(seconds=30)) == S.SUCCEEDED
    assert_both_systems_agree(live_accounting, action)


# --- reconciliation's rules -----------------------------------------------------------------------


def test_past_key_retention_a_not_found_inside_the_visibility_delay_sends_nothing(
    live_accounting: AccountingSandboxClient, authorized: Callable[..., Action], settings: Any
) -> None:
    """Invariant 7: no retry from UNKNOWN without the evidence of section 7. Past the key's
    retention a resend would create a second credit note, so the lookup's lag must pass first."""
    settings.ACCOUNTING_KEY_RETENTION_SECONDS = 60
    settings.KEY_RETENTION_MARGIN_SECONDS = 30
    settings.ACCOUNTING_LOOKUP_VISIBILITY_DELAY_SECONDS = 600
    live_accounting.configure(key_retention_seconds=60, lookup_visibility_delay_seconds=600)
    action = authorized()
    live_accounting.fault(mode="commit_then_500", action_id=action.action_id)
    assert execution_dispatch(action_pk=action.pk) == S.UNKNOWN

    # Past retention (the sandbox forgot the key), but inside the lookup's lag: not found proves
    # nothing yet.
    live_accounting.advance_clock(120)
    Action.objects.filter(pk=action.pk).update(next_reconcile_at=None)
    assert reconcile_action(action_pk=action.pk, now=timezone.now() + timedelta(seconds=120)) == "too_early"
    assert len(live_accounting.credit_notes_for(action.action_id)) == 1

    # Once the lag has passed the lookup sees it.
    live_accounting.advance_clock(600)
    Action.objects.filter(pk=action.pk).update(next_reconcile_at=None)
    assert reconcile_action(action_pk=action.pk, now=timezone.now() + timedelta(seconds=800)) == S.SUCCEEDED
    assert_both_systems_agree(live_accounting, action)


def test_past_retention_an_authoritative_not_found_after_the_delay_allows_one_retry(
    live_accounting: AccountingSandboxClient, authorized: Callable[..., Action], settings: Any
) -> None:
    settings.ACCOUNTING_KEY_RETENTION_SECONDS = 60
    settings.KEY_RETENTION_MARGIN_SECONDS = 30
    settings.ACCOUNTING_LOOKUP_VISIBILITY_DELAY_SECONDS = 5
    action = authorized()
    live_accounting.fault(mode="fail_before_commit", action_id=action.action_id)
    assert execution_dispatch(action_pk=action.pk) == S.UNKNOWN

    live_accounting.advance_clock(120)
    assert reconcile_action(action_pk=action.pk, now=timezone.now() + timedelta(seconds=120)) == S.SUCCEEDED
    assert_both_systems_agree(live_accounting, action)
    retry = action.events.get(transition="retry")
    assert "Authoritative not-found" in retry.reason


def test_lookups_that_keep_failing_escalate_to_a_named_member_of_accounts_payable(
    live_accounting: AccountingSandboxClient, authorized: Callable[..., Action], accounts_payable: Any, settings: Any
) -> None:
    """Invariant 8: nothing is lost; what cannot be established goes to a named person."""
    settings.RECONCILE_MAX_FAILURES = 3
    action = authorized()
    live_accounting.fault(mode="commit_then_500", action_id=action.action_id)
    assert execution_dispatch(action_pk=action.pk) == S.UNKNOWN
    live_accounting.fault(mode="fail_before_commit", applies_to="lookup", times=3)

    now = timezone.now()
    for _ in range(3):
        now += timedelta(minutes=10)
        Action.objects.filter(pk=action.pk).update(next_reconcile_at=None)
        reconcile_action(action_pk=action.pk, now=now)

    action.refresh_from_db()
    assert (action.status, action.owner) == (S.NEEDS_REVIEW, accounts_payable)
    assert len(live_accounting.credit_notes_for(action.action_id)) == 1
    assert bill_of(action).reserved_amount == AMOUNT
