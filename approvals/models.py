"""Approvals: permission for one exact action against one exact state of the order."""

from __future__ import annotations

import re
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q

CURRENCY_PATTERN = re.compile(r"^[A-Z]{3}$")


def validate_currency(value: str) -> None:
    """An ISO 4217 code the console works in (upper case, as the provider and the orders spell it)."""
    if not CURRENCY_PATTERN.match(value or ""):
        raise ValidationError("Use an ISO 4217 currency code in capitals, e.g. EUR.")
    if value not in settings.CONSOLE_CURRENCIES:
        raise ValidationError(f"The console works in {', '.join(settings.CONSOLE_CURRENCIES)} only.")


def validate_positive(value: Decimal) -> None:
    if value is None or value <= 0:
        raise ValidationError("Give an amount greater than zero.")


class Decision(models.TextChoices):
    APPROVE = "approve", "Approved"
    REJECT = "reject", "Rejected"


class RejectionReason(models.TextChoices):
    """Why a manager said no, as the picker offers it; the note adds the detail."""

    NOT_ENOUGH_EVIDENCE = "not_enough_evidence", "Not enough evidence"
    DUPLICATE = "duplicate", "Duplicate of another request"
    WRONG_AMOUNT = "wrong_amount", "The amount is wrong"
    NOT_ELIGIBLE = "not_eligible", "The customer is not eligible"
    AGAINST_POLICY = "against_policy", "Against our policy"
    OTHER = "other", "Other (say why in the note)"


class ApprovalPolicy(models.TextChoices):
    MANAGER = "manager", "Manager's decision"
    AUTO = "auto_threshold", "Auto-approval below threshold"


class ApprovalGroup(models.Model):
    """One decision that approves several proposals on one target (an order, a bill) together.

    Every member's approval binds the target's version the manager saw (``approved_version``).
    The members then reserve one after another, and each reservation raises the target's
    version by one; ``next_version`` is the version the next member's reservation expects, and
    advances in the same transaction as each sibling's reservation (actions.engine.claim). So a
    member goes stale when anything other than its own siblings changed the target, and never
    because a sibling reserved first (docs/architecture.md section 5).
    """

    approver = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="approval_groups")
    decided_at = models.DateTimeField()
    approved_version = models.PositiveIntegerField()
    next_version = models.PositiveIntegerField()
    size = models.PositiveSmallIntegerField(help_text="How many proposals the decision approved.")
    total_amount = models.DecimalField(max_digits=14, decimal_places=2)
    currency = models.CharField(max_length=3)
    note = models.TextField(blank=True)

    class Meta:
        ordering = ["-decided_at"]
        constraints = [
            # The chain only moves forward, from the version the manager saw.
            models.CheckConstraint(
                condition=Q(next_version__gte=models.F("approved_version")), name="approval_group_version_forward"
            ),
        ]

    def __str__(self) -> str:
        return f"group decision {self.pk}: {self.total_amount} {self.currency}"


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
    # Set when this approval was one of several given together (see ApprovalGroup).
    group = models.ForeignKey(ApprovalGroup, on_delete=models.PROTECT, null=True, blank=True, related_name="approvals")
    # A rejection's reason from the picker (blank on approvals and on older rejections).
    reason_code = models.CharField(max_length=32, choices=RejectionReason.choices, blank=True)

    class Meta:
        ordering = ["-decided_at"]
        indexes = [
            models.Index(fields=["action", "decided_at"], name="approval_action_idx"),
            # The manager's "Decided" tab: her decisions, newest first.
            models.Index(fields=["approver", "decided_at"], name="approval_approver_idx"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(decision="reject") | Q(expires_at__isnull=False),
                name="approval_expires_when_approved",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.get_decision_display()} {self.action_id} by {self.decided_by_label}"


class ApprovalLimit(models.Model):
    """The most a manager may approve for one action, per currency. Changes are proposed in the
    admin and written here only once a member of finance confirms them (``PolicyChange``)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="approval_limits")
    currency = models.CharField(max_length=3, validators=[validate_currency])
    max_amount = models.DecimalField(max_digits=14, decimal_places=2, validators=[validate_positive])

    class Meta:
        ordering = ["user", "currency"]
        constraints = [
            models.UniqueConstraint(fields=["user", "currency"], name="approval_limit_per_user_currency"),
            # The forms validate these too; the database refuses them from any other path.
            models.CheckConstraint(condition=Q(max_amount__gt=0), name="approval_limit_positive"),
            models.CheckConstraint(condition=Q(currency__regex=r"^[A-Z]{3}$"), name="approval_limit_iso_currency"),
        ]

    def __str__(self) -> str:
        return f"{self.user} up to {self.max_amount} {self.currency}"


class CapScope(models.TextChoices):
    TARGET = "target", "Per target (order)"
    AGENT = "agent", "Per agent"


class AutoApprovalCap(models.Model):
    """A limit on what the auto-approval policy may approve without a person (approvals/caps.py).

    - Per target: within ``window_hours``, at most ``max_amount`` in total and at most
      ``max_count`` actions auto-approved on one order.
    - Per agent: within ``window_hours`` (a day by default), at most ``max_amount`` in total
      auto-approved for one agent's proposals.

    One row per scope and currency; without a row the settings' defaults apply. Past a cap a
    proposal waits for a manager. Changes are proposed in the admin and written here only once
    a member of finance confirms them (``PolicyChange``).
    """

    scope = models.CharField(max_length=16, choices=CapScope.choices)
    currency = models.CharField(max_length=3, validators=[validate_currency])
    max_amount = models.DecimalField(max_digits=14, decimal_places=2, validators=[validate_positive])
    max_count = models.PositiveIntegerField(
        null=True, blank=True, help_text="Per target only: how many auto-approved actions; empty for no count limit."
    )
    window_hours = models.PositiveIntegerField(default=24)

    class Meta:
        ordering = ["scope", "currency"]
        constraints = [
            models.UniqueConstraint(fields=["scope", "currency"], name="auto_approval_cap_per_scope_currency"),
            models.CheckConstraint(condition=Q(max_amount__gt=0), name="auto_approval_cap_positive"),
            models.CheckConstraint(condition=Q(window_hours__gt=0), name="auto_approval_cap_window_positive"),
        ]

    def __str__(self) -> str:
        count = f", {self.max_count} actions" if self.max_count is not None else ""
        return f"{self.get_scope_display()}: {self.max_amount} {self.currency}{count} per {self.window_hours} h"


def _money_text(value: object) -> str:
    return "none" if value is None else str(value)


class PolicyTarget(models.TextChoices):
    APPROVAL_LIMIT = "approval_limit", "Approval limit"
    AUTO_APPROVAL_CAP = "auto_approval_cap", "Auto-approval cap"


class PolicyOperation(models.TextChoices):
    CREATE = "create", "New"
    UPDATE = "update", "Change"
    DELETE = "delete", "Removal"


class PolicyChangeStatus(models.TextChoices):
    PENDING = "pending", "Waiting for finance"
    CONFIRMED = "confirmed", "Confirmed"
    REJECTED = "rejected", "Rejected"


class PolicyChange(models.Model):
    """A change to an approval limit or an auto-approval cap, waiting for a second person.

    The admin site proposes; a member of finance other than the proposer confirms or rejects
    (approvals/policy_changes.py). Until it is confirmed the old value stays in force: the
    limit or cap row is written only by the confirmation, in the same transaction.

    The row is named by its natural key (the limit's person and currency, the cap's scope and
    currency), which each table holds unique: a change names its row before it exists (a new
    limit) and after it is gone (a removal). ``before`` is the row's values when proposed
    (null for a new row), ``after`` the values asked for (null for a removal); a confirmation
    applies ``after`` only while the row still holds ``before``.
    """

    target = models.CharField(max_length=32, choices=PolicyTarget.choices)
    operation = models.CharField(max_length=16, choices=PolicyOperation.choices)
    # An approval limit's person; null for a cap.
    limit_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    # A cap's scope; blank for an approval limit.
    scope = models.CharField(max_length=16, choices=CapScope.choices, blank=True)
    currency = models.CharField(max_length=3)
    before = models.JSONField(null=True, blank=True, help_text="The row's values when proposed; null for a new row.")
    after = models.JSONField(null=True, blank=True, help_text="The values asked for; null for a removal.")
    status = models.CharField(max_length=16, choices=PolicyChangeStatus.choices, default=PolicyChangeStatus.PENDING)
    proposed_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    proposed_at = models.DateTimeField()
    # Who confirmed or rejected it (``status`` says which), and when.
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_note = models.TextField(blank=True)

    class Meta:
        ordering = ["-proposed_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=(
                    Q(target="approval_limit", limit_user__isnull=False, scope="")
                    | Q(target="auto_approval_cap", limit_user__isnull=True) & ~Q(scope="")
                ),
                name="policy_change_names_its_row",
            ),
            models.CheckConstraint(
                condition=(
                    Q(status="pending", decided_by__isnull=True, decided_at__isnull=True)
                    | ~Q(status="pending") & Q(decided_by__isnull=False, decided_at__isnull=False)
                ),
                name="policy_change_decided_once",
            ),
            models.CheckConstraint(
                condition=(
                    Q(operation="create", before__isnull=True, after__isnull=False)
                    | Q(operation="update", before__isnull=False, after__isnull=False)
                    | Q(operation="delete", before__isnull=False, after__isnull=True)
                ),
                name="policy_change_before_after",
            ),
            # One change at a time per row: a second would be proposed against a value that the
            # first may replace, so it waits until finance has decided the first.
            models.UniqueConstraint(
                fields=["limit_user", "currency"],
                condition=Q(status="pending", target="approval_limit"),
                name="policy_change_one_pending_per_limit",
            ),
            models.UniqueConstraint(
                fields=["scope", "currency"],
                condition=Q(status="pending", target="auto_approval_cap"),
                name="policy_change_one_pending_per_cap",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.get_operation_display()} of the {self.what()}: {self.status}"

    def what(self) -> str:
        """The row, in words: "approval limit of maria in EUR", "auto-approval cap per agent in EUR"."""
        if self.target == PolicyTarget.APPROVAL_LIMIT:
            assert self.limit_user is not None
            return f"approval limit of {self.limit_user.get_username()} in {self.currency}"
        return f"auto-approval cap {CapScope(self.scope).label.lower()} in {self.currency}"

    def values_text(self, values: dict[str, object] | None) -> str:
        """``before`` or ``after`` in words, with the currency: "500.00 EUR", "50.00 EUR, at most
        2 actions, per 168 h", or "none" for a row that does not exist."""
        if values is None:
            return "none"
        text = f"{_money_text(values.get('max_amount'))} {self.currency}"
        if self.target == PolicyTarget.AUTO_APPROVAL_CAP:
            if values.get("max_count") is not None:
                text += f", at most {values['max_count']} actions"
            text += f", per {values.get('window_hours')} h"
        return text

    def before_text(self) -> str:
        return self.values_text(self.before)

    def after_text(self) -> str:
        return self.values_text(self.after)

    def confirm(self, *, by: Any, at: datetime) -> None:
        self.status = PolicyChangeStatus.CONFIRMED
        self.decided_by = by
        self.decided_at = at

    def reject(self, *, by: Any, at: datetime, note: str = "") -> None:
        self.status = PolicyChangeStatus.REJECTED
        self.decided_by = by
        self.decided_at = at
        self.decision_note = note


class PendingRejection(models.Model):
    """A rejection a manager asked for that commits once its undo window has passed.

    The action stays PROPOSED (nothing is dispatched from PROPOSED) and nobody may approve it
    while the row exists. ``approvals.services.rejection_commit`` and ``rejection_undo`` both
    lock the action's row and then delete this row, so exactly one of them wins: a rejection
    is never lost (the row is durable, and every reader commits the due ones) and never doubled
    (the commit is a transition from PROPOSED, done once).
    """

    action = models.OneToOneField("actions.Action", on_delete=models.CASCADE, related_name="pending_rejection")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    reason_code = models.CharField(max_length=32, choices=RejectionReason.choices)
    note = models.TextField(blank=True)
    requested_at = models.DateTimeField()
    commit_at = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return f"rejection of {self.action_id} pending until {self.commit_at:%H:%M:%S}"


class WorkflowApproval(models.Model):
    """One decision on a workflow's whole plan (docs/architecture.md section 10).

    It binds every target's version and each step's amount and currency (``bindings``, one entry
    per step), the plan's hash and an expiry; ``totals`` is the plan's money per currency, which
    the approver's limit covers. Each child action later gets its own ``Approval`` copied from
    its step's binding, which the claim checks as for any action.
    """

    workflow = models.ForeignKey("actions.Workflow", on_delete=models.PROTECT, related_name="approvals")
    approver = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="workflow_approvals"
    )
    decided_by_label = models.CharField(max_length=200)
    policy = models.CharField(max_length=32, choices=ApprovalPolicy.choices)
    policy_detail = models.JSONField(default=dict, blank=True)
    decision = models.CharField(max_length=16, choices=Decision.choices)
    note = models.TextField(blank=True)
    decided_at = models.DateTimeField()
    plan_hash = models.CharField(max_length=80)
    bindings = models.JSONField(default=list, help_text="Per step: target, target version, amount, currency.")
    totals = models.JSONField(default=dict, help_text="The plan's money per currency.")
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-decided_at"]
        constraints = [
            models.CheckConstraint(
                condition=Q(decision="reject") | Q(expires_at__isnull=False),
                name="workflow_approval_expires_when_approved",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.get_decision_display()} {self.workflow_id} by {self.decided_by_label}"
