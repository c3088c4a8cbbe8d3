"""The action: one intended effect on the outside world, and its append-only audit trail.

The status is a protected FSM field. Transitions are verbs that only change fields: no I/O and
no saves. Services in ``actions.services`` and ``approvals.services`` run them inside a
transaction and write the ActionEvent in that same transaction.
"""

from __future__ import annotations

import copy
import functools
from datetime import datetime
from typing import Any, ClassVar
from uuid import UUID

from django.conf import settings
from django.db import models
from django.db.models import Q
from django_fsm import RETURN_VALUE, ConcurrentTransitionMixin, FSMField, transition

from actions import permissions as perms
from actions.models.append_only import AppendOnly, AppendOnlyQuerySet, TrailIsAppendOnly
from actions.models.bills import AdjustmentReason


class ActionKind(models.TextChoices):
    REFUND = "refund", "Refund"
    # Recovers money the receiver paid out twice (a duplicate effect found by the ledger audit).
    # Only the admin's correction service creates one; it must never go to the refund provider.
    COMPENSATION = "compensation", "Compensation"
    # Tells a supplier about a change, by email: a receiver with no keys and no lookup.
    SUPPLIER_EMAIL = "supplier_email", "Supplier email"
    # A credit note against a supplier bill in the accounting system (actions.kinds.invoice_adjustment.contract).
    INVOICE_ADJUSTMENT = "invoice-adjustment", "Invoice adjustment"
    # The correction of a duplicate credit note: void it, through the same engine.
    CREDIT_NOTE_VOID = "credit-note-void", "Credit note void"
    # A notice to the customer of an order, sent only as a workflow's step (refund_with_notice).
    CUSTOMER_EMAIL = "customer_email", "Customer email"


class ActionStatus(models.TextChoices):
    # NEW only exists in memory, between building an Action and its first transition; a
    # check constraint keeps it out of the table.
    NEW = "NEW", "New"
    PROPOSED = "PROPOSED", "Proposed"
    REJECTED = "REJECTED", "Rejected"
    AUTHORIZED = "AUTHORIZED", "Authorized"
    STALE = "STALE", "Stale"
    CANCELLED = "CANCELLED", "Cancelled"
    SUBMITTING = "SUBMITTING", "Submitting"
    SETTLING = "SETTLING", "Settling"
    SUCCEEDED = "SUCCEEDED", "Succeeded"
    FAILED_FINAL = "FAILED_FINAL", "Failed (final)"
    UNKNOWN = "UNKNOWN", "Unknown"
    NEEDS_REVIEW = "NEEDS_REVIEW", "Needs review"


S = ActionStatus

# Statuses in which the order's reserved amount includes this action's amount.
RESERVING_STATUSES = frozenset({S.SUBMITTING, S.UNKNOWN, S.SETTLING, S.NEEDS_REVIEW})
# Statuses from which nothing can happen any more.
TERMINAL_STATUSES = frozenset({S.REJECTED, S.CANCELLED, S.SUCCEEDED, S.FAILED_FINAL})
# Statuses whose effect is unresolved: the finance review queue watches these.
UNRESOLVED_STATUSES = frozenset({S.SUBMITTING, S.UNKNOWN, S.SETTLING, S.NEEDS_REVIEW})
# The statuses the partial index action_live_idx holds (in its migration's order): an action
# still to be claimed or with its outcome open. A query that names them all is answered from it.
LIVE_INDEX_STATUSES = ("AUTHORIZED", "SUBMITTING", "UNKNOWN", "SETTLING", "NEEDS_REVIEW")


class ReasonCode(models.TextChoices):
    DUPLICATE_CHARGE = "duplicate_charge", "Duplicate charge"
    NOT_RECEIVED = "not_received", "Goods not received"
    DAMAGED = "damaged", "Damaged or defective"
    NOT_AS_DESCRIBED = "not_as_described", "Not as described"
    CANCELLED_ORDER = "cancelled_order", "Order cancelled"
    LATE_DELIVERY = "late_delivery", "Late delivery"
    GOODWILL = "goodwill", "Goodwill gesture"


class ActorKind(models.TextChoices):
    USER = "user", "User"
    AGENT = "agent", "Agent"
    SYSTEM = "system", "System"


class MaterialFieldChanged(Exception):
    """Raised when code tries to save a change to an action's material fields."""


class Action(ConcurrentTransitionMixin, models.Model):
    # Fields that define the business action. They never change after the proposal
    # (invariant 4): save() refuses, and on PostgreSQL a trigger refuses too.
    MATERIAL_FIELDS: ClassVar[tuple[str, ...]] = (
        "action_id",
        "kind",
        "idempotency_key",
        "payload",
        "payload_hash",
        "order_id",
        "refund_request_id",
        "bill_id",
        "adjustment_request_id",
        "amount",
        "currency",
        "reason_code",
    )

    action_id = models.CharField(max_length=255, unique=True)
    kind = models.CharField(max_length=32, choices=ActionKind.choices)
    idempotency_key = models.CharField(max_length=255, unique=True)
    payload = models.JSONField(help_text="The material payload, as proposed.")
    payload_hash = models.CharField(max_length=80, help_text="sha256 of the payload's canonical JSON.")
    order = models.ForeignKey("actions.Order", on_delete=models.PROTECT, null=True, blank=True, related_name="actions")
    refund_request = models.ForeignKey(
        "actions.RefundRequest", on_delete=models.PROTECT, null=True, blank=True, related_name="actions"
    )
    # An invoice adjustment's target. A nullable foreign key per kind of target (like ``order``)
    # rather than a generic relation: the reservation's conditional UPDATE, the PROTECT on delete
    # and the inbox's joins all need a real column.
    bill = models.ForeignKey("actions.Bill", on_delete=models.PROTECT, null=True, blank=True, related_name="actions")
    adjustment_request = models.ForeignKey(
        "actions.AdjustmentRequest", on_delete=models.PROTECT, null=True, blank=True, related_name="actions"
    )
    amount = models.DecimalField(max_digits=14, decimal_places=2)
    currency = models.CharField(max_length=3)
    # Refunds give a ReasonCode, invoice adjustments and their corrections an AdjustmentReason.
    reason_code = models.CharField(max_length=64, choices=[*ReasonCode.choices, *AdjustmentReason.choices])
    evidence = models.TextField(blank=True, help_text="The proposer's explanation for the manager.")

    proposed_by_agent = models.ForeignKey(
        "actions.Agent", on_delete=models.PROTECT, null=True, blank=True, related_name="actions"
    )
    # The person accountable for the proposal: the console user who proposed it, or the owner
    # of the proposing agent. Four eyes compare the approver with this user.
    proposed_by_user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="proposed_actions",
    )

    status = FSMField(default=S.NEW, choices=ActionStatus.choices, protected=True)
    rejection_reasons = models.JSONField(default=list, blank=True)

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="owned_actions",
        help_text="The named person who must resolve this action when it needs review.",
    )
    due_at = models.DateTimeField(null=True, blank=True)

    lease_token = models.UUIDField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)

    attempt_count = models.PositiveIntegerField(default=0)
    first_attempt_at = models.DateTimeField(null=True, blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    reconcile_attempts = models.PositiveIntegerField(default=0)
    reconcile_failures = models.PositiveIntegerField(default=0)
    next_reconcile_at = models.DateTimeField(null=True, blank=True)
    provider_reference = models.CharField(max_length=255, blank=True)

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    status_changed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        permissions = [
            ("propose_action", "Can propose actions"),
            ("decide_action", "Can approve or reject proposed actions"),
            ("cancel_action", "Can cancel actions before submission"),
            ("resolve_action", "Can resolve actions that need review"),
            ("correct_action", "Can correct actions through the admin"),
        ]
        constraints = [
            models.CheckConstraint(condition=~Q(status=S.NEW), name="action_status_not_new"),
            # An action that moves no money (an email) carries none: zero, and no currency.
            models.CheckConstraint(
                condition=Q(amount__gt=0) | Q(amount=0, currency=""), name="action_amount_positive_or_no_money"
            ),
        ]
        indexes = [
            models.Index(fields=["status", "lease_expires_at"], name="action_status_lease_idx"),
            models.Index(fields=["status", "next_reconcile_at"], name="action_status_reconcile_idx"),
            models.Index(fields=["owner", "status"], name="action_owner_status_idx"),
            models.Index(fields=["status", "created_at"], name="action_status_created_idx"),
            # The admin's kind filter and its search by the provider's reference.
            models.Index(fields=["kind", "created_at"], name="action_kind_created_idx"),
            # The ledger audit reads one window of a kind's successes at a time.
            models.Index(fields=["kind", "status", "status_changed_at"], name="action_kind_status_changed_idx"),
            models.Index(fields=["provider_reference"], name="action_provider_ref_idx"),
            # The review queue and the dispatcher only look at a handful of live statuses:
            # a partial index keeps those scans small however many resolved actions pile up.
            models.Index(
                fields=["status", "created_at"],
                name="action_live_idx",
                condition=Q(status__in=list(LIVE_INDEX_STATUSES)),
            ),
        ]

    def __str__(self) -> str:
        return self.action_id

    # --- material immutability -------------------------------------------------------------

    def save(self, *args: Any, **kwargs: Any) -> None:
        loaded = getattr(self, "_loaded_material", None)
        update_fields = kwargs.get("update_fields")
        if update_fields is not None and not set(update_fields) & _MATERIAL_NAMES:
            # Writes no material column: nothing to check, and nothing new to remember.
            super().save(*args, **kwargs)
            self._remember_saved(update_fields)
            return
        if loaded is not None:
            current = self._material_values()
            changed = sorted(name for name, value in loaded.items() if current.get(name) != value)
            if changed:
                raise MaterialFieldChanged(
                    f"{self.action_id}: material fields cannot change after the proposal: {', '.join(changed)}"
                )
        super().save(*args, **kwargs)
        self._loaded_material = self._material_values()
        self._saved = self._column_values()

    @classmethod
    def from_db(cls, db: str | None, field_names: Any, values: Any, **kwargs: Any) -> Action:
        instance = super().from_db(db, field_names, values, **kwargs)
        instance._loaded_material = instance._material_values()
        instance._saved = instance._column_values()
        return instance

    def refresh_from_db(self, *args: Any, **kwargs: Any) -> None:
        super().refresh_from_db(*args, **kwargs)
        self._loaded_material = self._material_values()
        self._saved = self._column_values()

    def changed_fields(self) -> list[str] | None:
        """The fields whose value differs from the row as loaded or last saved (material fields
        included, so that saving them still meets the check above); None when not known (a new
        action, or one loaded before this was tracked)."""
        saved: dict[str, Any] | None = getattr(self, "_saved", None)
        if saved is None or self._state.adding:
            return None
        changed = [name for name, value in self._column_values().items() if saved.get(name, _UNSET) != value]
        loaded = getattr(self, "_loaded_material", None) or {}
        changed += [name for name, value in loaded.items() if getattr(self, name) != value]
        return changed

    def _column_values(self) -> dict[str, Any]:
        # The non-material columns by field name (update_fields accepts it), copied where a value
        # could be changed in place; a deferred column is not loaded, and not read here.
        deferred = self.get_deferred_fields()
        return {
            name: _copied(getattr(self, attname))
            for name, attname in _tracked_columns().items()
            if attname not in deferred
        }

    def saved_elsewhere(self, update_fields: Any) -> None:
        """These columns were written by a statement of actions.foundation.sql (an UPDATE of many actions at
        once): remember them as saved, and the status as the one the next conditional save must
        find (django-fsm's ConcurrentTransitionMixin compares with it)."""
        self._remember_saved(update_fields)
        self._update_initial_state()

    def _remember_saved(self, update_fields: Any) -> None:
        saved: dict[str, Any] | None = getattr(self, "_saved", None)
        if saved is None:
            return
        deferred, tracked = self.get_deferred_fields(), _tracked_columns()
        for name in update_fields:
            attname = tracked.get(name)
            if attname is not None and attname not in deferred:
                saved[name] = _copied(getattr(self, attname))

    def _material_values(self) -> dict[str, Any]:
        # A deep copy: the payload is a dict, and comparing it with itself would miss a change
        # made in place (action.payload["amount"] = ...).
        deferred = self.get_deferred_fields()
        return {name: copy.deepcopy(getattr(self, name)) for name in self.MATERIAL_FIELDS if name not in deferred}

    # --- derived --------------------------------------------------------------------------

    @property
    def holds_reservation(self) -> bool:
        return self.status in RESERVING_STATUSES

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    # --- transitions (docs/architecture.md section 4): fields only, no I/O, no saves ---------------

    @transition(field=status, source=S.NEW, target=S.PROPOSED)
    def propose(self) -> None:
        """Validation passed; the proposal waits for a decision."""

    @transition(field=status, source=S.NEW, target=S.REJECTED)
    def reject_proposal(self, *, reasons: list[dict[str, str]]) -> None:
        """Validation failed; the proposal is recorded with its reasons."""
        self.rejection_reasons = reasons

    @transition(field=status, source=S.PROPOSED, target=S.AUTHORIZED, permission=perms.DECIDE)
    def approve(self) -> None:
        """A manager within limit, or the auto-approval policy, approved it."""

    @transition(field=status, source=S.PROPOSED, target=S.REJECTED, permission=perms.DECIDE)
    def reject(self, *, note: str) -> None:
        self.rejection_reasons = [{"code": "rejected_by_manager", "message": note}]

    @transition(field=status, source=S.AUTHORIZED, target=S.SUBMITTING)
    def begin_submission(self, *, lease_token: UUID, lease_expires_at: datetime, started_at: datetime) -> None:
        self._take_lease(lease_token=lease_token, lease_expires_at=lease_expires_at, started_at=started_at)

    @transition(field=status, source=S.AUTHORIZED, target=S.STALE)
    def invalidate(self) -> None:
        """The approval no longer matches the order, or it expired."""

    @transition(field=status, source=S.STALE, target=S.PROPOSED, permission=perms.DECIDE)
    def reopen(self) -> None:
        """Ask for a new decision on the same, unchanged action."""

    @transition(
        field=status,
        source=[S.PROPOSED, S.AUTHORIZED, S.STALE],
        target=S.CANCELLED,
        permission=perms.CANCEL,
    )
    def cancel(self) -> None:
        pass

    @transition(field=status, source=S.SUBMITTING, target=S.SUCCEEDED)
    def record_success(self, *, provider_reference: str) -> None:
        self.provider_reference = provider_reference
        self._drop_lease()

    @transition(field=status, source=S.SUBMITTING, target=S.SETTLING)
    def record_pending(self, *, provider_reference: str) -> None:
        self.provider_reference = provider_reference
        self._drop_lease()

    @transition(field=status, source=S.SUBMITTING, target=S.FAILED_FINAL)
    def record_failure(self, *, provider_reference: str = "") -> None:
        if provider_reference:
            self.provider_reference = provider_reference
        self._drop_lease()

    @transition(field=status, source=S.SUBMITTING, target=S.UNKNOWN)
    def mark_unknown(self, *, next_reconcile_at: datetime) -> None:
        """Timeout, 5xx, dropped connection, rate limit or an expired lease."""
        self.next_reconcile_at = next_reconcile_at
        self._drop_lease()

    @transition(
        field=status,
        source=S.UNKNOWN,
        target=RETURN_VALUE(S.SUCCEEDED, S.SETTLING, S.FAILED_FINAL),  # type: ignore[arg-type]
    )
    def reconcile_found(self, *, outcome: str, provider_reference: str) -> str:
        """The receiver has a record of the effect: take its status."""
        if outcome not in (S.SUCCEEDED, S.SETTLING, S.FAILED_FINAL):
            raise ValueError(f"not a reconciliation outcome: {outcome}")
        self.provider_reference = provider_reference
        self.next_reconcile_at = None
        return outcome

    @transition(field=status, source=S.SUBMITTING, target=S.AUTHORIZED)
    def record_not_sent(self) -> None:
        """The receiver's answer proves nothing was handed over (an SMTP 4xx before DATA): the
        approval still stands and the next claim sends it, under a new lease. Not a re-send: the
        receiver never had it."""
        self._drop_lease()

    @transition(field=status, source=S.UNKNOWN, target=S.SUBMITTING)
    def retry(self, *, lease_token: UUID, lease_expires_at: datetime, started_at: datetime) -> None:
        """Authoritative not-found (or a replay inside key retention): same key, new lease."""
        self.next_reconcile_at = None
        self._take_lease(lease_token=lease_token, lease_expires_at=lease_expires_at, started_at=started_at)

    @transition(field=status, source=[S.UNKNOWN, S.SUBMITTING], target=S.NEEDS_REVIEW)
    def escalate(self, *, owner: Any, due_at: datetime) -> None:
        self.owner = owner
        self.due_at = due_at
        self.next_reconcile_at = None
        self._drop_lease()

    @transition(
        field=status,
        source=S.SETTLING,
        target=RETURN_VALUE(S.SUCCEEDED, S.FAILED_FINAL),  # type: ignore[arg-type]
    )
    def settle(self, *, succeeded: bool) -> str:
        self.next_reconcile_at = None
        return S.SUCCEEDED if succeeded else S.FAILED_FINAL

    @transition(field=status, source=S.NEEDS_REVIEW, target=S.SUCCEEDED, permission=perms.RESOLVE)
    def resolve_succeeded(self, *, provider_reference: str) -> None:
        self.provider_reference = provider_reference

    @transition(field=status, source=S.NEEDS_REVIEW, target=S.FAILED_FINAL, permission=perms.RESOLVE)
    def resolve_failed(self) -> None:
        pass

    @transition(field=status, source=S.NEEDS_REVIEW, target=S.SUBMITTING, permission=perms.RESOLVE)
    def resolve_retry(self, *, lease_token: UUID, lease_expires_at: datetime, started_at: datetime) -> None:
        self._take_lease(lease_token=lease_token, lease_expires_at=lease_expires_at, started_at=started_at)

    @transition(field=status, source=S.NEEDS_REVIEW, target=S.SUBMITTING, permission=perms.RESOLVE)
    def resolve_resend(self, *, lease_token: UUID, lease_expires_at: datetime, started_at: datetime) -> None:
        """A person decided to send again to a receiver that can neither deduplicate nor be asked,
        knowing a duplicate may reach it (invariant 16)."""
        self._take_lease(lease_token=lease_token, lease_expires_at=lease_expires_at, started_at=started_at)

    # --- helpers used by the transitions above ---------------------------------------------

    def _take_lease(self, *, lease_token: UUID, lease_expires_at: datetime, started_at: datetime) -> None:
        self.lease_token = lease_token
        self.lease_expires_at = lease_expires_at
        self.attempt_count += 1
        self.last_attempt_at = started_at
        if self.first_attempt_at is None:
            self.first_attempt_at = started_at

    def _drop_lease(self) -> None:
        self.lease_token = None
        self.lease_expires_at = None


# The material fields by name and by column, as ``save(update_fields=...)`` may name them.
_MATERIAL_NAMES = frozenset(Action.MATERIAL_FIELDS) | {"order", "refund_request"}
_UNSET = object()


@functools.cache
def _tracked_columns() -> dict[str, str]:
    """The columns whose saved values an action remembers (changed_fields), name -> attname:
    worked out once, as every action loaded or saved on the dispatch path asks."""
    return {field.name: field.attname for field in Action._meta.concrete_fields if field.attname not in _MATERIAL_NAMES}


def _copied(value: Any) -> Any:
    # A value that could be changed in place (a JSON column's dict or list) is remembered as a copy.
    return copy.deepcopy(value) if isinstance(value, dict | list) else value


class CurrentTransactionId(models.Func):
    """The inserting transaction's id, as a column default: PostgreSQL's ``pg_current_xact_id()``
    (64 bits, never wraps); NULL on SQLite."""

    output_field = models.BigIntegerField()
    template = "NULL"

    def as_postgresql(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        return self.as_sql(compiler, connection, template="(pg_current_xact_id()::text::bigint)", **extra_context)


class AuditTrailIsAppendOnly(TrailIsAppendOnly):
    pass


class UnchainedEvent(Exception):
    """An audit event written without its place in the hash chain."""


class TrailEvent(AppendOnly):
    """One state change in an append-only trail: the transition, who made it (a user, an agent
    or the system, with the label the trail shows), why, and when. The action's and the
    workflow's trails are both made of these."""

    transition = models.CharField(max_length=64)
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16)
    actor_kind = models.CharField(max_length=8, choices=ActorKind.choices)
    actor_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    actor_agent = models.ForeignKey("actions.Agent", on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    actor_label = models.CharField(max_length=200)
    reason = models.TextField(blank=True)
    evidence = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(db_index=True)

    class Meta:
        abstract = True
        ordering = ["created_at", "id"]


class ChainedActionEvent(TrailEvent):
    """The columns of an action's audit event, shared by the live trail (ActionEvent) and its
    archive (ArchivedActionEvent): an archived event is the same row, moved (actions.engine.retention)."""

    actor_label = models.CharField(max_length=200, help_text="Who acted, as shown in the trail.")
    # The hash chain (actions.foundation.chain, docs/evidence.md): the event's place in its
    # action's trail (1, 2, ...), the SHA-256 of its canonical content, and the chain hash that
    # links it to the previous event of the same action. Written with the event, never after.
    sequence = models.PositiveIntegerField(null=True)
    content_hash = models.CharField(max_length=64, blank=True, default="")
    chain_hash = models.CharField(max_length=64, blank=True, default="")

    trail_name = "audit events"
    append_only_error = AuditTrailIsAppendOnly

    class Meta(TrailEvent.Meta):
        abstract = True

    def __str__(self) -> str:
        return f"{self.action_id}: {self.from_state or '-'} -> {self.to_state} ({self.transition})"  # type: ignore[attr-defined]


class ActionEvent(ChainedActionEvent):
    """One line of the append-only audit trail (invariant 9).

    Written by the service in the same transaction as the change it records. Python refuses
    updates and deletes, and on PostgreSQL a trigger refuses them too; the one delete it lets
    through is the archive's move of a closed action's events (actions.foundation.db_guards).
    """

    action = models.ForeignKey(Action, on_delete=models.PROTECT, related_name="events")
    # The inserting transaction's id (PostgreSQL's pg_current_xact_id()): a checkpoint covers the
    # events of the transactions that had all ended when it was made (actions.evidence.checkpoints).
    # NULL on SQLite, whose single writer commits in key order.
    txid = models.BigIntegerField(null=True, blank=True, db_default=CurrentTransactionId())

    objects = AppendOnlyQuerySet["ActionEvent"].as_manager()

    class Meta(ChainedActionEvent.Meta):
        constraints = [
            # Two writers that each read the same previous event would fork the chain: the
            # second one's INSERT fails instead.
            models.UniqueConstraint(fields=["action", "sequence"], name="event_action_sequence_unique"),
        ]
        indexes = [
            models.Index(fields=["action", "created_at"], name="event_action_created_idx"),
            models.Index(fields=["transition", "created_at"], name="event_transition_created_idx"),
        ]

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self._state.adding and not self.chain_hash:
            # Only the trail's writer (actions.foundation.trail) links an event into its chain.
            raise UnchainedEvent(f"{self.action_id}: an audit event is written through the trail, with its hashes")
        super().save(*args, **kwargs)


_ARCHIVE_INDEXES = (("archivedevent_action_idx", ["action", "created_at"]), ("archivedevent_txid_idx", ["txid"]))


class ArchivedActionEvent(ChainedActionEvent):
    """An audit event of a closed action, moved out of the live trail after the hot window
    (settings.ARCHIVE_AFTER_DAYS, actions.engine.retention): the same columns and the same key,
    so its hashes and its checkpoint's Merkle leaf are unchanged. Only the archive's SQL writes
    here (actions.foundation.sql); the trail's readers read both tables (``trail_events``)."""

    id = models.BigIntegerField(primary_key=True)
    action = models.ForeignKey(Action, on_delete=models.PROTECT, related_name="archived_events")
    # Copied from the live row, never the archiving transaction's own.
    txid = models.BigIntegerField(null=True, blank=True)

    objects = AppendOnlyQuerySet["ArchivedActionEvent"].as_manager()

    class Meta(ChainedActionEvent.Meta):
        # As the live trail's: one event per place in a chain, and each action's events by time;
        # and by txid, which a checkpoint's period is read by.
        constraints = [models.UniqueConstraint(fields=["action", "sequence"], name="archivedevent_sequence_unique")]
        indexes = [models.Index(fields=fields, name=name) for name, fields in _ARCHIVE_INDEXES]


# An action's audit event as its readers see it, from the live trail or from its archive.
AuditEvent = ActionEvent | ArchivedActionEvent
