"""The order page: every action, refund and decision on one order, its money, and its customer.

A fixed number of queries however long the order's history: the actions with their joins, their
approvals, the order's own events and outside refunds, and two aggregates for the customer.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db.models import Count, Q, Sum
from django.utils import timezone

from actions.models import Action, ActionStatus, Order, OrderEvent, OutsideRefund
from actions.models.actions import TERMINAL_STATUSES
from actions.providers.money import money_text
from actions.search import action_urls
from approvals.models import Approval

S = ActionStatus

# Pending: proposed or approved, and not yet holding a reservation. These may still take money.
PENDING_STATUSES = (S.PROPOSED, S.AUTHORIZED, S.STALE)
CUSTOMER_WINDOW_DAYS = 90


@dataclass(frozen=True)
class Money:
    captured: Decimal
    refunded: Decimal
    refunded_outside: Decimal
    reserved: Decimal
    pending: Decimal
    refundable: Decimal
    currency: str

    @property
    def pending_exceeds_refundable(self) -> bool:
        return self.pending > self.refundable


@dataclass(frozen=True)
class OrderAction:
    action: Action
    url: str | None


@dataclass(frozen=True)
class CustomerSummary:
    """What else this customer asked for: the manager's "3rd refund in 90 days"."""

    name: str
    email: str
    orders: int
    refunds_in_window: int
    refunded_in_window: list[tuple[str, Decimal]]  # (currency, amount), one per currency
    window_days: int

    @property
    def sentence(self) -> str:
        if self.refunds_in_window == 0:
            return f"No refund in the last {self.window_days} days."
        return (
            f"{_ordinal(self.refunds_in_window)} refund in {self.window_days} days "
            f"({', '.join(money_text(amount, currency) for currency, amount in self.refunded_in_window)})."
        )


@dataclass(frozen=True)
class OrderPage:
    order: Order
    money: Money
    actions: list[OrderAction]
    approvals: list[Approval]
    outside_refunds: list[OutsideRefund]
    events: list[OrderEvent]
    customer: CustomerSummary

    @property
    def refunds(self) -> list[OrderAction]:
        return [line for line in self.actions if line.action.status == S.SUCCEEDED]

    @property
    def in_flight(self) -> bool:
        """Whether an action on the order may still move its money: proposed, approved, being
        sent or checked, or with a person. The page follows the order while one is."""
        return any(line.action.status not in TERMINAL_STATUSES for line in self.actions)


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def customer_summary_get(order: Order, *, now: datetime | None = None) -> CustomerSummary:
    """The customer's orders and succeeded refunds in the last 90 days, this order's included.

    A customer is known by email when the order has one, else by name."""
    now = now or timezone.now()
    same = (
        Q(customer_email__iexact=order.customer_email) if order.customer_email else Q(customer_name=order.customer_name)
    )
    orders = Order.objects.filter(same)
    since = now - timedelta(days=CUSTOMER_WINDOW_DAYS)
    refunds = (
        Action.objects.filter(order__in=orders, status=S.SUCCEEDED, status_changed_at__gte=since)
        .order_by()
        .values("currency")
        .annotate(n=Count("pk"), total=Sum("amount"))
        .order_by("currency")
    )
    rows = list(refunds)
    return CustomerSummary(
        name=order.customer_name,
        email=order.customer_email,
        orders=orders.count(),
        refunds_in_window=sum(int(row["n"]) for row in rows),
        refunded_in_window=[(str(row["currency"]), row["total"]) for row in rows],
        window_days=CUSTOMER_WINDOW_DAYS,
    )


def order_page_get(*, order_pk: int, user: Any, now: datetime | None = None) -> OrderPage:
    """Raises Order.DoesNotExist."""
    order = Order.objects.get(pk=order_pk)
    actions = list(
        Action.objects.filter(order_id=order.pk)
        .select_related("refund_request", "proposed_by_agent", "proposed_by_user", "owner")
        .order_by("-created_at", "-pk")
    )
    pending = sum((a.amount for a in actions if a.status in PENDING_STATUSES), Decimal("0"))
    money = Money(
        captured=order.captured_amount,
        refunded=order.refunded_amount,
        refunded_outside=order.outside_refunded_amount,
        reserved=order.reserved_amount,
        pending=pending,
        refundable=order.refundable_amount,
        currency=order.currency,
    )
    approvals = list(
        Approval.objects.filter(action__order_id=order.pk).select_related("action").order_by("-decided_at", "-pk")
    )
    url = action_urls(user)  # the person's permissions asked once, not once an action
    return OrderPage(
        order=order,
        money=money,
        actions=[OrderAction(action, url(action.pk)) for action in actions],
        approvals=approvals,
        outside_refunds=list(OutsideRefund.objects.filter(order_id=order.pk).order_by("-created_at", "-pk")),
        events=list(OrderEvent.objects.filter(order_id=order.pk).order_by("-created_at", "-pk")),
        customer=customer_summary_get(order, now=now),
    )
