"""Webhooks for agents, and the record of notifications sent to people.

An agent's owner registers one URL per agent. Every state change of an action the agent
proposed writes an outbox row (``AgentWebhookDelivery``) in the transaction of the change; the
workers deliver it, signed with the endpoint's secret, and log each attempt.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q


class AgentWebhook(models.Model):
    """Where an agent wants to hear about its actions.

    The secret is kept (an HMAC needs it on every delivery) but shown to the owner only once,
    on the answer to the request that created or rotated it.
    """

    agent = models.OneToOneField("actions.Agent", on_delete=models.CASCADE, related_name="webhook")
    url = models.URLField(max_length=2000)
    secret = models.CharField(max_length=100)
    secret_prefix = models.CharField(max_length=16, help_text="The secret's first characters, to recognise it.")
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    secret_rotated_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"webhook of {self.agent_id}: {self.url}"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "Waiting to be delivered"
    DELIVERED = "delivered", "Delivered"
    FAILED = "failed", "Gave up"


class AgentWebhookDelivery(models.Model):
    """One event to deliver to one agent's webhook: the outbox row.

    Written in the transaction that changed the action, so that a committed change always has
    its row and a rolled-back change never does. A redelivery is a new row for the same event
    (same ``event_id``, which receivers use to deduplicate).
    """

    agent = models.ForeignKey("actions.Agent", on_delete=models.CASCADE, related_name="webhook_deliveries")
    action = models.ForeignKey("actions.Action", on_delete=models.PROTECT, related_name="+")
    audit_event = models.ForeignKey(
        "actions.ActionEvent", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    event_id = models.CharField(max_length=64, db_index=True)
    event_type = models.CharField(max_length=64)
    payload = models.JSONField()
    status = models.CharField(max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    # Set while a worker is sending it, so that a second task for the same row (a sweep that ran
    # before the first publish was consumed) does not send it twice at once.
    locked_until = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(help_text="No retry is scheduled after this (3 days by default).")
    created_at = models.DateTimeField()
    delivered_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    redelivery_of = models.ForeignKey("self", on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["next_attempt_at"], name="webhook_delivery_due_idx", condition=Q(status="pending")),
            models.Index(fields=["agent", "created_at"], name="webhook_delivery_agent_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.event_type} {self.event_id} to agent {self.agent_id} ({self.status})"


class AgentWebhookAttempt(models.Model):
    """One HTTP request of a delivery, with the receiver's answer (or why there was none)."""

    delivery = models.ForeignKey(AgentWebhookDelivery, on_delete=models.CASCADE, related_name="attempt_log")
    attempted_at = models.DateTimeField()
    url = models.URLField(max_length=2000)
    status_code = models.PositiveIntegerField(null=True, blank=True)
    response_excerpt = models.TextField(blank=True)
    error = models.TextField(blank=True)
    duration_ms = models.PositiveIntegerField(default=0)
    succeeded = models.BooleanField(default=False)

    class Meta:
        ordering = ["-attempted_at", "-id"]

    def __str__(self) -> str:
        return f"attempt of delivery {self.delivery_id}: {self.status_code or self.error[:40]}"


class NotificationKind(models.TextChoices):
    WAITING_PROPOSAL = "waiting_proposal", "Proposal waiting"
    ESCALATED = "escalated", "Escalated to you"
    OVERDUE = "overdue", "Overdue"
    POLICY_CHANGE = "policy_change", "Limit or cap change to confirm"
    TRAIL_BREAK = "trail_break", "Audit trail check failed"


class NotificationSent(models.Model):
    """A notification sent to one person about one item: each is sent once.

    Inserted in the transaction that sends the mail; the unique constraint makes a second beat
    (or two at once) skip what was already sent.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=32, choices=NotificationKind.choices)
    subject = models.CharField(max_length=64, help_text="The item, e.g. 'action:12' or 'remedy:3'.")
    sent_at = models.DateTimeField()

    class Meta:
        ordering = ["-sent_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["user", "kind", "subject"], name="notification_once_per_item_person")
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.subject} to {self.user_id}"
