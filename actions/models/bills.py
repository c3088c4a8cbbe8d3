"""Supplier bills that invoice adjustments draw on, and the adjustment requests numbered per bill.

A bill mirrors one supplier invoice (a bill, ACCPAY) in the accounting system. Its
``amount_due`` is what the accounting system said the console may still credit when the bill was
imported; adjustments draw on it exactly as refunds draw on an order's captured amount, so the
same reservation discipline (docs/architecture.md section 5) holds: a version bumped by every change of its
money, and a check constraint that no code path can over-credit it.
"""

from __future__ import annotations

from decimal import Decimal

from django.db import models
from django.db.models import F, Q

from actions.models.agents import AgentOpenedQuerySet


class AdjustmentReason(models.TextChoices):
    """Why a supplier bill is adjusted: why it failed its purchase-order match, or a correction."""

    PRICE_MISMATCH = "price_mismatch", "Price differs from the purchase order"
    QUANTITY_MISMATCH = "quantity_mismatch", "Quantity differs from the purchase order"
    DAMAGED_GOODS = "damaged_goods", "Goods arrived damaged"
    DUPLICATE_CREDIT_NOTE = "duplicate_credit_note", "Duplicate credit note (correction)"


class Bill(models.Model):
    number = models.CharField(max_length=32, unique=True, help_text="The supplier's invoice number.")
    supplier_name = models.CharField(max_length=200)
    currency = models.CharField(max_length=3)
    amount = models.DecimalField(max_digits=14, decimal_places=2, help_text="The bill's original total.")
    amount_due = models.DecimalField(
        max_digits=14,
        decimal_places=2,
        help_text="What was still due at the accounting system when the bill was imported: adjustments draw on it.",
    )
    adjusted_amount = models.DecimalField(max_digits=14, decimal_places=2, default=Decimal("0"))
    reserved_amount = models.DecimalField(max_digits=14, decimal_places=2, default=Decimal("0"))
    version = models.PositiveIntegerField(default=1)
    # The accounting system's InvoiceID: credit notes are allocated to it.
    accounting_reference = models.CharField(max_length=64, blank=True)
    purchase_order = models.CharField(max_length=32, blank=True)
    # Why the bill failed the purchase-order match, as the matcher found it: ordered and invoiced
    # quantities and prices per line, and a sentence for the manager.
    po_mismatch = models.JSONField(default=dict, blank=True)
    voided = models.BooleanField(default=False, help_text="A voided bill can no longer be adjusted.")
    issued_at = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-issued_at"]
        indexes = [models.Index(fields=["accounting_reference"], name="bill_accounting_ref_idx")]
        constraints = [
            # Invariant 5 for bills at the database level: no code path can over-credit a bill.
            models.CheckConstraint(
                condition=Q(adjusted_amount__gte=0)
                & Q(reserved_amount__gte=0)
                & Q(amount_due__gte=F("adjusted_amount") + F("reserved_amount"))
                & Q(amount__gte=F("amount_due")),
                name="bill_money_adds_up",
            ),
        ]

    def __str__(self) -> str:
        return f"bill-{self.number}"

    @property
    def adjustable_amount(self) -> Decimal:
        return self.amount_due - self.adjusted_amount - self.reserved_amount


class AdjustmentRequest(models.Model):
    """A request to adjust one bill, numbered per bill (adjustment-1, adjustment-2...).

    Two separate adjustments to one bill are two requests and so two action ids; a retry of the
    same adjustment is the same request.
    """

    bill = models.ForeignKey(Bill, on_delete=models.PROTECT, related_name="adjustment_requests")
    number = models.PositiveIntegerField()
    external_reference = models.CharField(
        max_length=100, null=True, blank=True, unique=True, help_text="E.g. the matcher's exception id."
    )
    # The agent that opened it over the API, if one did: another agent may not read it back or
    # propose against it (as for refund requests).
    opened_by_agent = models.ForeignKey(
        "actions.Agent", on_delete=models.PROTECT, null=True, blank=True, related_name="adjustment_requests"
    )
    note = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = AgentOpenedQuerySet.as_manager()

    class Meta:
        ordering = ["bill", "number"]
        constraints = [
            models.UniqueConstraint(fields=["bill", "number"], name="adjustment_request_number_per_bill"),
        ]

    def __str__(self) -> str:
        return f"{self.bill}:adjustment-{self.number}"
