"""Reads for the manager's pages: the inbox, one proposal's detail, the dashboard's counts.

Every function here runs a fixed number of queries however many actions, events or approvals
there are: related rows are joined or prefetched, and the manager's limits are read once and
handed to ``approval_refusal_reason`` row by row. ``tests/approvals/test_query_counts.py``
holds them to that.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, time
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import Count, Prefetch, QuerySet
from django.utils import timezone

from actions.kinds import all_kinds, kind_for
from actions.models import Action, ActionEvent, ActionStatus, Bill, Order, OrderEvent
from actions.models.actions import TERMINAL_STATUSES
from approvals.caps import AUTO_APPROVAL_HELD
from approvals.models import Approval, ApprovalLimit, Decision
from approvals.services import approval_refusal_reason

S = ActionStatus


@dataclass(frozen=True)
class ProposalRow:
    """One action as the manager's inbox shows it.

    ``refusal`` is why this manager may not approve it, as (code, message), or None.
    ``failed_bindings`` is filled for STALE actions from the latest 'invalidate' event: which
    part of the approval no longer matched (order version, balance, expiry...).
    """

    action: Action
    refusal: tuple[str, str] | None = None
    failed_bindings: list[dict[str, str]] = field(default_factory=list)
    stale_since: datetime | None = None
    # Why the auto-approval policy left it to a manager (a cap was reached), if it said so.
    held_reason: str = ""
    # What the action is about and, for a message, exactly what will be sent (the kind says).
    kind_label: str = ""
    target: str = ""
    receiver: str = ""
    message: dict[str, str] | None = None

    @property
    def is_waiting(self) -> bool:
        return self.action.status == S.PROPOSED

    @property
    def is_stale(self) -> bool:
        return self.action.status == S.STALE


@dataclass(frozen=True)
class Inbox:
    waiting: list[ProposalRow]
    stale: list[ProposalRow]
    limits: list[ApprovalLimit]
    auto_approval: dict[str, Decimal]
    # The kind filter: every kind a manager may decide, as (name, label), and the chosen one.
    kinds: list[tuple[str, str]] = field(default_factory=list)
    kind: str = ""


@dataclass(frozen=True)
class AuditLine:
    event: ActionEvent
    evidence_json: str


@dataclass(frozen=True)
class ApprovalLine:
    """A decision and how its binding compares with the order and action today."""

    approval: Approval
    version_changed: bool
    expired: bool


@dataclass(frozen=True)
class ProposalDetail:
    row: ProposalRow
    # The action's target: an order (refunds) or a bill (invoice adjustments).
    order: Order | None
    previous_refunds: list[Action]
    live_actions: list[Action]
    closed_actions: list[Action]
    approvals: list[ApprovalLine]
    audit_trail: list[AuditLine]
    limits: list[ApprovalLimit]
    # What changed on the order without an action (refunds made outside the console), newest first.
    order_events: list[OrderEvent] = field(default_factory=list)
    bill: Bill | None = None

    @property
    def target_version(self) -> int | None:
        target = self.order or self.bill
        return target.version if target is not None else None


# --- building blocks ------------------------------------------------------------------------


def approval_limit_list(*, user: Any) -> list[ApprovalLimit]:
    return list(ApprovalLimit.objects.filter(user=user).order_by("currency"))


def _limit_map(limits: list[ApprovalLimit]) -> dict[str, Decimal]:
    return {limit.currency: limit.max_amount for limit in limits}


def _invalidations() -> Prefetch[Any]:
    # Only the 'invalidate' events are needed for the stale rows, newest first, so the row can
    # say which binding failed the last time without loading the whole trail.
    # The same prefetch brings the note the auto-approval policy leaves when a cap held a
    # proposal back for a manager (approvals/caps.py), so the card can say why.
    return Prefetch(
        "events",
        queryset=ActionEvent.objects.filter(transition__in=["invalidate", AUTO_APPROVAL_HELD]).order_by(
            "-created_at", "-id"
        ),
        to_attr="row_events",
    )


def _actions_for_rows() -> QuerySet[Action]:
    return Action.objects.select_related(
        "order",
        "refund_request",
        "bill",
        "adjustment_request",
        "proposed_by_agent",
        "proposed_by_agent__owner",
        "proposed_by_user",
    ).prefetch_related(_invalidations())


def _row(action: Action, *, user: Any, limits: dict[str, Decimal]) -> ProposalRow:
    refusal = None
    if action.status == S.PROPOSED:
        refusal = approval_refusal_reason(action=action, user=user, limit=limits.get(action.currency))
    row_events: list[ActionEvent] = getattr(action, "row_events", [])
    invalidations = [event for event in row_events if event.transition == "invalidate"]
    held = next((event.reason for event in row_events if event.transition == AUTO_APPROVAL_HELD), "")
    failed: list[dict[str, str]] = []
    stale_since = None
    if action.status == S.STALE and invalidations:
        latest = invalidations[0]
        failed = list(latest.evidence.get("failed_bindings") or [])
        stale_since = latest.created_at
    kind = kind_for(action.kind)
    return ProposalRow(
        action=action,
        refusal=refusal,
        failed_bindings=failed,
        stale_since=stale_since,
        held_reason=held,
        kind_label=kind.label,
        target=kind.target_label(action),
        receiver=kind.contract().receiver,
        message=kind.message_preview(action),
    )


# --- the inbox ------------------------------------------------------------------------------


def proposal_inbox_get(*, user: Any, kind: str = "") -> Inbox:
    """Proposals waiting for a decision (oldest first), then stale actions needing a new one;
    only those of ``kind`` when one is given (an unknown kind lists nothing)."""
    limits = approval_limit_list(user=user)
    by_currency = _limit_map(limits)
    actions = _actions_for_rows().filter(status__in=[S.PROPOSED, S.STALE]).order_by("created_at", "pk")
    if kind:
        actions = actions.filter(kind=kind)
    waiting: list[ProposalRow] = []
    stale: list[ProposalRow] = []
    for action in actions:
        row = _row(action, user=user, limits=by_currency)
        (waiting if row.is_waiting else stale).append(row)
    auto = dict(settings.AUTO_APPROVAL_THRESHOLDS) if settings.AUTO_APPROVAL_ENABLED else {}
    kinds = [(k.name, k.label) for k in all_kinds()]
    return Inbox(waiting=waiting, stale=stale, limits=limits, auto_approval=auto, kinds=kinds, kind=kind)


def proposal_row_get(*, action_pk: int, user: Any) -> ProposalRow:
    """One inbox row, as it is now: what an htmx response swaps in after a decision."""
    action = _actions_for_rows().get(pk=action_pk)
    return _row(action, user=user, limits=_limit_map(approval_limit_list(user=user)))


# --- one proposal in full --------------------------------------------------------------------


def proposal_detail_get(*, action_pk: int, user: Any, now: datetime | None = None) -> ProposalDetail:
    """Everything a manager weighs before deciding: the order's money, what else happened on
    the order, earlier decisions with their binding, and the audit trail."""
    now = now or timezone.now()
    limits = approval_limit_list(user=user)
    action = _actions_for_rows().get(pk=action_pk)
    row = _row(action, user=user, limits=_limit_map(limits))
    order, bill = action.order, action.bill
    # The siblings on the action's target (an order, a bill); a kind with no target (a supplier
    # email) has none to show.
    target = {"order_id": order.pk} if order is not None else {"bill_id": bill.pk} if bill is not None else None
    others = (
        list(
            Action.objects.filter(**target)
            .exclude(pk=action.pk)
            .select_related("refund_request")
            .order_by("created_at", "pk")
        )
        if target is not None
        else []
    )
    previous_refunds = [a for a in others if a.status == S.SUCCEEDED]
    live = [a for a in others if a.status not in TERMINAL_STATUSES]
    closed = [a for a in others if a.status in TERMINAL_STATUSES and a.status != S.SUCCEEDED]

    target_version = kind_for(action.kind).target_version(action)
    approvals = [
        ApprovalLine(
            approval=approval,
            version_changed=approval.order_version != target_version,
            expired=approval.decision == Decision.APPROVE
            and approval.expires_at is not None
            and approval.expires_at <= now,
        )
        for approval in Approval.objects.filter(action_id=action.pk).order_by("-decided_at", "-pk")
    ]
    trail = [
        AuditLine(event=event, evidence_json=json.dumps(event.evidence, indent=2, sort_keys=True, default=str))
        for event in ActionEvent.objects.filter(action_id=action.pk).order_by("created_at", "id")
    ]
    return ProposalDetail(
        row=row,
        order=order,
        previous_refunds=previous_refunds,
        live_actions=live,
        closed_actions=closed,
        approvals=approvals,
        audit_trail=trail,
        limits=limits,
        order_events=list(OrderEvent.objects.filter(order_id=order.pk).order_by("-created_at", "-pk")) if order else [],
        bill=bill,
    )


# --- the dashboard's counts ------------------------------------------------------------------


@dataclass(frozen=True)
class ManagerSummary:
    waiting: int
    stale: int
    approved_today: int


def approval_summary_get(*, user: Any, now: datetime | None = None) -> ManagerSummary:
    """The manager's home page: the inbox's size and what ``user`` approved since midnight (in
    the console's time zone)."""
    now = now or timezone.now()
    midnight = timezone.make_aware(datetime.combine(timezone.localdate(now), time.min))
    counts = {S.PROPOSED: 0, S.STALE: 0}
    rows = Action.objects.filter(status__in=counts).values_list("status").annotate(n=Count("pk")).order_by()
    counts.update(dict(rows))
    approved = Approval.objects.filter(approver=user, decision=Decision.APPROVE, decided_at__gte=midnight).count()
    return ManagerSummary(waiting=counts[S.PROPOSED], stale=counts[S.STALE], approved_today=approved)
