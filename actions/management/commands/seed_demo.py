"""Seed demo users, orders, refund requests and proposals, so a newcomer can log in at once.

Idempotent: running it again changes nothing that exists. The orders' charges are registered
with the sandbox provider (when it is reachable) so that approved refunds can execute.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.contrib.auth.models import Group, User
from django.core.management.base import BaseCommand
from django.db import transaction
from django.utils import timezone

from actions.models import Action, Agent, Order, RefundRequest
from actions.providers.money import to_minor_units
from actions.services import Actor, action_propose_refund
from approvals.models import ApprovalLimit
from console.roles import ensure_roles

DEMO_PASSWORD = "demo-password"  # noqa: S105 - printed in the README for the local demo only

USERS: list[dict[str, Any]] = [
    {
        "username": "maria",
        "name": ("Maria", "Manager"),
        "roles": ["manager"],
        "limits": {"EUR": "500", "USD": "500", "GBP": "400", "JPY": "60000"},
    },
    {"username": "mark", "name": ("Mark", "Manager"), "roles": ["manager"], "limits": {"EUR": "100"}},
    {"username": "fiona", "name": ("Fiona", "Finance"), "roles": ["finance"]},
    {"username": "felix", "name": ("Felix", "Finance"), "roles": ["finance"]},
    {"username": "adam", "name": ("Adam", "Admin"), "roles": ["admin"], "staff": True, "superuser": True},
    {"username": "otto", "name": ("Otto", "Owner"), "roles": ["agent"]},
]

# number, customer, currency, captured, days since payment
ORDERS = [
    ("4821", "Ada Lovelace", "EUR", "120.00", 3),
    ("4822", "Alan Turing", "EUR", "89.90", 5),
    ("4823", "Grace Hopper", "USD", "240.00", 1),
    ("4824", "Edsger Dijkstra", "EUR", "35.00", 8),
    ("4825", "Barbara Liskov", "GBP", "64.50", 2),
    ("4826", "Katherine Johnson", "JPY", "12800", 4),
    ("4827", "Donald Knuth", "EUR", "310.00", 12),
    ("4828", "Margaret Hamilton", "USD", "58.00", 6),
]

# order, amount, reason, evidence: above the auto-approval thresholds, so they wait for a manager
PROPOSALS = [
    ("4821", "45.00", "damaged", "Customer sent photos of a cracked screen (ticket T-1001)."),
    ("4823", "240.00", "not_received", "Carrier confirms the parcel was lost in transit (ticket T-1002)."),
    ("4825", "64.50", "cancelled_order", "Order cancelled before dispatch (ticket T-1003)."),
    ("4827", "150.00", "not_as_described", "Wrong colour delivered; customer returned it (ticket T-1004)."),
]


class Command(BaseCommand):
    help = "Seed demo users (password: demo-password), orders, refund requests and proposals."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--sandbox", default=settings.PROVIDER_API_BASE, help="the sandbox provider's address")

    def handle(self, *args: Any, **options: Any) -> None:
        ensure_roles()
        with transaction.atomic():
            users = {spec["username"]: self._user(spec) for spec in USERS}
            agent, _ = Agent.objects.get_or_create(
                name="support-bot", defaults={"owner": users["otto"], "scopes": ["refund"]}
            )
            orders = [self._order(*row) for row in ORDERS]
        self._register_charges(options["sandbox"], orders)

        actor = Actor.for_agent(agent)
        for number, amount, reason, evidence in PROPOSALS:
            order = Order.objects.get(number=number)
            request, _ = RefundRequest.objects.get_or_create(
                order=order, number=1, defaults={"external_reference": f"T-{number}", "note": evidence}
            )
            action_propose_refund(
                order_number=number,
                request_number=request.number,
                amount=amount,
                currency=order.currency,
                reason_code=reason,
                evidence=evidence,
                proposer=actor,
            )
        self.stdout.write(
            self.style.SUCCESS(
                f"Demo data ready: {Order.objects.count()} orders, {Action.objects.count()} actions. "
                f"Log in as maria (manager), fiona (finance) or adam (admin) with password {DEMO_PASSWORD!r}."
            )
        )

    def _user(self, spec: dict[str, Any]) -> User:
        user, created = User.objects.get_or_create(
            username=spec["username"],
            defaults={
                "first_name": spec["name"][0],
                "last_name": spec["name"][1],
                "email": f"{spec['username']}@example.com",
                "is_staff": spec.get("staff", False),
                "is_superuser": spec.get("superuser", False),
            },
        )
        if created:
            user.set_password(DEMO_PASSWORD)
            user.save(update_fields=["password"])
        for role in spec["roles"]:
            user.groups.add(Group.objects.get(name=role))
        for currency, amount in spec.get("limits", {}).items():
            ApprovalLimit.objects.get_or_create(user=user, currency=currency, defaults={"max_amount": Decimal(amount)})
        return user

    def _order(self, number: str, customer: str, currency: str, captured: str, days: int) -> Order:
        order, _ = Order.objects.get_or_create(
            number=number,
            defaults={
                "customer_name": customer,
                "customer_email": f"{customer.split()[0].lower()}@example.com",
                "currency": currency,
                "captured_amount": Decimal(captured),
                "charge_reference": f"ch_demo_{number}",
                "paid_at": timezone.now() - timedelta(days=days),
            },
        )
        return order

    def _register_charges(self, sandbox: str, orders: list[Order]) -> None:
        """Tell the sandbox about each order's charge; an existing charge is left as it is."""
        for order in orders:
            body = json.dumps(
                {
                    "id": order.charge_reference,
                    "amount": to_minor_units(order.captured_amount, order.currency),
                    "currency": order.currency.lower(),
                    "metadata": {"order": order.number},
                }
            ).encode()
            request = urllib.request.Request(  # noqa: S310 - a configured http(s) address
                f"{sandbox.rstrip('/')}/_sandbox/charges",
                data=body,
                headers={"Content-Type": "application/json"},
                method="POST",
            )
            try:
                with urllib.request.urlopen(request, timeout=5):  # noqa: S310
                    pass
            except urllib.error.HTTPError as error:
                if error.code != 400:  # 400: the charge exists already
                    self.stderr.write(f"sandbox refused charge {order.charge_reference}: HTTP {error.code}")
            except OSError as error:
                self.stderr.write(
                    f"The sandbox at {sandbox} is not reachable ({error}); charges were not registered. "
                    "Start it and run seed_demo again."
                )
                return
