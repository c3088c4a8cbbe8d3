"""The payment provider's webhooks: refunds the console made settle sooner, refunds made
outside the console are booked on their order.

``POST /webhooks/stripe`` hands the raw body and the ``Stripe-Signature`` header to
``webhook_receive``. The signature is verified with the official SDK before anything is read;
a forged or stale event is refused and writes nothing. Every event is stored once, by its id,
in the transaction that applies it, so a replay (the provider retries until it gets a 2xx)
changes nothing.

What an event says is never recorded as an action's outcome. For a refund that names one of
the console's actions, the event only makes that action's reconciliation due now: the
reconciler asks the provider and records its answer through the engine's normal path. A
refund that names no action of ours was made outside the console (another system, a person in
the provider's dashboard): its money is booked on the order as refunded outside, the order's
version rises (so approvals bound to the old version go STALE at the claim, docs/architecture.md
section 5), and the order's history says what happened.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import stripe
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from actions.engine.reconcile import reconcile_request_now
from actions.foundation.publish import reconcile_enqueue_on_commit
from actions.models import (
    Action,
    Order,
    OrderEvent,
    OrderEventKind,
    OutsideRefund,
    WebhookEvent,
    WebhookEventOutcome,
)
from actions.providers.money import from_minor_units

logger = logging.getLogger(__name__)

HANDLED_TYPES = frozenset({"charge.refunded", "refund.created", "refund.updated", "refund.failed"})
# A refund in these states has taken (or is taking) the money off the charge.
LIVE_REFUND_STATUSES = frozenset({"succeeded", "pending", "requires_action"})
# A refund in these states never will; they are final at the provider.
DEAD_REFUND_STATUSES = frozenset({"failed", "canceled"})
# An order's money columns hold 12 whole-unit digits; no refund can be larger.
MAX_AMOUNT_MINOR = 10**14


class WebhookRefused(Exception):
    """The request is not a genuine, well-formed event. Nothing was written (HTTP 400)."""


@dataclass(frozen=True)
class WebhookResult:
    event_id: str
    replay: bool
    outcome: str
    note: str = ""


def json_nesting_exceeds(payload: bytes, limit: int) -> bool:
    """Whether the JSON text nests arrays and objects deeper than ``limit``, found by one scan
    that keeps no stack: Python's parser recurses once per level and would exhaust the
    interpreter's stack (RecursionError) on a body nested 100,000 deep."""
    depth = 0
    in_string = escaped = False
    for byte in payload:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # closing quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > limit:
                return True
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return False


def _signed_timestamp(signature: str) -> int | None:
    for item in signature.split(","):
        name, _, value = item.strip().partition("=")
        if name == "t":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def webhook_verify(
    *, payload: bytes, signature: str, secret: str | None = None, now: float | None = None
) -> dict[str, Any]:
    """The event, once its size, signature, age and shape are checked; WebhookRefused otherwise.

    The signature is checked over the raw body before the body is parsed, and the body is
    parsed only after its size and nesting are known to be bounded."""
    if len(payload) > settings.PROVIDER_WEBHOOK_MAX_BODY_BYTES:
        raise WebhookRefused(f"The body is larger than {settings.PROVIDER_WEBHOOK_MAX_BODY_BYTES} bytes.")
    try:
        # Stripe's own check: the signature, and the timestamp's age on the past side.
        stripe.WebhookSignature.verify_header(
            payload, signature, secret or settings.PROVIDER_WEBHOOK_SECRET, settings.PROVIDER_WEBHOOK_TOLERANCE_SECONDS
        )
    except stripe.SignatureVerificationError as error:
        raise WebhookRefused("The signature does not match this endpoint's secret.") from error
    except UnicodeDecodeError as error:
        raise WebhookRefused("The body is not a JSON event.") from error
    # The future side, which the SDK does not check: a timestamp ahead of the clock would keep a
    # captured request replayable for as long as it is ahead.
    signed_at = _signed_timestamp(signature)
    current = time.time() if now is None else now
    if signed_at is None or signed_at > current + settings.PROVIDER_WEBHOOK_FUTURE_TOLERANCE_SECONDS:
        raise WebhookRefused("The signature's timestamp is in the future.")
    if b"\\u0000" in payload:
        # PostgreSQL's text cannot hold NUL; no genuine event carries one.
        raise WebhookRefused("The event contains a NUL character.")
    if json_nesting_exceeds(payload, settings.PROVIDER_WEBHOOK_MAX_DEPTH):
        raise WebhookRefused(f"The body nests deeper than {settings.PROVIDER_WEBHOOK_MAX_DEPTH} levels.")
    try:
        event = json.loads(payload)
    except ValueError as error:  # UnicodeDecodeError included
        raise WebhookRefused("The body is not a JSON event.") from error
    if not isinstance(event, dict) or not isinstance(event.get("id"), str) or not event["id"]:
        raise WebhookRefused("The event has no id.")
    if "\x00" in event["id"] or len(event["id"]) > 255 or not isinstance(event.get("type"), str):
        raise WebhookRefused("The event's id or type is not valid.")
    data = event.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("object"), dict):
        raise WebhookRefused("The event has no data.object.")
    return event


def webhook_receive(*, payload: bytes, signature: str, now: datetime | None = None) -> WebhookResult:
    """Verify, store once by id, and apply one event. Raises WebhookRefused (nothing written)."""
    event = webhook_verify(payload=payload, signature=signature)
    now = now or timezone.now()
    try:
        with transaction.atomic(durable=True):
            stored = WebhookEvent.objects.select_for_update().filter(event_id=event["id"]).first()
            if stored is not None:
                WebhookEvent.objects.filter(pk=stored.pk).update(deliveries=F("deliveries") + 1)
                return WebhookResult(event_id=stored.event_id, replay=True, outcome=stored.outcome, note=stored.note)
            outcome, note = _apply(event, now=now)
            WebhookEvent.objects.create(
                event_id=event["id"],
                type=event["type"],
                payload=event,
                outcome=outcome,
                note=note,
                received_at=now,
            )
    except IntegrityError:
        # The same event delivered twice at once: the other delivery stored and applied it,
        # and this transaction (its changes included) rolled back.
        return WebhookResult(event_id=event["id"], replay=True, outcome=WebhookEventOutcome.NO_CHANGE)
    return WebhookResult(event_id=event["id"], replay=False, outcome=outcome, note=note)


def _refunds_in(event: dict[str, Any]) -> list[dict[str, Any]]:
    obj = event["data"]["object"]
    if event["type"].startswith("refund."):
        return [obj]
    # charge.refunded carries the charge; its refunds are listed when the provider expands them.
    listed = (obj.get("refunds") or {}).get("data") if isinstance(obj.get("refunds"), dict) else None
    return [refund for refund in (listed or []) if isinstance(refund, dict)]


def _apply(event: dict[str, Any], *, now: datetime) -> tuple[str, str]:
    if event["type"] not in HANDLED_TYPES:
        return WebhookEventOutcome.IGNORED, f"{event['type']} is not an event the console acts on."
    results = [_apply_refund(refund, event_id=event["id"], now=now) for refund in _refunds_in(event)]
    if not results:
        return WebhookEventOutcome.NO_CHANGE, "The event lists no refund."
    # The most telling outcome names the event; the notes say what happened to each refund.
    ranking: list[str] = [
        WebhookEventOutcome.OUTSIDE_REFUND,
        WebhookEventOutcome.SETTLES_ACTION,
        WebhookEventOutcome.UNMATCHED,
        WebhookEventOutcome.NO_CHANGE,
    ]
    outcome = min((result[0] for result in results), key=ranking.index)
    return outcome, " ".join(result[1] for result in results)


def _apply_refund(refund: dict[str, Any], *, event_id: str, now: datetime) -> tuple[str, str]:
    reference = str(refund.get("id") or "")
    metadata = refund.get("metadata") if isinstance(refund.get("metadata"), dict) else {}
    action_id = str((metadata or {}).get("action_id") or "")
    action = Action.objects.filter(action_id=action_id).only("pk", "status").first() if action_id else None
    if action is not None:
        if reconcile_request_now(action_pk=action.pk, now=now):
            reconcile_enqueue_on_commit(action.pk)
            return WebhookEventOutcome.SETTLES_ACTION, f"{reference}: {action_id} is reconciled now."
        return WebhookEventOutcome.NO_CHANGE, f"{reference}: {action_id} is {action.status}; nothing to do."
    order = Order.objects.select_for_update().filter(charge_reference=str(refund.get("charge") or "")).first()
    if order is None or not reference:
        return WebhookEventOutcome.UNMATCHED, f"{reference or '(no id)'}: no order has charge {refund.get('charge')}."
    return outside_refund_record(order=order, refund=refund, event_id=event_id, now=now)


def outside_refund_record(*, order: Order, refund: dict[str, Any], event_id: str, now: datetime) -> tuple[str, str]:
    """Book, update or reverse an outside refund on ``order`` (locked by the caller).

    A failed or cancelled refund is final at the provider: a later event with an older status
    (events can arrive out of order) does not book it again.
    """
    reference = str(refund["id"])
    status = str(refund.get("status") or "")
    currency = str(refund.get("currency") or order.currency).upper()
    amount_minor = refund.get("amount")
    if isinstance(amount_minor, bool) or not isinstance(amount_minor, int) or not 0 < amount_minor < MAX_AMOUNT_MINOR:
        return WebhookEventOutcome.UNMATCHED, f"{reference}: the refund has no valid amount."
    if currency != order.currency:
        return WebhookEventOutcome.UNMATCHED, (
            f"{reference}: in {currency}, but order {order.number} is in {order.currency}."
        )
    amount = from_minor_units(amount_minor, currency)
    known = OutsideRefund.objects.select_for_update().filter(reference=reference).first()
    live = status in LIVE_REFUND_STATUSES
    if known is None:
        booked = live and _book(order, amount)
        OutsideRefund.objects.create(
            order=order,
            reference=reference,
            amount=amount,
            currency=currency,
            status=status,
            booked=booked,
            event_id=event_id,
            created_at=now,
            updated_at=now,
        )
        if not booked:
            if live:
                logger.error("outside refund %s on order %s exceeds what the console can book", reference, order)
                return WebhookEventOutcome.UNMATCHED, (
                    f"{reference}: {amount} {currency} refunded outside does not fit order {order.number}'s balance."
                )
            return WebhookEventOutcome.NO_CHANGE, f"{reference}: an outside refund that already {status}."
        order.refresh_from_db()
        _history(
            order,
            OrderEventKind.OUTSIDE_REFUND,
            amount,
            reference,
            f"{amount} {currency} was refunded outside the console, at the payment provider ({reference}, "
            f"{status}). {order.refundable_amount} {currency} is left to refund; approvals given before this "
            "change need a new decision.",
            event_id,
            now,
        )
        return WebhookEventOutcome.OUTSIDE_REFUND, f"{reference}: {amount} {currency} booked on order {order.number}."
    if known.status in DEAD_REFUND_STATUSES:
        return WebhookEventOutcome.NO_CHANGE, f"{reference}: already {known.status}."
    fields = {"status": status, "event_id": event_id, "updated_at": now}
    if status in DEAD_REFUND_STATUSES and known.booked:
        Order.objects.filter(pk=order.pk).update(
            outside_refunded_amount=F("outside_refunded_amount") - known.amount, version=F("version") + 1
        )
        fields["booked"] = False
        order.refresh_from_db()
        _history(
            order,
            OrderEventKind.OUTSIDE_REFUND_REVERSED,
            known.amount,
            reference,
            f"The refund of {known.amount} {currency} made outside the console {status} at the payment provider "
            f"({reference}): the money is back on the charge, {order.refundable_amount} {currency} is left to "
            "refund.",
            event_id,
            now,
        )
        OutsideRefund.objects.filter(pk=known.pk).update(**fields)
        return WebhookEventOutcome.OUTSIDE_REFUND, (
            f"{reference}: {status}, its booking on order {order.number} reversed."
        )
    OutsideRefund.objects.filter(pk=known.pk).update(**fields)
    return WebhookEventOutcome.NO_CHANGE, f"{reference}: now {status}; already booked."


def _book(order: Order, amount: Decimal) -> bool:
    """Add an outside refund to the order's money and raise its version, if it fits."""
    return bool(
        Order.objects.filter(
            pk=order.pk,
            captured_amount__gte=F("refunded_amount") + F("reserved_amount") + F("outside_refunded_amount") + amount,
        ).update(outside_refunded_amount=F("outside_refunded_amount") + amount, version=F("version") + 1)
    )


def _history(
    order: Order, kind: str, amount: Decimal, reference: str, message: str, event_id: str, now: datetime
) -> None:
    OrderEvent.objects.create(
        order=order,
        kind=kind,
        message=message,
        amount=amount,
        currency=order.currency,
        reference=reference,
        version_after=order.version,
        details={"event_id": event_id},
        created_at=now,
    )
