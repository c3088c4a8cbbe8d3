from __future__ import annotations

from django.conf import settings
from django.db import models

from actions.models.append_only import AppendOnly, AppendOnlyQuerySet, TrailIsAppendOnly


class SecurityEventKind(models.TextChoices):
    TOKEN_ISSUED = "token_issued", "Agent token issued"
    TOKEN_ROTATED = "token_rotated", "Agent token rotated"
    TOKEN_REVOKED = "token_revoked", "Agent token revoked"
    WEBHOOK_CHANGED = "webhook_changed", "Agent webhook URL set or removed"
    WEBHOOK_SECRET_ROTATED = "webhook_secret_rotated", "Agent webhook secret issued"
    AGENT_OWNER_CHANGED = "agent_owner_changed", "Agent owner changed"
    # Written when the admin site changed limits and caps at once; kept for the rows written then.
    APPROVAL_LIMIT_CHANGED = "approval_limit_changed", "Approval limit changed"
    APPROVAL_LIMIT_DELETED = "approval_limit_deleted", "Approval limit deleted"
    CAP_CHANGED = "cap_changed", "Auto-approval cap changed"
    CAP_DELETED = "cap_deleted", "Auto-approval cap deleted"
    # Limits and caps now change in two steps: proposed in the admin site, then confirmed (or
    # rejected) by a second person in finance (approvals/policy_changes.py).
    POLICY_CHANGE_PROPOSED = "policy_change_proposed", "Limit or cap change proposed"
    POLICY_CHANGE_CONFIRMED = "policy_change_confirmed", "Limit or cap change confirmed"
    POLICY_CHANGE_REJECTED = "policy_change_rejected", "Limit or cap change rejected"


class SecurityTrailIsAppendOnly(TrailIsAppendOnly):
    pass


class SecurityEvent(AppendOnly):
    """One line of the append-only trail of who changed who may do what.

    Action events record what happened to one action; these record changes to the rules
    around all of them: tokens issued to agents, agents' owners, managers' approval limits and
    the caps on auto-approval. Each is written in the same transaction as the change.
    """

    kind = models.CharField(max_length=32, choices=SecurityEventKind.choices)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    actor_label = models.CharField(max_length=200)
    subject = models.CharField(max_length=200, help_text="What changed, e.g. 'agent refund-bot'.")
    detail = models.JSONField(default=dict, blank=True, help_text="Before and after, never a secret.")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    objects = AppendOnlyQuerySet["SecurityEvent"].as_manager()
    trail_name = "security events"
    append_only_error = SecurityTrailIsAppendOnly

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.get_kind_display()}: {self.subject} by {self.actor_label}"


class RateCounter(models.Model):
    """One fixed-window request counter of the agent API (actions/api/ratelimit.py)."""

    key = models.CharField(max_length=100)
    window = models.BigIntegerField(help_text="Epoch minute the window starts at.")
    count = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["key", "window"], name="rate_counter_key_window")]

    def __str__(self) -> str:
        return f"{self.key}@{self.window}: {self.count}"
