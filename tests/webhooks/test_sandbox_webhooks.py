"""The sandbox's signed webhooks against the console's endpoint, over HTTP.

An outside refund made at the sandbox (its control endpoint, as a person in the provider's
dashboard would) reaches the console as signed events; the order's version rises and the
manager's approval, bound to the old version, goes stale at the claim, with the reason in
plain words. A forged event gets a 400. A console that is down gets the event again later.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
import requests
from django.test import Client

from actions.engine.claim import ClaimOutcome, submission_begin
from actions.kinds.refund.proposal import action_propose_refund
from actions.models import ActionStatus, Order, OrderEvent, OutsideRefund, WebhookEvent
from actions.services import Actor
from approvals.models import Decision
from approvals.services import approval_decide
from tests.factories import make_order, make_request
from tests.processes import wait_until
from tests.providers.sandbox_client import SandboxClient

pytestmark = [pytest.mark.postgres, pytest.mark.processes, pytest.mark.django_db(transaction=True)]

SECRET = "whsec_sandbox_test"


@pytest.fixture
def endpoint(live_server: Any, live_sandbox: SandboxClient, settings: Any) -> Iterator[str]:
    settings.PROVIDER_WEBHOOK_SECRET = SECRET
    url = f"{live_server.url}/webhooks/stripe"
    live_sandbox.control("POST", "webhooks", {"url": url, "secret": SECRET, "retry_base_seconds": 0.2})
    yield url
    live_sandbox.control("POST", "webhooks", {"url": ""})


@pytest.fixture(autouse=True)
def no_publish(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)


def pending_events(sandbox: SandboxClient) -> int:
    return int(sandbox.control("GET", "webhooks")["pending"])


def test_an_outside_refund_from_the_sandbox_makes_a_managers_pending_approval_go_stale(
    endpoint: str, live_sandbox: SandboxClient, agent_actor: Actor, manager: Any, client: Client
) -> None:
    """Seed 000's example: 30 EUR refunded in the provider's dashboard while a 79 EUR approval
    waits. The approval was bound to the order's old version (docs/architecture.md section 5)."""
    order = make_order(captured="100.00")
    live_sandbox.seed_charge(order.charge_reference, 10000, "eur")
    action = action_propose_refund(
        order_number=order.number,
        request_number=make_request(order).number,
        amount="79.00",
        currency="EUR",
        reason_code="damaged",
        proposer=agent_actor,
    ).action
    approval_decide(action_pk=action.pk, user=manager, decision=Decision.APPROVE)

    refund = live_sandbox.control("POST", "outside_refunds", {"charge": order.charge_reference, "amount": 3000})

    wait_until(lambda: pending_events(live_sandbox) == 0, timeout=20, what="the sandbox to deliver its events")
    assert set(WebhookEvent.objects.values_list("type", flat=True)) == {"refund.created", "charge.refunded"}
    order.refresh_from_db()
    assert order.outside_refunded_amount == Decimal("30.00")
    assert OutsideRefund.objects.get().reference == refund["id"]
    assert OrderEvent.objects.filter(order=order).count() == 1

    assert submission_begin(action_pk=action.pk).outcome == ClaimOutcome.STALE
    action.refresh_from_db()
    assert action.status == ActionStatus.STALE
    client.force_login(manager)
    inbox = client.get("/approvals/").content.decode()
    assert f"A refund was made outside the console, at the payment provider: 30.00 EUR ({refund['id']})" in inbox
    assert "The order now has 70.00 EUR left to refund." in inbox


def test_a_forged_event_is_refused_with_400(endpoint: str, live_sandbox: SandboxClient) -> None:
    order = make_order(captured="100.00")
    body = json.dumps(
        {
            "id": "evt_forged",
            "type": "refund.created",
            "data": {
                "object": {"id": "re_forged", "charge": order.charge_reference, "amount": 9000, "status": "succeeded"}
            },
        }
    )
    response = requests.post(
        endpoint, data=body, headers={"Stripe-Signature": "t=1700000000,v1=" + "0" * 64}, timeout=10
    )

    assert response.status_code == 400
    assert not WebhookEvent.objects.exists()
    assert Order.objects.get(pk=order.pk).outside_refunded_amount == Decimal("0")


def test_the_sandbox_delivers_again_once_the_console_answers(
    live_server: Any, live_sandbox: SandboxClient, settings: Any
) -> None:
    """A delivery that fails (the console is unreachable) is retried until it gets a 2xx."""
    settings.PROVIDER_WEBHOOK_SECRET = SECRET
    order = make_order(captured="100.00")
    live_sandbox.seed_charge(order.charge_reference, 10000, "eur")
    live_sandbox.control(
        "POST", "webhooks", {"url": f"{live_server.url}/no-such-endpoint", "secret": SECRET, "retry_base_seconds": 0.2}
    )
    live_sandbox.control("POST", "outside_refunds", {"charge": order.charge_reference, "amount": 1000})
    wait_until(lambda: live_sandbox.control("GET", "webhooks")["delivery_attempts"] >= 2, timeout=20, what="retries")
    assert not WebhookEvent.objects.exists()

    live_sandbox.control("POST", "webhooks", {"url": f"{live_server.url}/webhooks/stripe"})

    wait_until(lambda: pending_events(live_sandbox) == 0, timeout=30, what="the retried delivery")
    assert Order.objects.get(pk=order.pk).outside_refunded_amount == Decimal("10.00")
    live_sandbox.control("POST", "webhooks", {"url": ""})


def test_an_outside_refund_that_fails_at_the_provider_gives_the_order_its_money_back(
    endpoint: str, live_sandbox: SandboxClient
) -> None:
    """A pending outside refund is booked at once (the provider holds the money); when it fails,
    refund.failed reverses the booking and the order's history says so."""
    order = make_order(captured="100.00")
    live_sandbox.seed_charge(order.charge_reference, 10000, "eur")
    live_sandbox.configure(pending_outcome="failed", pending_settle_after_seconds=3600)
    refund = live_sandbox.control(
        "POST", "outside_refunds", {"charge": order.charge_reference, "amount": 2500, "status": "pending"}
    )
    wait_until(lambda: pending_events(live_sandbox) == 0, timeout=20, what="refund.created")
    assert Order.objects.get(pk=order.pk).outside_refunded_amount == Decimal("25.00")

    live_sandbox.settle(refund=refund["id"])

    wait_until(lambda: pending_events(live_sandbox) == 0, timeout=20, what="refund.updated and refund.failed")
    order.refresh_from_db()
    assert order.outside_refunded_amount == Decimal("0")
    assert set(WebhookEvent.objects.values_list("type", flat=True)) == {
        "refund.created",
        "refund.updated",
        "refund.failed",
    }
    messages = list(OrderEvent.objects.filter(order=order).order_by("pk").values_list("message", flat=True))
    assert len(messages) == 2
    assert "failed at the payment provider" in messages[1]
