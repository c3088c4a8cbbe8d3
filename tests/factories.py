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

from actions.models import Agent, Order, RefundRequest
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
