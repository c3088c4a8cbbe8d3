"""POST /webhooks/stripe: signed events only, stored once by id, outside refunds booked."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from actions.engine.claim import ClaimOutcome, submission_begin
from actions.engine.invariants import check_effects
from actions.kinds.base import Effect, Outcome
from actions.kinds.refund.contract import RefundKind
from actions.kinds.refund.proposal import action_propose_refund
from actions.models import (
    Action,
    ActionStatus,
    Order,
    OrderEvent,
    OrderEventKind,
    OutsideRefund,
    WebhookEvent,
    WebhookEventOutcome,
)
from actions.services import Actor
from approvals.models import Decision
from approvals.services import approval_decide
from harness.sandboxes.payment.webhooks import sign
from tests.factories import make_order, make_request

pytestmark = pytest.mark.django_db

S = ActionStatus
SECRET = "whsec_test_endpoint"
URL = "/webhooks/stripe"


@pytest.fixture(autouse=True)
def endpoint_secret(settings: Any) -> None:
    settings.PROVIDER_WEBHOOK_SECRET = SECRET


@pytest.fixture(autouse=True)
def published(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[Any, ...]]]:
    sent: list[tuple[str, tuple[Any, ...]]] = []
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: sent.append(("dispatch", (pk,))))
    monkeypatch.setattr("actions.foundation.publish.app.send_task", lambda name, args: sent.append((name, tuple(args))))
    return sent


def refund_object(
    *, reference: str, charge: str, amount: int, status: str = "succeeded", action_id: str | None = None
) -> dict[str, Any]:
    return {
        "id": reference,
        "object": "refund",
        "amount": amount,
        "charge": charge,
        "currency": "eur",
        "metadata": {"action_id": action_id} if action_id else {},
        "status": status,
    }


def event(event_type: str, obj: dict[str, Any], *, event_id: str = "evt_1") -> bytes:
    body = {"id": event_id, "object": "event", "type": event_type, "created": int(time.time()), "data": {"object": obj}}
    return json.dumps(body).encode()


def post(client: Client, payload: bytes, *, secret: str = SECRET, signature: str | None = None) -> Any:
    header = signature if signature is not None else sign(payload, secret, int(time.time()))
    return client.post(URL, data=payload, content_type="application/json", headers={"Stripe-Signature": header})


def test_it_refuses_a_forged_signature_with_400_and_writes_nothing(client: Client) -> None:
    order = make_order(captured="100.00")
    payload = event("refund.created", refund_object(reference="re_x", charge=order.charge_reference, amount=3000))

    for response in (
        post(client, payload, secret="whsec_somebody_else"),
        post(client, payload, signature=""),
        post(client, payload, signature="t=1,v1=deadbeef"),
    ):
        assert response.status_code == 400

    assert not WebhookEvent.objects.exists()
    assert not OutsideRefund.objects.exists()
    order.refresh_from_db()
    assert (order.outside_refunded_amount, order.version) == (Decimal("0"), 1)


def test_it_refuses_a_signed_body_that_is_not_an_event(client: Client) -> None:
    assert post(client, b"not json").status_code == 400
    assert post(client, json.dumps({"type": "refund.created"}).encode()).status_code == 400
    assert not WebhookEvent.objects.exists()


def test_it_rejects_get(client: Client) -> None:
    assert client.get(URL).status_code == 405


def test_an_outside_refund_is_booked_on_its_order_raises_the_version_and_enters_the_history(client: Client) -> None:
    order = make_order(captured="100.00")
    payload = event("refund.created", refund_object(reference="re_out", charge=order.charge_reference, amount=3000))

    response = post(client, payload)

    assert response.status_code == 200
    assert response.json()["outcome"] == WebhookEventOutcome.OUTSIDE_REFUND
    order.refresh_from_db()
    assert order.outside_refunded_amount == Decimal("30.00")
    assert order.refundable_amount == Decimal("70.00")
    assert order.version == 2
    (history,) = OrderEvent.objects.filter(order=order)
    assert history.kind == OrderEventKind.OUTSIDE_REFUND
    assert "30.00 EUR was refunded outside the console" in history.message
    assert WebhookEvent.objects.get().event_id == "evt_1"


def test_a_replayed_event_changes_nothing(client: Client) -> None:
    order = make_order(captured="100.00")
    payload = event("refund.created", refund_object(reference="re_out", charge=order.charge_reference, amount=3000))
    post(client, payload)

    again = post(client, payload)

    assert again.status_code == 200
    assert again.json()["replay"] is True
    order.refresh_from_db()
    assert (order.outside_refunded_amount, order.version) == (Decimal("30.00"), 2)
    assert OrderEvent.objects.count() == 1
    assert WebhookEvent.objects.get().deliveries == 2


def test_the_same_refund_in_another_event_is_booked_once(client: Client) -> None:
    """charge.refunded and refund.created both name the refund; it is one outside refund."""
    order = make_order(captured="100.00")
    refund = refund_object(reference="re_out", charge=order.charge_reference, amount=3000)
    post(client, event("refund.created", refund, event_id="evt_a"))
    charge = {"id": order.charge_reference, "object": "charge", "refunds": {"data": [refund]}}

    post(client, event("charge.refunded", charge, event_id="evt_b"))

    order.refresh_from_db()
    assert (order.outside_refunded_amount, order.version) == (Decimal("30.00"), 2)
    assert WebhookEvent.objects.count() == 2


def test_an_outside_refund_that_fails_later_gives_the_money_back_and_stays_failed(client: Client) -> None:
    order = make_order(captured="100.00")
    pending = refund_object(reference="re_out", charge=order.charge_reference, amount=3000, status="pending")
    post(client, event("refund.created", pending, event_id="evt_a"))

    post(client, event("refund.failed", {**pending, "status": "failed"}, event_id="evt_b"))
    # An older event delivered late does not book it again.
    post(client, event("refund.updated", pending, event_id="evt_c"))

    order.refresh_from_db()
    assert order.outside_refunded_amount == Decimal("0")
    assert order.version == 3
    assert list(OrderEvent.objects.filter(order=order).values_list("kind", flat=True)) == [
        OrderEventKind.OUTSIDE_REFUND,
        OrderEventKind.OUTSIDE_REFUND_REVERSED,
    ]
    assert RefundKind().money_violations()[1] == []


def test_a_refund_of_a_known_action_asks_for_reconciliation_now_and_books_nothing_on_the_order(
    client: Client,
    agent_actor: Actor,
    published: list[tuple[str, tuple[Any, ...]]],
    django_capture_on_commit_callbacks: Any,
) -> None:
    """The event is not the outcome: the reconciler asks the provider and records its answer."""
    order = make_order(captured="100.00")
    action = action_propose_refund(
        order_number=order.number,
        request_number=make_request(order).number,
        amount="20.00",
        currency="EUR",
        reason_code="damaged",
        proposer=agent_actor,
    ).action
    assert submission_begin(action_pk=action.pk).outcome == ClaimOutcome.CLAIMED
    later = timezone.now() + timedelta(hours=1)
    Action.objects.filter(pk=action.pk).update(
        status=S.SETTLING, lease_token=None, lease_expires_at=None, next_reconcile_at=later
    )
    refund = refund_object(reference="re_ours", charge=order.charge_reference, amount=2000, action_id=action.action_id)

    with django_capture_on_commit_callbacks(execute=True):
        response = post(client, event("refund.updated", refund))

    assert response.json()["outcome"] == WebhookEventOutcome.SETTLES_ACTION
    action.refresh_from_db()
    assert action.status == S.SETTLING, "only the reconciler records an outcome"
    assert action.next_reconcile_at is not None and action.next_reconcile_at <= timezone.now()
    assert ("actions.tasks.reconcile", (action.pk, None)) in published
    order.refresh_from_db()
    assert order.outside_refunded_amount == Decimal("0")
    assert not OutsideRefund.objects.exists()


def test_an_outside_refund_makes_a_managers_pending_approval_go_stale_and_says_why(
    client: Client, agent_actor: Actor, manager: Any
) -> None:
    """docs/architecture.md section 5: the approval was bound to the order's version before the refund."""
    order = make_order(captured="100.00")
    action = action_propose_refund(
        order_number=order.number,
        request_number=make_request(order).number,
        amount="79.00",
        currency="EUR",
        reason_code="damaged",
        proposer=agent_actor,
    ).action
    approval_decide(action_pk=action.pk, user=manager, decision=Decision.APPROVE)
    post(
        client, event("refund.created", refund_object(reference="re_dash", charge=order.charge_reference, amount=3000))
    )

    assert submission_begin(action_pk=action.pk).outcome == ClaimOutcome.STALE

    action.refresh_from_db()
    assert action.status == S.STALE
    client.force_login(manager)
    inbox = client.get("/approvals/").content.decode()
    assert "A refund was made outside the console, at the payment provider: 30.00 EUR (re_dash)" in inbox
    assert "The order now has 70.00 EUR left to refund." in inbox
    detail = client.get(f"/approvals/{action.pk}/").content.decode()
    assert "30.00 EUR was refunded outside the console" in detail


def test_the_audit_counts_a_booked_outside_refund_as_explained_and_an_unbooked_one_as_a_violation(
    client: Client,
) -> None:
    order = make_order(captured="100.00")
    post(client, event("refund.created", refund_object(reference="re_out", charge=order.charge_reference, amount=3000)))
    ledger = [
        Effect(
            reference=reference,
            status="succeeded",
            outcome=Outcome.SUCCEEDED,
            amount_minor=3000,
            currency="EUR",
            action_id=None,
        )
        for reference in ("re_out", "re_unknown")
    ]

    report = check_effects(ledger=ledger)

    assert report.explained == 1
    assert [(v.invariant, v.subject) for v in report.violations] == [(1, "re_unknown")]
    assert Order.objects.get(pk=order.pk).outside_refunded_amount == Decimal("30.00")
