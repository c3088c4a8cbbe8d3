"""The manager's pages with invoice adjustments: the inbox shows both kinds with a kind filter,
and the detail page shows the bill (amount, amount due, earlier adjustments, the PO mismatch)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.test import Client

from actions.foundation.trail import Actor
from actions.kinds.invoice_adjustment.proposal import action_propose_invoice_adjustment
from actions.kinds.refund.proposal import action_propose_refund
from actions.models import Action, ActionStatus
from tests.approvals.test_views import shown_now
from tests.factories import make_adjustment_request, make_bill, make_order, make_request

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def manual_decisions(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.AUTO_APPROVAL_ENABLED = False
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)


@pytest.fixture
def both(agent_actor: Actor) -> tuple[Action, Action]:
    order = make_order(number="4821")
    refund = action_propose_refund(
        order_number=order.number,
        request_number=make_request(order).number,
        amount="12.00",
        currency="EUR",
        reason_code="damaged",
        proposer=agent_actor,
    ).action
    bill = make_bill(number="INV-2291", amount="200.00", amount_due="180.00")
    adjustment = action_propose_invoice_adjustment(
        bill_number=bill.number,
        adjustment_number=make_adjustment_request(bill).number,
        amount="20.00",
        currency="EUR",
        reason_code="price_mismatch",
        evidence="PO says 18.00 a unit.",
        proposer=agent_actor,
    ).action
    return refund, adjustment


def test_the_inbox_shows_both_kinds_and_filters_by_kind(
    client: Client, manager: Any, both: tuple[Action, Action]
) -> None:
    refund, adjustment = both
    client.force_login(manager)
    page = client.get("/approvals/").content.decode()
    assert f'id="action-{refund.pk}"' in page and f'id="action-{adjustment.pk}"' in page
    assert "Bill INV-2291" in page and "Order 4821" in page

    only = client.get("/approvals/?kind=invoice-adjustment").content.decode()
    assert f'id="action-{adjustment.pk}"' in only and f'id="action-{refund.pk}"' not in only
    refunds = client.get("/approvals/?kind=refund").content.decode()
    assert f'id="action-{refund.pk}"' in refunds and f'id="action-{adjustment.pk}"' not in refunds


def test_the_detail_page_shows_the_bill_its_earlier_adjustments_and_the_po_mismatch(
    client: Client, manager: Any, both: tuple[Action, Action], agent_actor: Actor
) -> None:
    _, adjustment = both
    assert adjustment.bill is not None
    earlier = action_propose_invoice_adjustment(
        bill_number=adjustment.bill.number,
        adjustment_number=make_adjustment_request(adjustment.bill).number,
        amount="5.00",
        currency="EUR",
        reason_code="quantity_mismatch",
        proposer=agent_actor,
    ).action
    Action.objects.filter(pk=earlier.pk).update(status=ActionStatus.SUCCEEDED, provider_reference="cn-earlier")
    client.force_login(manager)
    page = client.get(f"/approvals/{adjustment.pk}/").content.decode()
    assert "Adjustment to bill INV-2291" in page
    assert 'data-testid="bill-panel"' in page
    assert "200.00" in page and "180.00" in page  # amount and amount due
    assert "Unit price 20.00 on the bill, 18.00 on the purchase order." in page
    assert "Earlier adjustments" in page and earlier.action_id in page and "cn-earlier" in page


def test_a_manager_approves_an_adjustment_above_the_threshold(
    client: Client, manager: Any, both: tuple[Action, Action]
) -> None:
    _, adjustment = both
    client.force_login(manager)
    answer = client.post(
        f"/approvals/{adjustment.pk}/decide", {"decision": "approve", "note": "PO checked", **shown_now(adjustment)}
    )
    assert answer.status_code in (200, 302)
    adjustment.refresh_from_db()
    assert adjustment.status == ActionStatus.AUTHORIZED
    approval = adjustment.approvals.get()
    assert (approval.order_version, approval.amount) == (adjustment.bill.version, Decimal("20.00"))  # type: ignore[union-attr]
