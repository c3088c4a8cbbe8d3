"""Approvals: permission for one exact action against one exact state of the order."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q


class Decision(models.TextChoices):
    APPROVE = "approve", "Approved"
    REJECT = "reject", "Rejected"


class ApprovalPolicy(models.TextChoices):
    MANAGER = "manager", "Manager's decision"
    AUTO = "auto_threshold", "Auto-approval below threshold"


class Approval(models.Model):
    """A decision on an action, bound to what the decider saw.

    The binding (order version, amount, currency, payload hash) and the expiry are checked by
    the reservation in the same transaction that moves the action to SUBMITTING (invariant 6).
    """

    action = models.ForeignKey("actions.Action", on_delete=models.PROTECT, related_name="approvals")
    # Null when a policy decided; ``policy`` then says which one and ``decided_by_label`` names it.
    approver = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="approvals"
    )
    decided_by_label = models.CharField(max_length=200)
    policy = models.CharField(max_length=32, choices=ApprovalPolicy.choices)
    policy_detail = models.JSONField(default=dict, blank=True, help_text="The policy's parameters when it applied.")
    decision = models.CharField(max_length=16, choices=Decision.choices)
    note = models.TextField(blank=True)
    decided_at = models.DateTimeField()

    # The version of the action's target the decider saw (an order's, for a refund); null for a
    # kind that binds to no target.
    order_version = models.PositiveIntegerField(null=True, blank=True)
    amount = models.DecimalField(max_digits=14, decimal_places=2)
    currency = models.CharField(max_length=3)
    payload_hash = models.CharField(max_length=80)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-decided_at"]
        indexes = [models.Index(fields=["action", "decided_at"], name="approval_action_idx")]
        constraints = [
            models.CheckConstraint(
                condition=Q(decision="reject") | Q(expires_at__isnull=False),
                name="approval_expires_when_approved",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.get_decision_display()} {self.action_id} by {self.decided_by_label}"


class ApprovalLimit(models.Model):
    """The most a manager may approve for one action, per currency."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="approval_limits")
    currency = models.CharField(max_length=3)
    max_amount = models.DecimalField(max_digits=14, decimal_places=2)

    class Meta:
        ordering = ["user", "currency"]
        constraints = [
            models.UniqueConstraint(fields=["user", "currency"], name="approval_limit_per_user_currency"),
        ]

    def __str__(self) -> str:
        return f"{self.user} up to {self.max_amount} {self.currency}"
