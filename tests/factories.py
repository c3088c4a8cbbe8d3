"""Named personas and small builders shared by the tests.

Plain functions rather than a factory library: the objects are few and their defaults
should be visible where they are used.
"""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.contrib.auth.models import Group, User
from django.utils import timezone

from actions.models import AdjustmentRequest, Agent, Bill, Order, RefundRequest
from approvals.models import ApprovalLimit
from console.roles import ensure_roles

_numbers = itertools.count(1000)

PASSWORD = "correct-horse-battery-staple"


def make_user(username: str, *roles: str, limits: dict[str, str] | None = None, **extra: Any) -> User:
    ensure_roles()
    user = User.objects.create_user(username=username, password=PASSWORD, email=f"{username}@example.com", **extra)
    for role in roles:
        user.groups.add(Group.objects.get(name=role))
    for currency, amount in (limits or {}).items():
        ApprovalLimit.objects.create(user=user, currency=currency, max_amount=Decimal(amount))
    return user


def make_agent(owner: User, name: str = "support-bot", scopes: list[str] | None = None) -> Agent:
    return Agent.objects.create(name=name, owner=owner, scopes=scopes if scopes is not None else ["refund"])


def make_order(
    *,
    number: str | None = None,
    currency: str = "EUR",
    captured: str = "100.00",
    paid_at: datetime | None = None,
    customer_name: str = "Ada Lovelace",
) -> Order:
    number = number or str(next(_numbers))
    return Order.objects.create(
        number=number,
        customer_name=customer_name,
        customer_email="ada@example.com",
        currency=currency,
        captured_amount=Decimal(captured),
        charge_reference=f"ch_{number}",
        paid_at=paid_at or timezone.now() - timedelta(days=2),
    )


def make_request(order: Order, number: int | None = None, **extra: Any) -> RefundRequest:
    if number is None:
        number = RefundRequest.objects.filter(order=order).count() + 1
    return RefundRequest.objects.create(order=order, number=number, **extra)


def make_bill(
    *,
    number: str | None = None,
    currency: str = "EUR",
    amount: str = "200.00",
    amount_due: str | None = None,
    supplier_name: str = "Acme Supplies",
    accounting_reference: str | None = None,
) -> Bill:
    """A supplier bill that failed its purchase-order match (ordered 10 at 18.00, invoiced at 20.00)."""
    number = number or f"INV-{next(_numbers)}"
    return Bill.objects.create(
        number=number,
        supplier_name=supplier_name,
        currency=currency,
        amount=Decimal(amount),
        amount_due=Decimal(amount_due or amount),
        accounting_reference=accounting_reference if accounting_reference is not None else f"inv-{number.lower()}",
        purchase_order=f"PO-{number}",
        po_mismatch={
            "summary": "Unit price 20.00 on the bill, 18.00 on the purchase order.",
            "lines": [{"item": "Widget", "ordered_qty": 10, "ordered_price": "18.00", "invoiced_price": "20.00"}],
        },
        issued_at=timezone.now() - timedelta(days=3),
    )


def make_adjustment_request(bill: Bill, number: int | None = None, **extra: Any) -> AdjustmentRequest:
    if number is None:
        number = AdjustmentRequest.objects.filter(bill=bill).count() + 1
    return AdjustmentRequest.objects.create(bill=bill, number=number, **extra)
