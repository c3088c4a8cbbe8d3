"""The outbox of agent webhooks: one row per state change of an agent's action.

``webhook_outbox_write`` is called by the audit trail's writer (actions.foundation.trail.event_record),
inside the transaction that changed the action, so the row commits or rolls back with the
change (the same rule as the audit event itself, invariant 9). Publishing to the workers
happens after the commit; a publish lost on the way is picked up by the beat sweep, which
finds the row due.

Also the signing scheme, shared with the delivery code and the tests: Stripe's
``t=<unix time>,v1=<hex HMAC-SHA256 of "<t>.<body>">``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction

from actions.foundation import sql
from actions.models import ActionEvent, AgentWebhookDelivery, DeliveryStatus

logger = logging.getLogger(__name__)

DELIVER_TASK = "actions.tasks.deliver_agent_webhook"
SIGNATURE_HEADER = "Console-Signature"


def webhook_sign(*, secret: str, timestamp: int, body: bytes) -> str:
    """The signature header's value for one request."""
    signed = f"{timestamp}.".encode() + body
    digest = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def webhook_body(payload: dict[str, Any]) -> bytes:
    """The exact bytes sent (and signed): compact, keys in order, so a redelivery is identical."""
    return json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()


def _event_payload(event: ActionEvent, event_id: str) -> dict[str, Any]:
    action = event.action
    order_number = action.order.number if action.order is not None else None
    return {
        "id": event_id,
        "type": f"action.{event.to_state.lower()}",
        "created": int(event.created_at.timestamp()),
        "data": {
            "action_id": action.action_id,
            "kind": action.kind,
            "status": event.to_state,
            "previous_status": event.from_state,
            "transition": event.transition,
            "amount": str(action.amount),
            "currency": action.currency,
            "order": order_number,
            "provider_reference": action.provider_reference,
            "reason": event.reason,
            "changed_at": event.created_at.isoformat(),
        },
    }


def _active_hook(agent_id: int, webhooks: dict[int, int | None] | None) -> int | None:
    """The key of the agent's active webhook: from ``webhooks`` (what the caller read with its
    actions), else read now and added to it."""
    if webhooks is not None and agent_id in webhooks:
        return webhooks[agent_id]
    hook = sql.active_webhook(agent_id=agent_id)
    if webhooks is not None:
        webhooks[agent_id] = hook
    return hook


def webhook_outbox_write(
    event: ActionEvent, *, webhooks: dict[int, int | None] | None = None
) -> AgentWebhookDelivery | None:
    """Write the outbox row for one audit event, if it is a state change of an agent's action
    whose agent has an active webhook. Must run in the transaction that wrote the event.

    ``webhooks``: each agent's active webhook's key (None: none) by the agent's key, as the
    caller already knows them (``actions.foundation.trail.Writes``): an agent found there is not read again."""
    action = event.action
    if event.from_state == event.to_state or action.proposed_by_agent_id is None:
        return None
    hook = _active_hook(action.proposed_by_agent_id, webhooks)
    if hook is None:
        return None
    event_id = f"evt_{event.pk}"
    delivery = AgentWebhookDelivery.objects.create(
        agent_id=action.proposed_by_agent_id,
        action=action,
        audit_event=event,
        event_id=event_id,
        event_type=f"action.{event.to_state.lower()}",
        payload=_event_payload(event, event_id),
        status=DeliveryStatus.PENDING,
        next_attempt_at=event.created_at,
        created_at=event.created_at,
        expires_at=event.created_at + timedelta(seconds=settings.AGENT_WEBHOOK_WINDOW_SECONDS),
    )
    webhook_publish_on_commit(delivery.pk)
    return delivery


def webhook_publish(delivery_pk: int, *, countdown: float | None = None) -> None:
    """Ask a worker to deliver now (or after ``countdown`` seconds). Never raises: the change is
    committed already, and the sweep delivers a row whose publish failed."""
    from console.celery import app

    try:
        app.send_task(DELIVER_TASK, args=(delivery_pk,), countdown=countdown)
    except Exception:  # the broker is down: the sweep will find the row due
        logger.warning("could not publish webhook delivery %s; the sweep will", delivery_pk, exc_info=True)


def webhook_publish_on_commit(delivery_pk: int) -> None:
    # Looked up at commit time, so a test's replacement of webhook_publish is the one called.
    transaction.on_commit(lambda: webhook_publish(delivery_pk))
