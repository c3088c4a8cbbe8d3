from __future__ import annotations

from decimal import Decimal

from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Upper

from actions.models.agents import AgentOpenedQuerySet


class Order(models.Model):
    """A paid order whose captured amount refunds are drawn from.

    ``version`` is bumped by every change to the order's money, so an approval bound to a
    version is invalidated by any reservation, refund or correction made since.

    ``outside_refunded_amount`` is money refunded at the payment provider without the console
    (another system, a person in the provider's dashboard), learnt from its webhooks. It is
    not any action's money, so invariant 5 keeps it apart from ``refunded_amount``, but it
    is gone from the customer's charge all the same: the refundable balance leaves it out.
    """

    number = models.CharField(max_length=32, unique=True)
    customer_name = models.CharField(max_length=200)
    customer_email = models.EmailField(blank=True)
    currency = models.CharField(max_length=3)
    captured_amount = models.DecimalField(max_digits=14, decimal_places=2)
    refunded_amount = models.DecimalField(max_digits=14, decimal_places=2, default=Decimal("0"))
    reserved_amount = models.DecimalField(max_digits=14, decimal_places=2, default=Decimal("0"))
    outside_refunded_amount = models.DecimalField(
        max_digits=14,
        decimal_places=2,
        default=Decimal("0"),
        help_text="Refunded at the payment provider without the console (learnt from its webhooks).",
    )
    version = models.PositiveIntegerField(default=1)
    charge_reference = models.CharField(max_length=255, blank=True, help_text="The provider's charge id.")
    paid_at = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-paid_at"]
        indexes = [
            # The admin searches orders by charge and by customer email.
            models.Index(fields=["charge_reference"], name="order_charge_ref_idx"),
            models.Index(Upper("customer_email"), name="order_email_upper_idx"),
        ]
        constraints = [
            # Invariant 5 at the database level: no code path can over-refund an order.
            models.CheckConstraint(
                condition=Q(refunded_amount__gte=0)
                & Q(reserved_amount__gte=0)
                & Q(outside_refunded_amount__gte=0)
                & Q(captured_amount__gte=F("refunded_amount") + F("reserved_amount") + F("outside_refunded_amount")),
                name="order_money_adds_up",
            ),
            # One charge is one order: a second order on a charge would make its money
            # refundable twice (once per order).
            models.UniqueConstraint(
                fields=["charge_reference"], condition=~Q(charge_reference=""), name="order_charge_reference_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"order-{self.number}"

    @property
    def refundable_amount(self) -> Decimal:
        return self.captured_amount - self.refunded_amount - self.reserved_amount - self.outside_refunded_amount


class OrderEventKind(models.TextChoices):
    OUTSIDE_REFUND = "outside_refund", "Refund made outside the console"
    OUTSIDE_REFUND_REVERSED = "outside_refund_reversed", "Outside refund failed or was cancelled"


class OrderEvent(models.Model):
    """A line in an order's history for a change no action made (an outside refund).

    Changes made by actions are in their own audit trail (ActionEvent); this trail holds what
    the console learnt from elsewhere, in the same transaction as the change to the order.
    """

    order = models.ForeignKey(Order, on_delete=models.PROTECT, related_name="events")
    kind = models.CharField(max_length=32, choices=OrderEventKind.choices)
    message = models.TextField(help_text="What happened, in words for the people who read the order.")
    amount = models.DecimalField(max_digits=14, decimal_places=2)
    currency = models.CharField(max_length=3)
    reference = models.CharField(max_length=255, blank=True, help_text="The provider's refund id.")
    version_after = models.PositiveIntegerField()
    details = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.order}: {self.kind} {self.amount} {self.currency}"


class OutsideRefund(models.Model):
    """A refund at the payment provider that no action made, booked on its order.

    One row per provider refund id: a replayed or reordered event finds it and changes
    nothing. ``booked`` says whether its amount is in the order's ``outside_refunded_amount``
    (a pending or succeeded refund is; a failed or cancelled one is not).
    """

    order = models.ForeignKey(Order, on_delete=models.PROTECT, related_name="outside_refunds")
    reference = models.CharField(max_length=255, unique=True)
    amount = models.DecimalField(max_digits=14, decimal_places=2)
    currency = models.CharField(max_length=3)
    status = models.CharField(max_length=32)
    booked = models.BooleanField(default=True)
    event_id = models.CharField(max_length=255, help_text="The webhook event that last changed it.")
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.reference} on {self.order}: {self.amount} {self.currency} ({self.status})"


class RequestSource(models.TextChoices):
    TICKET = "ticket", "Support ticket"
    EMAIL = "email", "Customer email"
    AGENT = "agent", "Agent"
    CONSOLE = "console", "Console"


class RefundRequest(models.Model):
    """The customer's request for money back, numbered per order (request-1, request-2...)."""

    order = models.ForeignKey(Order, on_delete=models.PROTECT, related_name="refund_requests")
    number = models.PositiveIntegerField()
    external_reference = models.CharField(
        max_length=100, null=True, blank=True, unique=True, help_text="E.g. the support ticket's id."
    )
    source = models.CharField(max_length=16, choices=RequestSource.choices, default=RequestSource.TICKET)
    # Why the customer asks (a ReasonCode); blank only on requests opened before it was asked.
    reason_code = models.CharField(max_length=64, blank=True)
    # The agent that opened it over the API, if one did: another agent may not read it back.
    opened_by_agent = models.ForeignKey(
        "actions.Agent", on_delete=models.PROTECT, null=True, blank=True, related_name="refund_requests"
    )
    note = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = AgentOpenedQuerySet.as_manager()

    class Meta:
        ordering = ["order", "number"]
        constraints = [
            models.UniqueConstraint(fields=["order", "number"], name="refund_request_number_per_order"),
        ]

    def __str__(self) -> str:
        return f"{self.order}:request-{self.number}"
