"""The agent webhooks' outbox: written with the state change, in its transaction; delivered,
signed, retried with exponential backoff, given up after the window; redelivered on request."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from actions.agents.webhooks import (
    WebhookChangeRefused,
    WebhookInvalid,
    webhook_backoff_seconds,
    webhook_deliver,
    webhook_redeliver_by_owner,
    webhook_secret_rotate_by_owner,
    webhook_set_by_owner,
    webhook_sweep_due,
)
from actions.foundation.outbox import webhook_sign
from actions.foundation.trail import action_transition, event_record
from actions.models import Action, ActionEvent, AgentWebhookDelivery, DeliveryStatus, SecurityEvent
from actions.services import Actor
from approvals.services import approval_decide
from console_client.webhooks import SignatureInvalid, verify_signature
from tests.agent_webhooks.receiver import Receiver
from tests.approvals.test_views import propose

pytestmark = pytest.mark.django_db


@pytest.fixture
def published(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, Any]]:
    calls: list[tuple[int, Any]] = []
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)
    monkeypatch.setattr(
        "actions.foundation.outbox.webhook_publish", lambda pk, countdown=None: calls.append((pk, countdown))
    )
    monkeypatch.setattr(
        "actions.agents.webhooks.webhook_publish", lambda pk, countdown=None: calls.append((pk, countdown))
    )
    return calls


@pytest.fixture
def receiver(settings: Any) -> Any:
    # The stand-in receiver listens on loopback, which real deployments refuse (actions.foundation.egress).
    settings.AGENT_WEBHOOK_ALLOW_LOOPBACK = True
    running = Receiver().start()
    yield running
    running.stop()


@pytest.fixture
def hooked(agent: Any, agent_owner: Any, receiver: Receiver, settings: Any) -> str:
    settings.AUTO_APPROVAL_ENABLED = False
    issued = webhook_set_by_owner(agent=agent, user=agent_owner, url=receiver.url)
    assert issued is not None
    return issued.plain


def test_a_state_change_writes_one_outbox_row_in_its_transaction(
    hooked: str, agent_actor: Actor, manager: Any, published: list[Any]
) -> None:
    action = propose(agent_actor)
    rows = list(AgentWebhookDelivery.objects.filter(action=action))
    assert [row.event_type for row in rows] == ["action.proposed"]
    event = ActionEvent.objects.get(action=action)
    assert rows[0].audit_event_id == event.pk
    assert rows[0].payload["data"]["action_id"] == action.action_id
    assert rows[0].payload["data"]["status"] == "PROPOSED"

    approval_decide(action_pk=action.pk, user=manager, decision="approve")
    assert list(
        AgentWebhookDelivery.objects.filter(action=action).order_by("pk").values_list("event_type", flat=True)
    ) == [
        "action.proposed",
        "action.authorized",
    ]


def test_the_outbox_row_is_visible_inside_the_transaction_and_gone_when_it_rolls_back(
    hooked: str, agent_actor: Actor, published: list[Any]
) -> None:
    action = propose(agent_actor)
    before = AgentWebhookDelivery.objects.count()
    events_before = ActionEvent.objects.count()

    class Abandon(Exception):
        pass

    with pytest.raises(Abandon), transaction.atomic():
        fresh = Action.objects.select_for_update().get(pk=action.pk)
        action_transition(action=fresh, transition="cancel", actor=Actor.system("test"))
        # Written by the change itself, before any commit (not in an on_commit hook) ...
        assert AgentWebhookDelivery.objects.filter(action=action, event_type="action.cancelled").exists()
        raise Abandon
    # ... and on the same connection's transaction: the rollback takes it with the change.
    assert AgentWebhookDelivery.objects.count() == before
    assert ActionEvent.objects.count() == events_before
    assert Action.objects.get(pk=action.pk).status == "PROPOSED"


@pytest.mark.django_db(transaction=True)
def test_the_publish_happens_only_after_the_commit(hooked: str, agent_actor: Actor, published: list[Any]) -> None:
    action = propose(agent_actor)
    published.clear()
    with transaction.atomic():
        fresh = Action.objects.select_for_update().get(pk=action.pk)
        action_transition(action=fresh, transition="cancel", actor=Actor.system("test"))
        assert published == []
    row = AgentWebhookDelivery.objects.get(action=action, event_type="action.cancelled")
    assert published == [(row.pk, None)]


def test_no_row_without_a_webhook_or_for_a_change_that_is_no_state_change(
    agent_actor: Actor, agent: Any, agent_owner: Any, published: list[Any], settings: Any
) -> None:
    settings.AUTO_APPROVAL_ENABLED = False
    action = propose(agent_actor)
    assert not AgentWebhookDelivery.objects.filter(action=action).exists()
    webhook_set_by_owner(agent=agent, user=agent_owner, url="https://agent.example/hooks")
    # An audit line that changes no state (a note, a held auto-approval) is not an event.
    with transaction.atomic():
        event_record(action=action, transition="note", from_state=action.status, actor=Actor.system("test"))
    assert not AgentWebhookDelivery.objects.filter(action=action).exists()


def test_a_delivery_is_signed_so_the_client_verifies_it(
    hooked: str, agent_actor: Actor, receiver: Receiver, published: list[Any]
) -> None:
    action = propose(agent_actor)
    row = AgentWebhookDelivery.objects.get(action=action)
    assert webhook_deliver(row.pk) == "delivered"
    [got] = receiver.snapshot()
    event = verify_signature(got.body, got.headers["Console-Signature"], hooked)
    assert event["id"] == row.event_id
    assert event["type"] == "action.proposed"
    assert event["data"]["action_id"] == action.action_id
    with pytest.raises(SignatureInvalid):
        verify_signature(got.body, got.headers["Console-Signature"], hooked + "x")
    with pytest.raises(SignatureInvalid):
        verify_signature(got.body.replace(b"PROPOSED", b"SUCCEEDED"), got.headers["Console-Signature"], hooked)
    row.refresh_from_db()
    assert row.status == DeliveryStatus.DELIVERED
    assert row.attempt_log.get().status_code == 200


def test_verify_refuses_an_old_timestamp_and_a_malformed_header() -> None:
    body = json.dumps({"id": "evt_1"}).encode()
    old = int(time.time()) - 3600
    header = webhook_sign(secret="whsec_x", timestamp=old, body=body)
    with pytest.raises(SignatureInvalid, match="timestamp"):
        verify_signature(body, header, "whsec_x")
    assert verify_signature(body, header, "whsec_x", now=old + 10) == {"id": "evt_1"}
    with pytest.raises(SignatureInvalid, match="no t="):
        verify_signature(body, "v1=abc", "whsec_x")


def test_the_backoff_doubles_from_the_base_and_is_capped(settings: Any) -> None:
    settings.AGENT_WEBHOOK_BACKOFF_BASE_SECONDS = 30
    settings.AGENT_WEBHOOK_BACKOFF_CAP_SECONDS = 6 * 3600
    assert [webhook_backoff_seconds(n) for n in range(1, 6)] == [30, 60, 120, 240, 480]
    assert webhook_backoff_seconds(20) == 6 * 3600


def test_a_failed_delivery_is_retried_on_the_schedule_then_given_up_after_the_window(
    hooked: str, agent_actor: Actor, receiver: Receiver, published: list[Any], settings: Any
) -> None:
    settings.AGENT_WEBHOOK_BACKOFF_BASE_SECONDS = 30
    receiver.fail_first = 100
    action = propose(agent_actor)
    row = AgentWebhookDelivery.objects.get(action=action)
    published.clear()

    assert webhook_deliver(row.pk) == "retry scheduled"
    row.refresh_from_db()
    assert row.status == DeliveryStatus.PENDING and row.attempts == 1 and row.last_status_code == 500
    first_wait = (row.next_attempt_at - row.attempt_log.get().attempted_at).total_seconds()
    assert 30 <= first_wait < 32
    # A short wait is handed to the broker as a countdown (the sweep is the safety net).
    assert published == [(row.pk, 30.0)]
    # Not due yet: a second task (a duplicate publish) does nothing.
    assert webhook_deliver(row.pk) == "not due"

    second = webhook_deliver(row.pk, now=row.next_attempt_at)
    assert second == "retry scheduled"
    row.refresh_from_db()
    assert row.attempts == 2
    last = row.attempt_log.order_by("-pk").first()
    assert last is not None
    assert 60 <= (row.next_attempt_at - last.attempted_at).total_seconds() < 62

    # Once the next wait would pass the 3-day window, it gives up.
    AgentWebhookDelivery.objects.filter(pk=row.pk).update(expires_at=timezone.now() + timedelta(seconds=10))
    assert webhook_deliver(row.pk, now=row.next_attempt_at) == "gave up"
    row.refresh_from_db()
    assert row.status == DeliveryStatus.FAILED and row.attempts == 3
    assert len(receiver.snapshot()) == 3


def test_the_sweep_publishes_due_rows_whose_publish_was_lost(
    hooked: str, agent_actor: Actor, published: list[Any]
) -> None:
    action = propose(agent_actor)
    row = AgentWebhookDelivery.objects.get(action=action)
    # Not yet sent, publish lost: the sweep finds it.
    assert webhook_sweep_due(now=timezone.now() + timedelta(seconds=1)) == [row.pk]
    # Being sent by a worker right now (locked): left alone.
    AgentWebhookDelivery.objects.filter(pk=row.pk).update(locked_until=timezone.now() + timedelta(minutes=1))
    assert webhook_sweep_due() == []
    AgentWebhookDelivery.objects.filter(pk=row.pk).update(locked_until=None, status=DeliveryStatus.DELIVERED)
    assert webhook_sweep_due() == []


def test_redeliver_sends_the_same_event_again_as_a_new_delivery(
    hooked: str, agent_actor: Actor, agent_owner: Any, finance: Any, receiver: Receiver, published: list[Any]
) -> None:
    action = propose(agent_actor)
    row = AgentWebhookDelivery.objects.get(action=action)
    webhook_deliver(row.pk)
    again = webhook_redeliver_by_owner(delivery=row, user=agent_owner)
    assert again.event_id == row.event_id and again.redelivery_of_id == row.pk
    assert webhook_deliver(again.pk) == "delivered"
    bodies = [got.body for got in receiver.snapshot()]
    assert len(bodies) == 2 and bodies[0] == bodies[1]
    with pytest.raises(WebhookChangeRefused):
        webhook_redeliver_by_owner(delivery=row, user=finance)


def test_only_the_owner_sets_the_url_and_rotates_the_secret_and_the_trail_records_it(
    agent: Any, agent_owner: Any, finance: Any, console_admin: Any
) -> None:
    for other in (finance, console_admin):
        with pytest.raises(WebhookChangeRefused):
            webhook_set_by_owner(agent=agent, user=other, url="https://agent.example/hooks")
    with pytest.raises(WebhookInvalid, match="not an http"):
        webhook_set_by_owner(agent=agent, user=agent_owner, url="ftp://agent.example/hooks")
    with pytest.raises(WebhookInvalid, match="Enter the URL"):
        webhook_set_by_owner(agent=agent, user=agent_owner, url="  ")
    assert not SecurityEvent.objects.filter(kind__startswith="webhook").exists()

    first = webhook_set_by_owner(agent=agent, user=agent_owner, url="https://agent.example/hooks")
    assert first is not None and first.plain.startswith("whsec_")
    assert webhook_set_by_owner(agent=agent, user=agent_owner, url="https://agent.example/v2") is None
    rotated = webhook_secret_rotate_by_owner(agent=agent, user=agent_owner)
    assert rotated.plain != first.plain
    trail = list(SecurityEvent.objects.filter(kind__startswith="webhook").order_by("pk"))
    assert [event.kind for event in trail] == ["webhook_changed", "webhook_changed", "webhook_secret_rotated"]
    # Never the secret itself.
    for event in trail:
        assert first.plain not in json.dumps(event.detail) and rotated.plain not in json.dumps(event.detail)
