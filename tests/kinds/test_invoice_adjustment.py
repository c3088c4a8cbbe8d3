"""The invoice-adjustment kind without its receiver: identity, validation, approval, reservation.

The answer table's rows that a sandbox cannot produce on its own (a credit note created as a
draft, a validation error on a resend) are tested here on the pure functions; every other row is
produced by a real sandbox fault in tests/faults/test_invoice_adjustment_outcomes.py.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from actions.engine.claim import ClaimOutcome, submission_begin
from actions.foundation.trail import Actor
from actions.kinds import kind_for
from actions.kinds.base import Outcome
from actions.kinds.fields import ProposalInvalid
from actions.kinds.invoice_adjustment.contract import (
    answer_from_create_error,
    invoice_adjustment_action_id,
    outcome_of_credit_note_status,
)
from actions.kinds.invoice_adjustment.proposal import action_propose_invoice_adjustment
from actions.kinds.invoice_adjustment.requests import AdjustmentRequestConflict, adjustment_request_open
from actions.models import Action, ActionStatus, Bill
from actions.providers.base import AmbiguousError, DefinitiveError, IdempotencyMismatchError
from actions.services import (
    ProposalConflict,
)
from approvals.services import approval_decide
from tests.factories import make_adjustment_request, make_bill

pytestmark = pytest.mark.django_db
S = ActionStatus


@pytest.fixture(autouse=True)
def no_publish(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)


def propose(bill: Bill, number: int, amount: str, proposer: Actor, **extra: Any) -> Action:
    fields: dict[str, Any] = {"currency": "EUR", "reason_code": "price_mismatch", **extra}
    return action_propose_invoice_adjustment(
        bill_number=bill.number, adjustment_number=number, amount=amount, proposer=proposer, **fields
    ).action


def test_the_action_id_names_the_bill_and_the_adjustment_request(agent_actor: Actor) -> None:
    bill = make_bill(number="INV-2291")
    make_adjustment_request(bill)
    action = propose(bill, 1, "20.00", agent_actor)
    assert action.action_id == "invoice-adjustment:bill-INV-2291:adjustment-1"
    assert action.idempotency_key == action.action_id
    assert invoice_adjustment_action_id(bill_number="INV-2291", adjustment_number=2).endswith(":adjustment-2")
    assert action.bill_id == bill.pk and action.payload["invoice_id"] == bill.accounting_reference


def test_two_adjustments_to_one_bill_are_two_actions_and_a_retry_is_the_same_one(agent_actor: Actor) -> None:
    bill = make_bill()
    make_adjustment_request(bill)
    make_adjustment_request(bill)
    first = propose(bill, 1, "10.00", agent_actor)
    again = action_propose_invoice_adjustment(
        bill_number=bill.number,
        adjustment_number=1,
        amount="10.00",
        currency="EUR",
        reason_code="price_mismatch",
        proposer=agent_actor,
    )
    second = propose(bill, 2, "10.00", agent_actor)
    assert (again.created, again.action.pk) == (False, first.pk)
    assert second.pk != first.pk


def test_a_different_amount_for_the_same_request_is_a_conflict_naming_the_field(agent_actor: Actor) -> None:
    bill = make_bill()
    make_adjustment_request(bill)
    propose(bill, 1, "10.00", agent_actor)
    with pytest.raises(ProposalConflict) as conflict:
        propose(bill, 1, "11.00", agent_actor)
    assert set(conflict.value.differing) == {"amount"}


@pytest.mark.parametrize(
    ("change", "field", "code"),
    [
        ({"amount": "250.00"}, "amount", "over_adjustable_balance"),
        ({"currency": "USD"}, "currency", "currency_mismatch"),
        ({"reason_code": "goodwill"}, "reason_code", "unknown_reason_code"),
        ({"adjustment_number": 9}, "adjustment_number", "not_found"),
        ({"bill_number": "NOPE-1"}, "bill_number", "not_found"),
    ],
)
def test_bad_input_names_its_field_and_writes_nothing(
    agent_actor: Actor, change: dict[str, Any], field: str, code: str
) -> None:
    """Invariant 11: bad input gets a clear error naming the field and writes nothing."""
    bill = make_bill(amount="200.00")
    make_adjustment_request(bill)
    fields: dict[str, Any] = {
        "bill_number": bill.number,
        "adjustment_number": 1,
        "amount": "20.00",
        "currency": "EUR",
        "reason_code": "price_mismatch",
        **change,
    }
    with pytest.raises(ProposalInvalid) as invalid:
        action_propose_invoice_adjustment(proposer=agent_actor, **fields)
    assert [(p.field, p.code) for p in invalid.value.problems] == [(field, code)]
    assert not Action.objects.exists()


def test_a_voided_bill_cannot_be_adjusted(agent_actor: Actor) -> None:
    bill = make_bill()
    make_adjustment_request(bill)
    Bill.objects.filter(pk=bill.pk).update(voided=True)
    with pytest.raises(ProposalInvalid) as invalid:
        propose(bill, 1, "10.00", agent_actor)
    assert invalid.value.problems[0].code == "bill_voided"


def test_the_adjustable_balance_is_amount_due_minus_adjusted_minus_reserved(agent_actor: Actor) -> None:
    bill = make_bill(amount="200.00", amount_due="150.00")
    Bill.objects.filter(pk=bill.pk).update(adjusted_amount=Decimal("100.00"), reserved_amount=Decimal("30.00"))
    make_adjustment_request(bill)
    with pytest.raises(ProposalInvalid):
        propose(bill, 1, "20.01", agent_actor)
    assert propose(bill, 1, "20.00", agent_actor).status in (S.PROPOSED, S.AUTHORIZED)


def test_below_the_kinds_own_threshold_the_policy_approves_and_above_it_a_manager_decides(
    agent_actor: Actor, settings: Any
) -> None:
    settings.INVOICE_ADJUSTMENT_AUTO_APPROVAL_THRESHOLDS = {"EUR": Decimal("50")}
    settings.AUTO_APPROVAL_THRESHOLDS = {"EUR": Decimal("5")}  # the refunds' threshold does not apply
    bill = make_bill(amount="500.00")
    for _ in range(2):
        make_adjustment_request(bill)
    assert propose(bill, 1, "50.00", agent_actor).status == S.AUTHORIZED
    assert propose(bill, 2, "50.01", agent_actor).status == S.PROPOSED


def test_the_per_bill_cap_stops_many_small_auto_approvals_adding_up(agent_actor: Actor, settings: Any) -> None:
    settings.INVOICE_ADJUSTMENT_AUTO_APPROVAL_THRESHOLDS = {"EUR": Decimal("50")}
    settings.INVOICE_ADJUSTMENT_AUTO_APPROVAL_PER_BILL_CAP = {"EUR": Decimal("100")}
    # The per-target cap on autonomy applies to bills too (tests/security/test_bill_caps.py); opened
    # wide here, so that this tests the kind's own per-bill cap alone.
    settings.AUTO_APPROVAL_TARGET_MAX_AMOUNTS = {"EUR": Decimal("100000")}
    settings.AUTO_APPROVAL_TARGET_MAX_COUNT = 100
    bill = make_bill(amount="500.00")
    for _ in range(3):
        make_adjustment_request(bill)
    statuses = [propose(bill, n, "40.00", agent_actor).status for n in (1, 2, 3)]
    assert statuses == [S.AUTHORIZED, S.AUTHORIZED, S.PROPOSED]


def test_the_claim_reserves_on_the_bill_and_bumps_its_version(agent_actor: Actor) -> None:
    bill = make_bill(amount="200.00")
    make_adjustment_request(bill)
    action = propose(bill, 1, "20.00", agent_actor)
    assert submission_begin(action_pk=action.pk).outcome == ClaimOutcome.CLAIMED
    bill.refresh_from_db()
    assert (bill.reserved_amount, bill.version) == (Decimal("20.00"), 2)


def test_an_approval_goes_stale_when_the_bill_changed_since(agent_actor: Actor, manager: Any, settings: Any) -> None:
    """Invariant 6: nothing is submitted under an approval whose bound bill version differs."""
    settings.INVOICE_ADJUSTMENT_AUTO_APPROVAL_THRESHOLDS = {}
    bill = make_bill(amount="200.00")
    make_adjustment_request(bill)
    action = propose(bill, 1, "120.00", agent_actor)
    approval_decide(action_pk=action.pk, user=manager, decision="approve", note="ok")
    Bill.objects.filter(pk=bill.pk).update(version=7)
    claim = submission_begin(action_pk=action.pk)
    assert claim.outcome == ClaimOutcome.STALE
    assert [f["binding"] for f in claim.failures] == ["bill_version"]
    bill.refresh_from_db()
    assert bill.reserved_amount == 0


def test_adjustment_requests_are_numbered_per_bill_and_idempotent_by_reference() -> None:
    bill, other = make_bill(), make_bill()
    first = adjustment_request_open(bill_number=bill.number, external_reference="MATCH-1")
    second = adjustment_request_open(bill_number=bill.number, external_reference="MATCH-2")
    again = adjustment_request_open(bill_number=bill.number, external_reference="MATCH-1")
    assert (first.request.number, second.request.number) == (1, 2)
    assert (again.created, again.request.pk) == (False, first.request.pk)
    with pytest.raises(AdjustmentRequestConflict):
        adjustment_request_open(bill_number=other.number, external_reference="MATCH-1")


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        ("AUTHORISED", Outcome.SUCCEEDED),
        ("PAID", Outcome.SUCCEEDED),
        ("DRAFT", Outcome.NEEDS_REVIEW),
        ("SUBMITTED", Outcome.NEEDS_REVIEW),
        ("VOIDED", Outcome.FAILED_FINAL),
        ("DELETED", Outcome.FAILED_FINAL),
    ],
)
def test_a_created_credit_notes_status_maps_to_its_row_of_the_answer_table(status: str, outcome: Outcome) -> None:
    assert outcome_of_credit_note_status(status) == outcome


def test_a_validation_error_fails_the_first_send_but_proves_nothing_on_a_resend() -> None:
    """A resend past key retention may be refused because the first attempt already used the
    amount due: that is the row "an error an earlier attempt may explain" (UNKNOWN)."""
    error = DefinitiveError("over the amount due", http_status=400)
    assert answer_from_create_error(error, resend=False).outcome == Outcome.FAILED_FINAL
    assert answer_from_create_error(error, resend=True).outcome == Outcome.UNKNOWN
    assert answer_from_create_error(AmbiguousError("timeout"), resend=False).outcome == Outcome.UNKNOWN
    mismatch = IdempotencyMismatchError("key reused", http_status=422)
    assert answer_from_create_error(mismatch, resend=False).outcome == Outcome.NEEDS_REVIEW


def test_the_kind_is_registered_with_its_contract_and_owner_group() -> None:
    kind = kind_for("invoice-adjustment")
    contract = kind.contract()
    assert kind.owner_group == "accounts payable"
    assert (contract.honours_keys, contract.supports_lookup, contract.lookup_authoritative) == (True, True, True)
    assert contract.can_settle_later is False and contract.step_class == "create"
    assert contract.key_retention is not None and contract.key_retention.total_seconds() < 24 * 3600
    assert "void" in contract.correction_path
