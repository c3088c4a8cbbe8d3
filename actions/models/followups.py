"""Work for people: remedies for failed refunds, discrepancies found by the ledger audit, and
which group owns which kind of action."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import models


class FollowUpStatus(models.TextChoices):
    OPEN = "open", "Open"
    IN_PROGRESS = "in_progress", "In progress"
    DONE = "done", "Done"


class RemedyKind(models.TextChoices):
    UNDECIDED = "undecided", "Not decided yet"
    STORE_CREDIT = "store_credit", "Store credit"
    MANUAL_TRANSFER = "manual_transfer", "Manual bank transfer"
    CHEQUE = "cheque", "Cheque"
    NONE = "none", "None (with a reason)"


class FollowUpWork(models.Model):
    """What a follow-up that people work on keeps alike (a remedy, a discrepancy): the note that
    each step on it adds to, and when it last changed. Assigning an owner writes both, the same
    way for either (actions.review.corrections.followup_owner_assign)."""

    note = models.TextField(blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True


class Remedy(FollowUpWork):
    """A follow-up for a refund that failed for good: the customer still expects their money."""

    action = models.ForeignKey("actions.Action", on_delete=models.PROTECT, related_name="remedies")
    kind = models.CharField(max_length=32, choices=RemedyKind.choices, default=RemedyKind.UNDECIDED)
    status = models.CharField(max_length=16, choices=FollowUpStatus.choices, default=FollowUpStatus.OPEN)
    amount = models.DecimalField(max_digits=14, decimal_places=2, help_text="What the customer expects back.")
    currency = models.CharField(max_length=3)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="remedies"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name_plural = "remedies"
        indexes = [models.Index(fields=["status", "created_at"], name="remedy_status_idx")]

    def __str__(self) -> str:
        return f"remedy for {self.action_id} ({self.get_status_display()})"


class DiscrepancyKind(models.TextChoices):
    EFFECT_WITHOUT_ACTION = "effect_without_action", "Effect with no action"
    DUPLICATE_EFFECT = "duplicate_effect", "Two effects for one action"
    AMOUNT_MISMATCH = "amount_mismatch", "Amount or currency differs"
    SUCCEEDED_WITHOUT_EFFECT = "succeeded_without_effect", "Succeeded with no effect"
    # A refund exists for an action the console holds as not (yet) succeeded: failed for good
    # (a remedy may pay the customer a second time), rejected, cancelled or never submitted.
    EFFECT_FOR_UNSUCCESSFUL_ACTION = "effect_for_unsuccessful_action", "Effect for an action that did not succeed"
    # More than one effect for an action, each beyond the first covered by a person's recorded
    # "send again" (a receiver with no keys and no lookup): shown, not counted as a duplicate.
    REPEAT_BY_DECISION = "repeat_by_decision", "Repeat a person chose to send"


class DiscrepancyStatus(models.TextChoices):
    OPEN = "open", "Open"
    IN_PROGRESS = "in_progress", "In progress"
    EXPLAINED = "explained", "Explained"
    CORRECTED = "corrected", "Corrected"


class Discrepancy(FollowUpWork):
    """A difference between the receiver's ledger and the console's records."""

    kind = models.CharField(max_length=32, choices=DiscrepancyKind.choices)
    action = models.ForeignKey(
        "actions.Action", on_delete=models.PROTECT, null=True, blank=True, related_name="discrepancies"
    )
    provider_reference = models.CharField(max_length=255, blank=True)
    details = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=DiscrepancyStatus.choices, default=DiscrepancyStatus.OPEN)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="discrepancies"
    )
    detected_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-detected_at"]
        verbose_name_plural = "discrepancies"
        indexes = [models.Index(fields=["status", "detected_at"], name="discrepancy_status_idx")]
        # One row per finding: what was found, about which action, at which effect. Two audits
        # (concurrent, or one resumed after a crash) that find the same thing store it once. A
        # finding with no action is keyed by the effect alone: a NULL is never equal to a NULL
        # in a plain unique constraint, so it gets a partial one of its own.
        constraints = [
            models.UniqueConstraint(
                fields=["kind", "action", "provider_reference"],
                condition=models.Q(action__isnull=False),
                name="discrepancy_one_per_finding",
            ),
            models.UniqueConstraint(
                fields=["kind", "provider_reference"],
                condition=models.Q(action__isnull=True),
                name="discrepancy_one_per_orphan_finding",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()}: {self.provider_reference or self.action_id}"


class OwnerGroup(models.Model):
    """Which group owns escalated actions of a kind (finance by default)."""

    kind = models.CharField(max_length=32, unique=True)
    group = models.ForeignKey(Group, on_delete=models.PROTECT, related_name="+")

    def __str__(self) -> str:
        return f"{self.kind} -> {self.group.name}"


class LedgerAuditRun(models.Model):
    """One comparison of the receiver's ledger with the console's records."""

    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    effects_seen = models.PositiveIntegerField(default=0)
    actions_checked = models.PositiveIntegerField(default=0)
    discrepancies_found = models.PositiveIntegerField(default=0)
    discrepancies_new = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-started_at"]

    def __str__(self) -> str:
        return f"ledger audit at {self.started_at:%Y-%m-%d %H:%M}"

    @property
    def ok(self) -> bool:
        return self.finished_at is not None and not self.error and self.discrepancies_found == 0


class LedgerAuditCursor(models.Model):
    """How far the ledger audit has read a kind's receiver: every effect created before
    ``audited_until`` has been compared, and its findings stored in the same transaction."""

    kind = models.CharField(max_length=32, unique=True)
    audited_until = models.DateTimeField()
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.kind} audited until {self.audited_until:%Y-%m-%d %H:%M:%S}"
