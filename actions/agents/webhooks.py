"""Agent webhooks: the owner's settings, delivery with exponential backoff, redelivery.

- The owner of an agent sets its URL and gets a signing secret, shown once (like a token);
  rotating issues a new one. Both are written to the security trail, never the secret itself.
- The outbox rows are written by the audit trail (actions.foundation.outbox). ``webhook_deliver`` sends
  one row: it claims the row (``locked_until``) so two tasks for it never send at once, posts
  the signed body, logs the attempt, and either marks it delivered or schedules the next try
  BASE * 2**(n-1) seconds later (capped), giving up once that would pass ``expires_at``
  (3 days after the event).
- ``webhook_sweep_due`` is beat's safety net: it republishes rows that are due (a publish lost
  between commit and broker, or a retry too far out to trust to a broker's countdown).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import requests
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db import transaction
from django.db.models import Count, Q, QuerySet
from django.utils import timezone

from actions.foundation.egress import EgressRefused, egress_check_url, egress_post
from actions.foundation.outbox import (
    SIGNATURE_HEADER,
    webhook_body,
    webhook_publish,
    webhook_publish_on_commit,
    webhook_sign,
)
from actions.foundation.security import security_event_record
from actions.models import (
    Action,
    Agent,
    AgentWebhook,
    AgentWebhookAttempt,
    AgentWebhookDelivery,
    DeliveryStatus,
    SecurityEventKind,
)

SECRET_MARKER = "whsec_"  # noqa: S105 (a public marker, not a secret)
# A retry further out than this is left to the beat sweep rather than a broker countdown:
# Redis redelivers an unacknowledged delayed message after its visibility timeout.
COUNTDOWN_LIMIT_SECONDS = 300.0


class WebhookInvalid(ValueError):
    """Bad input for a webhook (the URL). Nothing was written."""


class WebhookChangeRefused(PermissionError):
    """Someone other than the agent's owner tried to change its webhook. Nothing was written."""


@dataclass(frozen=True)
class IssuedSecret:
    hook: AgentWebhook
    # The secret itself: show it once, on the answer to the request that made it.
    plain: str


def _refuse_unless_owner(agent: Agent, user: Any) -> None:
    if user is None or agent.owner_id != getattr(user, "pk", None):
        raise WebhookChangeRefused(f"Only the owner of agent {agent.name} may change its webhook.")


def _clean_url(url: str) -> str:
    url = (url or "").strip()
    if not url:
        raise WebhookInvalid("Enter the URL the console should send events to, e.g. https://agent.example/hooks.")
    try:
        URLValidator(schemes=["http", "https"])(url)
    except ValidationError:
        raise WebhookInvalid(f"{url[:200]!r} is not an http(s) URL.") from None
    if len(url) > 2000:
        raise WebhookInvalid("The URL is longer than 2000 characters.")
    try:
        egress_check_url(url)
    except EgressRefused as refusal:
        raise WebhookInvalid(str(refusal)) from None
    return url


def _new_secret() -> str:
    return SECRET_MARKER + secrets.token_urlsafe(32)


def webhook_set_by_owner(*, agent: Agent, user: Any, url: str) -> IssuedSecret | None:
    """Set (or change) the agent's webhook URL. A first URL comes with a new secret (returned
    once); changing the URL keeps the secret, and returns None."""
    _refuse_unless_owner(agent, user)
    clean = _clean_url(url)
    with transaction.atomic():
        hook = AgentWebhook.objects.select_for_update().filter(agent=agent).first()
        previous = hook.url if hook is not None else ""
        plain = None
        if hook is None:
            plain = _new_secret()
            hook = AgentWebhook.objects.create(agent=agent, url=clean, secret=plain, secret_prefix=plain[:14])
        else:
            hook.url = clean
            hook.is_active = True
            hook.save(update_fields=["url", "is_active", "updated_at"])
        security_event_record(
            kind=SecurityEventKind.WEBHOOK_CHANGED,
            user=user,
            subject=f"agent {agent.name}",
            detail={"previous_url": previous, "url": clean, "secret_issued": plain is not None},
        )
    return IssuedSecret(hook=hook, plain=plain) if plain is not None else None


def webhook_secret_rotate_by_owner(*, agent: Agent, user: Any) -> IssuedSecret:
    """Replace the signing secret; events sent from now on are signed with the new one."""
    _refuse_unless_owner(agent, user)
    with transaction.atomic():
        hook = AgentWebhook.objects.select_for_update().filter(agent=agent).first()
        if hook is None:
            raise WebhookInvalid(f"Agent {agent.name} has no webhook yet: set its URL first.")
        plain = _new_secret()
        previous_prefix = hook.secret_prefix
        hook.secret = plain
        hook.secret_prefix = plain[:14]
        hook.secret_rotated_at = timezone.now()
        hook.save(update_fields=["secret", "secret_prefix", "secret_rotated_at", "updated_at"])
        security_event_record(
            kind=SecurityEventKind.WEBHOOK_SECRET_ROTATED,
            user=user,
            subject=f"agent {agent.name}",
            detail={"previous_secret_prefix": previous_prefix, "secret_prefix": hook.secret_prefix},
        )
    return IssuedSecret(hook=hook, plain=plain)


def webhook_disable_by_owner(*, agent: Agent, user: Any) -> None:
    """Stop writing events for this agent. Rows already waiting are still delivered."""
    _refuse_unless_owner(agent, user)
    with transaction.atomic():
        hook = AgentWebhook.objects.select_for_update().filter(agent=agent).first()
        if hook is None or not hook.is_active:
            return
        hook.is_active = False
        hook.save(update_fields=["is_active", "updated_at"])
        security_event_record(
            kind=SecurityEventKind.WEBHOOK_CHANGED,
            user=user,
            subject=f"agent {agent.name}",
            detail={"previous_url": hook.url, "url": "", "disabled": True},
        )


# What a redelivery keeps of the delivery it repeats: the agent, the action and the event itself
# (its id, so that the agent can tell it has seen it, its type and its payload).
SAME_EVENT = ("agent_id", "action_id", "event_id", "event_type", "payload")


def webhook_redeliver_by_owner(*, delivery: AgentWebhookDelivery, user: Any) -> AgentWebhookDelivery:
    """Send an event again, as a new delivery of the same event id with a fresh schedule."""
    _refuse_unless_owner(delivery.agent, user)
    now = timezone.now()
    with transaction.atomic():
        again = AgentWebhookDelivery.objects.create(
            **{name: getattr(delivery, name) for name in SAME_EVENT},
            status=DeliveryStatus.PENDING,
            next_attempt_at=now,
            created_at=now,
            expires_at=now + timedelta(seconds=settings.AGENT_WEBHOOK_WINDOW_SECONDS),
            redelivery_of=delivery,
            requested_by=user,
        )
        webhook_publish_on_commit(again.pk)
    return again


# --- delivery ---------------------------------------------------------------------------------


def webhook_backoff_seconds(failures: int) -> float:
    """How long to wait after the ``failures``-th failed attempt (1, 2, ...): doubling from the
    base, capped, so that a receiver down for hours is tried a few times an hour, not flooded."""
    base = float(settings.AGENT_WEBHOOK_BACKOFF_BASE_SECONDS)
    cap = float(settings.AGENT_WEBHOOK_BACKOFF_CAP_SECONDS)
    return float(min(base * (2 ** max(failures - 1, 0)), cap))


def _claim(delivery_pk: int, now: datetime) -> tuple[AgentWebhookDelivery, AgentWebhook | None] | None:
    lock = timedelta(seconds=settings.AGENT_WEBHOOK_TIMEOUT_SECONDS * 3 + 10)
    with transaction.atomic():
        delivery = (
            AgentWebhookDelivery.objects.select_for_update(skip_locked=True)
            .filter(pk=delivery_pk, status=DeliveryStatus.PENDING, next_attempt_at__lte=now)
            .filter(Q(locked_until__isnull=True) | Q(locked_until__lt=now))
            .first()
        )
        if delivery is None:
            return None
        hook = AgentWebhook.objects.filter(agent_id=delivery.agent_id).first()
        if hook is None:
            delivery.status = DeliveryStatus.FAILED
            delivery.last_error = "The agent has no webhook any more."
            delivery.save(update_fields=["status", "last_error"])
            return None
        delivery.locked_until = now + lock
        delivery.save(update_fields=["locked_until"])
    return delivery, hook


def _post(hook: AgentWebhook, body: bytes) -> tuple[int | None, str, str, int]:
    """Send one request; returns (status code, response excerpt, error, milliseconds).

    The address is judged again here, not only when it was registered: a name can resolve
    elsewhere by now (actions.foundation.egress)."""
    timestamp = int(time.time())
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "effect-console-webhooks/1",
        SIGNATURE_HEADER: webhook_sign(secret=hook.secret, timestamp=timestamp, body=body),
    }
    started = time.monotonic()
    try:
        # No redirects (egress_post): a receiver that moved must be re-registered by its owner,
        # and the signature must not follow the request to another host.
        answer = egress_post(hook.url, body=body, headers=headers, timeout=settings.AGENT_WEBHOOK_TIMEOUT_SECONDS)
    except EgressRefused as refusal:
        elapsed = int((time.monotonic() - started) * 1000)
        return None, "", f"Not sent. {refusal}"[:1000], elapsed
    except requests.RequestException as error:
        elapsed = int((time.monotonic() - started) * 1000)
        return None, "", f"{type(error).__name__}: {error}"[:1000], elapsed
    elapsed = int((time.monotonic() - started) * 1000)
    return answer.status_code, answer.excerpt, "", elapsed


def webhook_deliver(delivery_pk: int, *, now: datetime | None = None) -> str:
    """Attempt one delivery if it is due; returns what happened (for logs and tests)."""
    now = now or timezone.now()
    claimed = _claim(delivery_pk, now)
    if claimed is None:
        return "not due"
    delivery, hook = claimed
    assert hook is not None
    sent_at = timezone.now()
    status_code, excerpt, error, elapsed = _post(hook, webhook_body(delivery.payload))
    succeeded = status_code is not None and 200 <= status_code < 300
    finished = timezone.now()
    retry_in: float | None = None
    with transaction.atomic():
        AgentWebhookAttempt.objects.create(
            delivery=delivery,
            attempted_at=sent_at,
            url=hook.url,
            status_code=status_code,
            response_excerpt=excerpt,
            error=error,
            duration_ms=elapsed,
            succeeded=succeeded,
        )
        delivery.attempts += 1
        delivery.locked_until = None
        delivery.last_status_code = status_code
        delivery.last_error = error or ("" if succeeded else f"The receiver answered {status_code}.")
        if succeeded:
            delivery.status = DeliveryStatus.DELIVERED
            delivery.delivered_at = finished
        else:
            wait = webhook_backoff_seconds(delivery.attempts)
            next_at = finished + timedelta(seconds=wait)
            if next_at > delivery.expires_at:
                delivery.status = DeliveryStatus.FAILED
            else:
                delivery.next_attempt_at = next_at
                retry_in = wait
        delivery.save(
            update_fields=[
                "attempts",
                "locked_until",
                "last_status_code",
                "last_error",
                "status",
                "delivered_at",
                "next_attempt_at",
            ]
        )
    if retry_in is not None and retry_in <= COUNTDOWN_LIMIT_SECONDS:
        webhook_publish(delivery.pk, countdown=retry_in)
    if succeeded:
        return "delivered"
    return "retry scheduled" if retry_in is not None else "gave up"


def webhook_sweep_due(*, now: datetime | None = None, limit: int = 500) -> list[int]:
    """Publish the deliveries that are due and not being sent; returns their ids."""
    now = now or timezone.now()
    due = list(
        AgentWebhookDelivery.objects.filter(status=DeliveryStatus.PENDING, next_attempt_at__lte=now)
        .filter(Q(locked_until__isnull=True) | Q(locked_until__lt=now))
        .order_by("next_attempt_at")
        .values_list("pk", flat=True)[:limit]
    )
    for pk in due:
        webhook_publish(pk)
    return due


# --- the owner's page -------------------------------------------------------------------------


def webhook_deliveries_of(agent: Agent, *, limit: int = 50) -> QuerySet[AgentWebhookDelivery]:
    return (
        AgentWebhookDelivery.objects.filter(agent=agent)
        .select_related("action")
        .prefetch_related("attempt_log")
        .order_by("-created_at", "-id")[:limit]
    )


def agent_recent_actions(agent: Agent, *, limit: int = 20) -> QuerySet[Action]:
    return Action.objects.filter(proposed_by_agent=agent).select_related("order").order_by("-created_at", "-id")[:limit]


def agents_owned_summary(user: Any) -> list[Agent]:
    """The person's agents for their home page, each with ``waiting`` (proposals waiting for a
    manager) and ``failing`` (deliveries that were refused at least once and are not through)."""
    if not getattr(user, "is_authenticated", False):
        return []
    return list(
        Agent.objects.filter(owner_id=user.pk)
        .annotate(
            waiting=Count("actions", filter=Q(actions__status="PROPOSED"), distinct=True),
            failing=Count(
                "webhook_deliveries",
                filter=Q(webhook_deliveries__status=DeliveryStatus.FAILED)
                | Q(webhook_deliveries__status=DeliveryStatus.PENDING, webhook_deliveries__attempts__gt=0),
                distinct=True,
            ),
        )
        .order_by("name")
    )
