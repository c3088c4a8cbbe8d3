"""An agent's owner sets a webhook in a real browser; a real Celery worker (with beat) then
delivers a correctly signed event for every state change of the agent's refund, although the
receiver answers 500 to the first deliveries; the owner's delivery log shows the attempts and
its Redeliver button sends an event again."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from actions.kinds.refund.proposal import action_propose_refund
from actions.models import Action, ActionEvent, ActionStatus, AgentWebhookDelivery
from approvals.services import approval_decide
from console_client.webhooks import verify_signature
from tests.agent_webhooks.receiver import Receiver
from tests.factories import PASSWORD, make_order, make_request
from tests.processes import WorkerPool, wait_until

pytestmark = [pytest.mark.browser, pytest.mark.processes, pytest.mark.django_db(transaction=True)]

FAIL_FIRST = 3


def _log_in(page: Page, url: str, user: Any) -> None:
    page.goto(f"{url}/login/")
    page.get_by_label("Username").fill(user.username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{url}/")


@pytest.fixture
def receiver(settings: Any) -> Any:
    # The stand-in receiver listens on loopback, which real deployments refuse (actions.foundation.egress).
    settings.AGENT_WEBHOOK_ALLOW_LOOPBACK = True
    running = Receiver(fail_first=FAIL_FIRST).start()
    yield running
    running.stop()


def test_the_receiver_gets_a_signed_event_for_every_state_change_even_when_first_deliveries_fail(
    live_server: Any,
    chromium_page: Callable[[], AbstractContextManager[Page]],
    screenshot_dir: Path,
    workers: WorkerPool,
    live_sandbox: Any,
    receiver: Receiver,
    agent: Any,
    agent_owner: Any,
    agent_actor: Any,
    manager: Any,
    settings: Any,
) -> None:
    # The proposal waits for the manager, so that the approval is a state change of its own.
    settings.AUTO_APPROVAL_ENABLED = False
    settings.SWEEP_INTERVAL_SECONDS = 1
    url = live_server.url

    with chromium_page() as page:
        _log_in(page, url, agent_owner)
        page.goto(f"{url}/account/")
        page.get_by_role("link", name=f"{agent.name}'s page").click()
        page.wait_for_url(f"{url}/account/agents/{agent.pk}/")
        page.get_by_label("Webhook URL").fill(receiver.url)
        page.get_by_role("button", name="Set URL and show the secret").click()
        secret = page.get_by_test_id("webhook-secret").inner_text().strip()
        page.screenshot(path=str(screenshot_dir / "agent-webhook-secret.png"), full_page=True)
        page.get_by_role("link", name="Done").click()
        expect(page.get_by_test_id("webhook-settings")).to_contain_text(secret[:14])
        # Shown once: the page now has only the prefix.
        expect(page.get_by_test_id("webhook-settings")).not_to_contain_text(secret)
    assert secret.startswith("whsec_")

    # Fast retries in the worker: 0.5 s, 1 s, 2 s... (the schedule is the same, only scaled).
    workers.start(
        beat=True, AGENT_WEBHOOK_BACKOFF_BASE_SECONDS="0.5", AUTO_APPROVAL_ENABLED="0", AGENT_WEBHOOK_ALLOW_LOOPBACK="1"
    )
    order = make_order(captured="100.00")
    live_sandbox.seed_charge(order.charge_reference, 10000, "eur")
    request = make_request(order)
    action = action_propose_refund(
        order_number=order.number,
        request_number=request.number,
        amount="20.00",
        currency="EUR",
        reason_code="damaged",
        proposer=agent_actor,
    ).action
    assert action.status == ActionStatus.PROPOSED
    approval_decide(action_pk=action.pk, user=manager, decision="approve", note="Photos check out.")
    wait_until(
        lambda: Action.objects.filter(pk=action.pk, status=ActionStatus.SUCCEEDED).exists(),
        what="the refund to succeed",
    )
    changes = [
        (event.pk, event.to_state)
        for event in ActionEvent.objects.filter(action=action).order_by("created_at", "pk")
        if event.from_state != event.to_state
    ]
    assert [state for _, state in changes] == ["PROPOSED", "AUTHORIZED", "SUBMITTING", "SUCCEEDED"]
    expected_ids = {f"evt_{pk}" for pk, _ in changes}

    def delivered_ids() -> set[str]:
        return {
            verify_signature(got.body, got.headers["Console-Signature"], secret)["id"]
            for got in receiver.snapshot()
            if got.answered == 200
        }

    wait_until(lambda: delivered_ids() >= expected_ids, timeout=60, what="every event to be delivered")
    received = receiver.snapshot()
    # Every request, failed or not, carries a valid signature over its exact body.
    events = [verify_signature(got.body, got.headers["Console-Signature"], secret) for got in received]
    assert [got.answered for got in received[:FAIL_FIRST]] == [500] * FAIL_FIRST
    by_id = {event["id"]: event for event in events}
    assert {by_id[f"evt_{pk}"]["data"]["status"] for pk, _ in changes} == {state for _, state in changes}
    assert all(by_id[i]["data"]["action_id"] == action.action_id for i in expected_ids)
    assert by_id[f"evt_{changes[-1][0]}"]["data"]["provider_reference"].startswith("re_")
    # The worker records the 200 just after the receiver sent it.
    wait_until(
        lambda: not AgentWebhookDelivery.objects.filter(action=action).exclude(status="delivered").exists(),
        what="every delivery to be recorded as delivered",
    )
    retried = AgentWebhookDelivery.objects.filter(action=action, attempts__gt=1).count()
    assert retried >= 1, "the failed deliveries were retried"
    first_delivery = AgentWebhookDelivery.objects.filter(action=action).order_by("pk").first()
    assert first_delivery is not None
    before = len(received)

    with chromium_page() as page:
        _log_in(page, url, agent_owner)
        page.goto(f"{url}/account/agents/{agent.pk}/")
        log = page.get_by_test_id("delivery-log")
        expect(log).to_contain_text("answered 500")
        expect(log).to_contain_text("answered 200")
        page.screenshot(path=str(screenshot_dir / "agent-webhook-deliveries.png"), full_page=True)
        page.locator(f"#delivery-{first_delivery.pk}").get_by_role("button", name="Redeliver").click()
        expect(page.locator(".messages")).to_contain_text(f"Event {first_delivery.event_id} is queued")
        wait_until(lambda: len(receiver.snapshot()) > before, what="the redelivery")
    again = receiver.snapshot()[before]
    assert verify_signature(again.body, again.headers["Console-Signature"], secret)["id"] == first_delivery.event_id
