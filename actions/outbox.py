"""The outbox of agent webhooks: one row per state change of an agent's action.

``webhook_outbox_write`` is called by the audit trail's writer (actions.trail.event_record),
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
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import OuterRef, Subquery

from actions.compiled_statements import CompiledSelect
from actions.models import ActionEvent, AgentWebhook, AgentWebhookDelivery, DeliveryStatus

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


# Inside one claim transaction of many actions (actions.engine.claim.submission_begin_batch),
# each agent's webhook is read once rather than once per event.
_hooks_read: ContextVar[dict[int, AgentWebhook | None] | None] = ContextVar("agent_webhooks_read", default=None)


@contextmanager
def agent_webhooks_read_once() -> Iterator[None]:
    """Within this block (one transaction), read each agent's active webhook at most once."""
    token = _hooks_read.set({})
    try:
        yield
    finally:
        _hooks_read.reset(token)


def agent_webhook_known(agent_id: int, hook: AgentWebhook | None) -> None:
    """Within ``agent_webhooks_read_once``, remember the agent's webhook as a read of the
    caller's already found it (the auto-approval caps lock the agent's row and read its webhook
    in the same statement), so the outbox does not read it again. Outside the block, nothing."""
    memo = _hooks_read.get()
    if memo is not None:
        memo[agent_id] = hook if hook is not None and hook.is_active else None


def agent_active_webhook_pk() -> Subquery:
    """The primary key of the active webhook of the agent who proposed the action (NULL for
    none), as a column of a read of actions: a batch that reads its actions anyway learns its
    agents' webhooks in the same statement (``agent_webhooks_known``) rather than in one more.
    (An agent has at most one webhook: ``AgentWebhook.agent`` is one-to-one.)"""
    hook = AgentWebhook.objects.filter(agent_id=OuterRef("proposed_by_agent_id"), is_active=True)
    return Subquery(hook.values("pk")[:1])


def agent_webhooks_known(hook_pks: dict[int, int | None]) -> None:
    """Within ``agent_webhooks_read_once``, remember each agent's active webhook by the primary
    key ``agent_active_webhook_pk`` read for it (None: the agent has no active webhook).
    Outside the block, nothing."""
    for agent_id, hook_pk in hook_pks.items():
        # The outbox asks only whether there is an active hook and writes the agent's id: the
        # row's other columns are never read in the transaction, so none is loaded.
        hook = None if hook_pk is None else AgentWebhook(pk=hook_pk, agent_id=agent_id, is_active=True)
        agent_webhook_known(agent_id, hook)


# A record or claim of one action reads its agent's webhook on its own: compiled once.
_ACTIVE_HOOK = CompiledSelect(
    AgentWebhook,
    lambda agent: AgentWebhook.objects.filter(agent_id=agent, is_active=True).order_by("pk")[:1],
    agent=AgentWebhook._meta.get_field("agent").target_field,
)


def _active_hook(agent_id: int) -> AgentWebhook | None:
    memo = _hooks_read.get()
    if memo is not None and agent_id in memo:
        return memo[agent_id]
    found = _ACTIVE_HOOK.rows(agent=agent_id)
    hook = found[0] if found else None
    if memo is not None:
        memo[agent_id] = hook
    return hook


def webhook_outbox_write(event: ActionEvent) -> AgentWebhookDelivery | None:
    """Write the outbox row for one audit event, if it is a state change of an agent's action
    whose agent has an active webhook. Must run in the transaction that wrote the event."""
    action = event.action
    if event.from_state == event.to_state or action.proposed_by_agent_id is None:
        return None
    hook = _active_hook(action.proposed_by_agent_id)
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
