"""The per-target cap on auto-approval applies to a supplier bill
as it does to an order, so an agent cannot credit a bill away in small auto-approved pieces.

The kind's own per-bill setting (INVOICE_ADJUSTMENT_AUTO_APPROVAL_PER_BILL_CAP) is set far
above here, so what stops the proposals is the cap of approvals/caps.py and nothing else.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from actions.kinds.invoice_adjustment.proposal import action_propose_invoice_adjustment
from actions.models import Action, ActionEvent, ActionStatus, Bill
from actions.services import Actor
from approvals.caps import AUTO_APPROVAL_HELD
from approvals.models import Approval, ApprovalPolicy, AutoApprovalCap, CapScope
from tests.factories import make_adjustment_request, make_bill

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def only_the_issue_15_cap(settings: Any) -> None:
    settings.AUTO_APPROVAL_ENABLED = True
    settings.INVOICE_ADJUSTMENT_AUTO_APPROVAL_PER_BILL_CAP = {"EUR": Decimal("100000")}
    settings.AUTO_APPROVAL_AGENT_DAILY_AMOUNTS = {"EUR": Decimal("100000")}


def adjust(agent_actor: Actor, bill: Bill, amount: str) -> Action:
    request = make_adjustment_request(bill)
    return action_propose_invoice_adjustment(
        bill_number=bill.number,
        adjustment_number=request.number,
        amount=amount,
        currency="EUR",
        reason_code="price_mismatch",
        proposer=agent_actor,
    ).action


def auto_approved(action: Action) -> bool:
    return Approval.objects.filter(action=action, policy=ApprovalPolicy.AUTO).exists()


def held_reason(action: Action) -> str:
    return ActionEvent.objects.get(action=action, transition=AUTO_APPROVAL_HELD).reason


def test_the_auto_approvals_on_one_bill_are_counted_and_the_next_waits_for_a_manager(
    agent_actor: Actor, settings: Any
) -> None:
    settings.AUTO_APPROVAL_TARGET_MAX_COUNT = 2
    bill = make_bill(amount="500.00")
    first, second = adjust(agent_actor, bill, "10.00"), adjust(agent_actor, bill, "10.00")

    third = adjust(agent_actor, bill, "10.00")
    elsewhere = adjust(agent_actor, make_bill(amount="500.00"), "10.00")

    assert auto_approved(first) and auto_approved(second)
    assert third.status == ActionStatus.PROPOSED and not auto_approved(third)
    assert f"bill {bill.number}" in held_reason(third) and "at most 2" in held_reason(third)
    assert auto_approved(elsewhere), "the cap is per bill: another bill has its own"


def test_the_amount_auto_approved_on_one_bill_is_capped(agent_actor: Actor, settings: Any) -> None:
    settings.AUTO_APPROVAL_TARGET_MAX_COUNT = 10
    settings.AUTO_APPROVAL_TARGET_MAX_AMOUNTS = {"EUR": Decimal("30")}
    bill = make_bill(amount="500.00")
    first = adjust(agent_actor, bill, "20.00")

    over = adjust(agent_actor, bill, "10.01")
    within = adjust(agent_actor, bill, "10.00")

    assert auto_approved(first)
    assert over.status == ActionStatus.PROPOSED and not auto_approved(over)
    assert "passes" not in held_reason(over) and "cap of 30 EUR" in held_reason(over)
    assert auto_approved(within), "20.00 + 10.00 is at the cap, not past it"


def test_an_admins_target_cap_row_applies_to_bills(agent_actor: Actor, settings: Any) -> None:
    settings.AUTO_APPROVAL_TARGET_MAX_COUNT = 10
    AutoApprovalCap.objects.create(
        scope=CapScope.TARGET, currency="EUR", max_amount=Decimal("15"), max_count=None, window_hours=24
    )
    bill = make_bill(amount="500.00")

    held = adjust(agent_actor, bill, "15.01")

    assert held.status == ActionStatus.PROPOSED and not auto_approved(held)
    assert f"bill {bill.number}" in held_reason(held)
