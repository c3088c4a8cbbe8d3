"""An invoice adjustment's money on its bill: what the claim reserves and refuses, and what the
answer books or releases (docs/architecture.md invariant 5, for bills), in memory.

The scenario tests that reach these through a send need the accounting sandbox's process, which
the mutation runs' fast subset leaves out; these drive the claim and ``apply_outcome`` directly
(written against the survivors of the thirteenth batch, tests/MUTATION.md).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from actions.engine.claim import Claim, ClaimOutcome, submission_begin
from actions.foundation.trail import Actor
from actions.kinds.base import Answer, Outcome
from actions.kinds.invoice_adjustment.contract import effect_from_credit_note
from actions.models import Action, ActionStatus, Bill
from actions.providers.base import DefinitiveError
from approvals.services import approval_decide
from tests.actions.test_admin_credit_note_void import credit_note
from tests.actions.test_apply_outcome import apply
from tests.factories import make_adjustment_request, make_bill
from tests.kinds.test_invoice_adjustment import propose

pytestmark = pytest.mark.django_db
S = ActionStatus


@pytest.fixture(autouse=True)
def managers_decide(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every adjustment here is approved by a manager (no auto-approval), and nothing is sent."""
    settings.INVOICE_ADJUSTMENT_AUTO_APPROVAL_THRESHOLDS = {}
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)


def approved(bill: Bill, amount: str, proposer: Actor, manager: Any) -> Action:
    action = propose(bill, make_adjustment_request(bill).number, amount, proposer)
    approval_decide(action_pk=action.pk, user=manager, decision="approve", note="ok")
    return action


def money(bill: Bill) -> tuple[Decimal, Decimal, int]:
    bill.refresh_from_db()
    return bill.adjusted_amount, bill.reserved_amount, bill.version


def claimed(action: Action) -> Claim:
    claim = submission_begin(action_pk=action.pk)
    assert claim.outcome == ClaimOutcome.CLAIMED, claim.failures
    return claim


# --- the claim's reservation ---------------------------------------------------------------------


def test_a_claim_reserves_on_its_own_bill_and_no_other(agent_actor: Actor, manager: Any) -> None:
    bill, other = make_bill(amount="100.00"), make_bill(amount="100.00")
    action = approved(bill, "50.00", agent_actor, manager)

    claimed(action)

    assert money(bill) == (Decimal("0.00"), Decimal("50.00"), 2)
    assert money(other) == (Decimal("0.00"), Decimal("0.00"), 1)


def test_a_claim_may_reserve_the_whole_adjustable_balance(agent_actor: Actor, manager: Any) -> None:
    bill = make_bill(amount="100.00")
    action = approved(bill, "50.00", agent_actor, manager)
    Bill.objects.filter(pk=bill.pk).update(adjusted_amount=Decimal("20.00"), reserved_amount=Decimal("30.00"))

    claimed(action)

    assert money(bill) == (Decimal("20.00"), Decimal("80.00"), 2)


def test_a_bill_voided_since_the_approval_stops_the_claim_and_says_so(agent_actor: Actor, manager: Any) -> None:
    bill = make_bill(amount="100.00")
    action = approved(bill, "50.00", agent_actor, manager)
    Bill.objects.filter(pk=bill.pk).update(voided=True)  # the version is the one approved

    claim = submission_begin(action_pk=action.pk)

    assert claim.outcome == ClaimOutcome.STALE
    assert claim.failures == [
        {"binding": "bill_voided", "message": f"Bill {bill.number} was voided since the approval."}
    ]
    assert money(bill) == (Decimal("0.00"), Decimal("0.00"), 1)


@pytest.mark.parametrize(
    ("adjusted", "reserved"),
    [("0.00", "60.00"), ("60.00", "0.00"), ("30.00", "30.00")],
    ids=["reserved-meanwhile", "adjusted-meanwhile", "both"],
)
def test_a_balance_that_no_longer_covers_the_adjustment_stops_the_claim_and_says_how_much_is_left(
    agent_actor: Actor, manager: Any, adjusted: str, reserved: str
) -> None:
    """The bill's version is the one approved, yet its balance moved (the version guards the
    bill's own terms; the balance is checked on its own, in the same UPDATE)."""
    bill = make_bill(amount="100.00")
    action = approved(bill, "50.00", agent_actor, manager)
    Bill.objects.filter(pk=bill.pk).update(adjusted_amount=Decimal(adjusted), reserved_amount=Decimal(reserved))

    claim = submission_begin(action_pk=action.pk)

    assert claim.outcome == ClaimOutcome.STALE
    assert claim.failures == [
        {"binding": "balance", "message": "The bill's adjustable balance 40.00 EUR no longer covers 50.00."}
    ]
    assert money(bill) == (Decimal(adjusted), Decimal(reserved), 1)


# --- the answer books or releases it -------------------------------------------------------------


def record(claim: Claim, answer: Answer) -> str:
    assert claim.action is not None
    return apply(claim.action, answer, now=timezone.now())


def test_an_authorised_credit_note_turns_the_reservation_into_an_adjustment_of_its_bill_only(
    agent_actor: Actor, manager: Any
) -> None:
    bill, other = make_bill(amount="100.00"), make_bill(amount="100.00")
    Bill.objects.filter(pk=other.pk).update(reserved_amount=Decimal("30.00"))
    action = approved(bill, "50.00", agent_actor, manager)
    claim = claimed(action)

    effect = effect_from_credit_note(credit_note(action, "cn-1"))
    assert record(claim, Answer(Outcome.SUCCEEDED, effect=effect)) == S.SUCCEEDED

    assert money(bill) == (Decimal("50.00"), Decimal("0.00"), 2)
    assert money(other) == (Decimal("0.00"), Decimal("30.00"), 1)


def test_a_refused_credit_note_releases_the_reservation_on_its_bill_only(agent_actor: Actor, manager: Any) -> None:
    bill, other = make_bill(amount="100.00"), make_bill(amount="100.00")
    Bill.objects.filter(pk=other.pk).update(reserved_amount=Decimal("30.00"))
    action = approved(bill, "50.00", agent_actor, manager)
    claim = claimed(action)

    refused = Answer(Outcome.FAILED_FINAL, error=DefinitiveError("over the amount due", code="validation"))
    assert record(claim, refused) == S.FAILED_FINAL

    assert money(bill) == (Decimal("0.00"), Decimal("0.00"), 2)
    assert money(other) == (Decimal("0.00"), Decimal("30.00"), 1)
