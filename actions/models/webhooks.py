"""Events the payment provider sent to the console's webhook endpoint, stored by their id."""

from __future__ import annotations

from django.db import models


class WebhookEventOutcome(models.TextChoices):
    SETTLES_ACTION = "settles_action", "Refund of a known action: reconciliation asked to look now"
    OUTSIDE_REFUND = "outside_refund", "Refund made outside the console: booked on its order"
    NO_CHANGE = "no_change", "Nothing to change"
    UNMATCHED = "unmatched", "No order has this charge"
    IGNORED = "ignored", "Event type not handled"


class WebhookEvent(models.Model):
    """One event, stored once by its id in the transaction that applied it.

    A replay of the same id finds this row and changes nothing; the provider is told 200 so
    that it stops retrying.
    """

    provider = models.CharField(max_length=32, default="stripe")
    event_id = models.CharField(max_length=255, unique=True)
    type = models.CharField(max_length=64)
    payload = models.JSONField()
    outcome = models.CharField(max_length=32, choices=WebhookEventOutcome.choices)
    note = models.TextField(blank=True)
    received_at = models.DateTimeField(db_index=True)
    deliveries = models.PositiveIntegerField(default=1, help_text="How many times the provider sent it.")

    class Meta:
        ordering = ["-received_at", "-id"]

    def __str__(self) -> str:
        return f"{self.event_id} ({self.type}): {self.outcome}"
