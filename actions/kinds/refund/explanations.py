"""The refund's plain explanations: what changed on an order, in a clerk's words.

A manager's decision made on an older page, and a claim that finds the order moved on, are
refused with these sentences (``RefundKind.target_changed_words`` and ``RefundKind.reserve``).
"""

from __future__ import annotations

from actions.foundation.trail import trail_events
from actions.models import Order, OrderEvent, OrderEventKind


def order_changes_since(order: Order, version: int) -> list[str]:
    """What raised ``order``'s version past ``version``, in a clerk's words: each refund reserved
    on it (its reservation's event records the version it found, and raised it by one), each
    refund made or reversed outside the console, and whatever else changed the order."""
    reserved = trail_events(
        action__order_id=order.pk,
        transition="begin_submission",
        evidence__order_version__gte=version,
        select_related=("action",),
    )
    outside = list(OrderEvent.objects.filter(order=order, version_after__gt=version).order_by("created_at", "pk"))
    changes = [f"another refund of {event.action.amount} {event.action.currency} went ahead" for event in reserved]
    for change in outside:
        if change.kind == OrderEventKind.OUTSIDE_REFUND:
            changes.append(f"a refund of {change.amount} {change.currency} was made outside the console")
        else:
            changes.append(f"a refund of {change.amount} {change.currency} made outside the console was reversed")
    if order.version - version > len(reserved) + len(outside):
        changes.append("its details were changed (by the shop or a correction)")
    return changes


def outside_refunds_since(order: Order, version: int) -> str:
    """Plain words for the outside refunds booked on ``order`` after ``version``, if any."""
    events = OrderEvent.objects.filter(
        order=order, kind=OrderEventKind.OUTSIDE_REFUND, version_after__gt=version
    ).order_by("created_at", "pk")
    if not events:
        return ""
    made = "; ".join(f"{event.amount} {event.currency} ({event.reference})" for event in events)
    return (
        f" A refund was made outside the console, at the payment provider: {made}. "
        f"The order now has {order.refundable_amount} {order.currency} left to refund."
    )
