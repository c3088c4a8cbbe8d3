"""The manager's inbox (proposals waiting, grouped by target, one page of groups) and one
proposal in full."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.paginator import Page, Paginator
from django.db.models import Case as SqlCase
from django.db.models import CharField, Count, Min, Q, Sum, Value, When
from django.db.models.functions import Cast, Concat
from django.utils import timezone

from actions.foundation.trail import trail_events
from actions.kinds import kind_for
from actions.models import Action, ActionStatus, Bill, Order, OrderEvent
from actions.models.actions import TERMINAL_STATUSES, AuditEvent
from approvals.models import Approval, ApprovalLimit, Decision
from approvals.selectors.rows import (
    INBOX_GROUPS_PER_PAGE,
    ProposalRow,
    actions_for_rows,
    approval_limit_list,
    kind_choices,
    limit_map,
    proposal_row,
    refund_history_map,
    user_limit_map,
)

S = ActionStatus


@dataclass(frozen=True)
class Inbox:
    waiting: list[ProposalRow]
    stale: list[ProposalRow]
    limits: list[ApprovalLimit]
    auto_approval: dict[str, Decimal]
    # The kind filter: every kind a manager may decide, as (name, label), and the chosen one.
    kinds: list[tuple[str, str]] = field(default_factory=list)
    kind: str = ""
    # The waiting proposals, grouped by target, one page of groups.
    groups: list[InboxGroup] = field(default_factory=list)
    page: Page[Any] | None = None
    sort: str = "age"
    waiting_count: int = 0


@dataclass(frozen=True)
class AuditLine:
    event: AuditEvent
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


# --- the inbox ------------------------------------------------------------------------------


@dataclass(frozen=True)
class InboxGroup:
    """The waiting proposals on one target (an order, a bill; a proposal without one is a group
    of its own), with the target's money and a warning when they ask for more than is left."""

    key: str
    rows: list[ProposalRow]
    pending_total: Decimal
    currency: str
    order: Order | None = None
    bill: Bill | None = None

    @property
    def refundable(self) -> Decimal | None:
        if self.order is not None:
            return self.order.refundable_amount
        if self.bill is not None:
            return self.bill.adjustable_amount
        return None

    @property
    def target_version(self) -> int | None:
        """The target's version as the group card shows it: "approve together" posts it back."""
        target = self.order or self.bill
        return target.version if target is not None else None

    @property
    def over_balance(self) -> bool:
        return self.refundable is not None and self.pending_total > self.refundable

    @property
    def waiting_rows(self) -> list[ProposalRow]:
        return [row for row in self.rows if row.is_waiting]

    @property
    def can_approve_together(self) -> bool:
        """Two or more waiting proposals this manager could each approve."""
        return (self.order is not None or self.bill is not None) and (
            len([row for row in self.waiting_rows if row.refusal is None]) >= 2
        )


SORTS = {
    "age": ("oldest", "gkey"),
    "-age": ("-oldest", "gkey"),
    "amount": ("-total", "oldest", "gkey"),
}


def _group_key() -> SqlCase:
    return SqlCase(
        When(order_id__isnull=False, then=Concat(Value("order-"), Cast("order_id", CharField()))),
        When(bill_id__isnull=False, then=Concat(Value("bill-"), Cast("bill_id", CharField()))),
        default=Concat(Value("action-"), Cast("id", CharField())),
        output_field=CharField(),
    )


def _key_filter(keys: list[str]) -> Q:
    by_prefix: dict[str, list[int]] = {"order": [], "bill": [], "action": []}
    for key in keys:
        prefix, _, number = key.partition("-")
        if prefix in by_prefix and number.isdigit():
            by_prefix[prefix].append(int(number))
    return (
        Q(order_id__in=by_prefix["order"])
        | Q(bill_id__in=by_prefix["bill"])
        | Q(pk__in=by_prefix["action"], order__isnull=True, bill__isnull=True)
    )


def inbox_group_key(action: Action) -> str:
    """The key of the inbox group ``action`` is shown in: its order, its bill, or itself."""
    return _action_key(action)


def _action_key(action: Action) -> str:
    if action.order_id is not None:
        return f"order-{action.order_id}"
    if action.bill_id is not None:
        return f"bill-{action.bill_id}"
    return f"action-{action.pk}"


def _groups(
    actions: list[Action], *, keys: list[str], totals: dict[str, Decimal], user: Any, limits: dict[str, Decimal]
) -> list[InboxGroup]:
    history = refund_history_map(actions)
    rows_by_key: dict[str, list[ProposalRow]] = {key: [] for key in keys}
    for action in actions:
        row = proposal_row(action, user=user, limits=limits, history=history)
        rows_by_key.setdefault(_action_key(action), []).append(row)
    groups = []
    for key in keys:
        rows = rows_by_key.get(key) or []
        if not rows:
            continue
        first = rows[0].action
        groups.append(
            InboxGroup(
                key=key,
                rows=rows,
                pending_total=totals.get(key, Decimal("0")),
                currency=first.currency,
                order=first.order,
                bill=first.bill,
            )
        )
    return groups


def proposal_inbox_get(*, user: Any, kind: str = "", sort: str = "age", page: int | str = 1) -> Inbox:
    """Proposals waiting for a decision grouped by their target, a page of groups at a time
    (oldest group first, newest first, or largest amount first), then the stale actions needing
    a new decision; only those of ``kind`` when one is given (an unknown kind lists nothing).

    Pending rejections still in their undo window stay in their group, with an Undo button.
    """
    limits = approval_limit_list(user=user)
    by_currency = limit_map(limits)
    sort = sort if sort in SORTS else "age"
    waiting_qs = Action.objects.filter(status=S.PROPOSED)
    if kind:
        waiting_qs = waiting_qs.filter(kind=kind)
    grouped = (
        waiting_qs.annotate(gkey=_group_key())
        .values("gkey")
        .annotate(n=Count("pk"), total=Sum("amount"), oldest=Min("created_at"))
        .order_by(*SORTS[sort])
    )
    paginator = Paginator(grouped, INBOX_GROUPS_PER_PAGE)
    page_obj = paginator.get_page(page)
    keys = [entry["gkey"] for entry in page_obj.object_list]
    totals = {entry["gkey"]: entry["total"] or Decimal("0") for entry in page_obj.object_list}
    waiting_actions = (
        list(actions_for_rows().filter(_key_filter(keys), status=S.PROPOSED).order_by("created_at", "pk"))
        if keys
        else []
    )
    if kind:
        waiting_actions = [a for a in waiting_actions if a.kind == kind]
    groups = _groups(waiting_actions, keys=keys, totals=totals, user=user, limits=by_currency)
    stale_qs = actions_for_rows().filter(status=S.STALE).order_by("created_at", "pk")
    if kind:
        stale_qs = stale_qs.filter(kind=kind)
    stale = [proposal_row(action, user=user, limits=by_currency) for action in stale_qs]
    auto = dict(settings.AUTO_APPROVAL_THRESHOLDS) if settings.AUTO_APPROVAL_ENABLED else {}
    return Inbox(
        waiting=[row for group in groups for row in group.rows],
        stale=stale,
        limits=limits,
        auto_approval=auto,
        kinds=kind_choices(),
        kind=kind,
        groups=groups,
        page=page_obj,
        sort=sort,
        waiting_count=waiting_qs.count(),
    )


def inbox_group_get(*, user: Any, key: str, decided_pks: list[int]) -> InboxGroup | None:
    """One group as it is now, with the proposals just decided in it (which have left the
    waiting list but are followed on the page until they are final)."""
    limits = user_limit_map(user=user)
    actions = list(
        actions_for_rows()
        .filter(_key_filter([key]))
        .filter(Q(status=S.PROPOSED) | Q(pk__in=decided_pks))
        .order_by("created_at", "pk")
    )
    totals = {key: sum((a.amount for a in actions if a.status == S.PROPOSED), Decimal("0"))}
    groups = _groups(actions, keys=[key], totals=totals, user=user, limits=limits)
    return groups[0] if groups else None


def proposal_row_get(*, action_pk: int, user: Any) -> ProposalRow:
    """One inbox row, as it is now: what an htmx response swaps in after a decision."""
    action = actions_for_rows().get(pk=action_pk)
    return proposal_row(action, user=user, limits=user_limit_map(user=user), history=refund_history_map([action]))


# --- one proposal in full --------------------------------------------------------------------


def proposal_detail_get(*, action_pk: int, user: Any, now: datetime | None = None) -> ProposalDetail:
    """Everything a manager weighs before deciding: the order's money, what else happened on
    the order, earlier decisions with their binding, and the audit trail."""
    now = now or timezone.now()
    limits = approval_limit_list(user=user)
    action = actions_for_rows().get(pk=action_pk)
    row = proposal_row(action, user=user, limits=limit_map(limits))
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
        for event in trail_events(action_id=action.pk)
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
