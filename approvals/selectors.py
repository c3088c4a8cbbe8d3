"""Reads for the manager's pages: the inbox, one proposal's detail, the dashboard's counts.

Every function here runs a fixed number of queries however many actions, events or approvals
there are: related rows are joined or prefetched, and the manager's limits are read once and
handed to ``approval_refusal_reason`` row by row. ``tests/approvals/test_query_counts.py``
holds them to that.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, time, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.paginator import Page, Paginator
from django.db.models import Case as SqlCase
from django.db.models import CharField, Count, Min, Prefetch, Q, QuerySet, Sum, Value, When
from django.db.models.functions import Cast, Concat
from django.utils import timezone

from actions import plain
from actions.kinds import all_kinds, kind_for
from actions.models import Action, ActionEvent, ActionStatus, Bill, Order, OrderEvent
from actions.models.actions import TERMINAL_STATUSES
from approvals.caps import AUTO_APPROVAL_HELD
from approvals.models import Approval, ApprovalLimit, Decision, PendingRejection
from approvals.services import approval_refusal_reason

S = ActionStatus

# Decided and on its way: a card or a detail page shown now follows these until they are final.
LIVE_STATUSES = frozenset({S.AUTHORIZED, S.SUBMITTING, S.UNKNOWN, S.SETTLING})
REFUND_HISTORY_DAYS = 90
INBOX_GROUPS_PER_PAGE = 10
DECIDED_PER_PAGE = 25


def outcome_words(action: Action, *, receiver: str = "payment provider") -> str:
    """Where the action stands, in one sentence for a clerk."""
    noun = "refund" if action.order_id else "adjustment" if action.bill_id else "action"
    sentences = {
        S.PROPOSED: "Waiting for a decision.",
        S.AUTHORIZED: f"Approved; about to be sent to the {receiver}.",
        S.SUBMITTING: f"Being sent to the {receiver}.",
        S.UNKNOWN: f"No clear answer from the {receiver} yet. The console is checking; nothing to do for now.",
        S.SETTLING: f"Accepted by the {receiver}; the final result comes later.",
        S.NEEDS_REVIEW: f"Finance is checking with the {receiver} what happened.",
        S.SUCCEEDED: f"Succeeded{': ' + action.provider_reference if action.provider_reference else ''}.",
        S.FAILED_FINAL: f"Failed: the {receiver} did not make the {noun}. Finance arranges another way.",
        S.REJECTED: "Rejected. Nothing was sent.",
        S.CANCELLED: "Cancelled. Nothing was sent.",
        S.STALE: "The approval no longer applies; a manager needs to decide again. Nothing was sent.",
    }
    return sentences.get(S(action.status), action.get_status_display())


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def refund_history_map(actions: list[Action], *, now: datetime | None = None) -> dict[int, str]:
    """For each refund proposal, where it stands in its customer's refunds of the last 90 days
    ("3rd refund in 90 days: 2 already refunded"). One query whatever the number of rows."""
    now = now or timezone.now()
    emails = {a.order.customer_email for a in actions if a.order is not None and a.order.customer_email}
    if not emails:
        return {}
    window_start = now - timedelta(days=REFUND_HISTORY_DAYS)
    counts = dict(
        Action.objects.filter(
            order__customer_email__in=emails,
            status=S.SUCCEEDED,
            status_changed_at__gte=window_start,
        )
        .exclude(order__isnull=True)
        .values_list("order__customer_email")
        .annotate(n=Count("pk"))
        .order_by()
    )
    found: dict[int, str] = {}
    for action in actions:
        if action.order is None or not action.order.customer_email:
            continue
        before = counts.get(action.order.customer_email, 0)
        if action.status == S.SUCCEEDED and action.status_changed_at and action.status_changed_at >= window_start:
            before -= 1  # its own refund is not one "before" it
        if before == 0:
            found[action.pk] = f"First refund for this customer in {REFUND_HISTORY_DAYS} days."
        else:
            found[action.pk] = (
                f"{_ordinal(before + 1)} refund in {REFUND_HISTORY_DAYS} days: "
                f"{before} already refunded to this customer."
            )
    return found


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
    # A rejection asked for and still inside its undo window.
    pending_rejection: PendingRejection | None = None
    # "3rd refund in 90 days" for the order's customer ("" where it does not apply).
    refund_history: str = ""
    # Every grouped-approval sibling's card says it was decided with the others.
    group_size: int = 0
    # The version of the action's target now (None: the kind binds to no target, or the action
    # is final). Every form on the card posts back the version its page showed, with the amount
    # and payload hash the card shows.
    target_version: int | None = None
    # The target's version the page around this card showed, when the card is drawn again on
    # its own (the answer to one of its forms, its poll): its forms keep posting that, not the
    # version now, since the rest of the page (the order's money) was not drawn again.
    page_version: str = ""

    @property
    def shown_version(self) -> str:
        """The version the card's forms post back: "none" for a kind that binds to no target."""
        if self.page_version:
            return self.page_version
        return "none" if self.target_version is None else str(self.target_version)

    @property
    def is_waiting(self) -> bool:
        return self.action.status == S.PROPOSED and self.pending_rejection is None

    @property
    def is_in_flight(self) -> bool:
        """Decided and not final yet: the card follows it (htmx polling) until it is."""
        return self.action.status in LIVE_STATUSES or self.pending_rejection is not None

    @property
    def poll_seconds(self) -> int:
        if self.pending_rejection is not None or self.action.status in LIVE_STATUSES:
            return settings.LIVE_POLL_SECONDS
        if self.action.status == S.NEEDS_REVIEW:
            return 30  # a person in finance works on it: minutes, not seconds
        return 0

    @property
    def rejection_seconds_left(self) -> int:
        if self.pending_rejection is None:
            return 0
        left = (self.pending_rejection.commit_at - timezone.now()).total_seconds()
        return max(0, int(left + 0.999))

    @property
    def approve_blocked_entirely(self) -> bool:
        """Who may not approve because of who they are may not reject either (four eyes, role)."""
        return self.refusal is not None and self.refusal[0] in ("four_eyes", "not_a_manager")

    @property
    def outcome(self) -> str:
        return outcome_words(self.action, receiver=self.receiver)

    @property
    def stale_words(self) -> list[str]:
        return [plain.binding_words(failure.get("binding", "")) for failure in self.failed_bindings]

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
    # The waiting proposals, grouped by target, one page of groups.
    groups: list[InboxGroup] = field(default_factory=list)
    page: Page[Any] | None = None
    sort: str = "age"
    waiting_count: int = 0


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
        "pending_rejection",
    ).prefetch_related(_invalidations())


def _pending_rejection(action: Action) -> PendingRejection | None:
    # Selected with the row (select_related): no query, None when there is none.
    try:
        return action.pending_rejection
    except PendingRejection.DoesNotExist:
        return None


def _row(
    action: Action, *, user: Any, limits: dict[str, Decimal], history: dict[int, str] | None = None
) -> ProposalRow:
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
        pending_rejection=_pending_rejection(action),
        refund_history=(history or {}).get(action.pk, ""),
        target_version=kind.target_version(action) if action.status not in TERMINAL_STATUSES else None,
    )


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
        rows_by_key.setdefault(_action_key(action), []).append(_row(action, user=user, limits=limits, history=history))
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
    by_currency = _limit_map(limits)
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
        list(_actions_for_rows().filter(_key_filter(keys), status=S.PROPOSED).order_by("created_at", "pk"))
        if keys
        else []
    )
    if kind:
        waiting_actions = [a for a in waiting_actions if a.kind == kind]
    groups = _groups(waiting_actions, keys=keys, totals=totals, user=user, limits=by_currency)
    stale_qs = _actions_for_rows().filter(status=S.STALE).order_by("created_at", "pk")
    if kind:
        stale_qs = stale_qs.filter(kind=kind)
    stale = [_row(action, user=user, limits=by_currency) for action in stale_qs]
    auto = dict(settings.AUTO_APPROVAL_THRESHOLDS) if settings.AUTO_APPROVAL_ENABLED else {}
    kinds = [(k.name, k.label) for k in all_kinds()]
    return Inbox(
        waiting=[row for group in groups for row in group.rows],
        stale=stale,
        limits=limits,
        auto_approval=auto,
        kinds=kinds,
        kind=kind,
        groups=groups,
        page=page_obj,
        sort=sort,
        waiting_count=waiting_qs.count(),
    )


def inbox_group_get(*, user: Any, key: str, decided_pks: list[int]) -> InboxGroup | None:
    """One group as it is now, with the proposals just decided in it (which have left the
    waiting list but are followed on the page until they are final)."""
    limits = _limit_map(approval_limit_list(user=user))
    actions = list(
        _actions_for_rows()
        .filter(_key_filter([key]))
        .filter(Q(status=S.PROPOSED) | Q(pk__in=decided_pks))
        .order_by("created_at", "pk")
    )
    totals = {key: sum((a.amount for a in actions if a.status == S.PROPOSED), Decimal("0"))}
    groups = _groups(actions, keys=[key], totals=totals, user=user, limits=limits)
    return groups[0] if groups else None


def proposal_row_get(*, action_pk: int, user: Any) -> ProposalRow:
    """One inbox row, as it is now: what an htmx response swaps in after a decision."""
    action = _actions_for_rows().get(pk=action_pk)
    return _row(
        action, user=user, limits=_limit_map(approval_limit_list(user=user)), history=refund_history_map([action])
    )


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


# --- the manager's decisions ("Decided") ----------------------------------------------------------

DECIDED_STATUS_FILTERS: dict[str, tuple[str, frozenset[str]]] = {
    "in_progress": (
        "On its way",
        frozenset({S.AUTHORIZED, S.SUBMITTING, S.UNKNOWN, S.SETTLING, S.NEEDS_REVIEW}),
    ),
    "succeeded": ("Succeeded", frozenset({S.SUCCEEDED})),
    "failed": ("Failed", frozenset({S.FAILED_FINAL})),
    "stale": ("Needs a new decision", frozenset({S.STALE, S.PROPOSED})),
    "rejected": ("Rejected", frozenset({S.REJECTED, S.CANCELLED})),
}


@dataclass(frozen=True)
class DecidedLine:
    approval: Approval
    row: ProposalRow


@dataclass(frozen=True)
class Decided:
    lines: list[DecidedLine]
    page: Page[Any]
    today: bool
    status: str
    kind: str
    decision: str
    kinds: list[tuple[str, str]]
    statuses: list[tuple[str, str]]
    pending: list[ProposalRow]


def local_midnight(now: datetime) -> datetime:
    """Midnight today in the active time zone (the person's own, see console.timezones)."""
    return timezone.make_aware(datetime.combine(timezone.localdate(now), time.min))


def decided_list_get(
    *,
    user: Any,
    today: bool = False,
    status: str = "",
    kind: str = "",
    decision: str = "",
    page: int | str = 1,
    now: datetime | None = None,
) -> Decided:
    """The decisions ``user`` made herself, newest first, with where each action stands now.

    Only her own decisions: a manager does not see another manager's history here. Filters:
    since midnight (her time zone), where the action stands, its kind, approve or reject.
    """
    now = now or timezone.now()
    status = status if status in DECIDED_STATUS_FILTERS else ""
    decision = decision if decision in Decision.values else ""
    approvals = (
        Approval.objects.filter(approver=user)
        .select_related("group")
        .prefetch_related(Prefetch("action", queryset=_actions_for_rows()))
        .order_by("-decided_at", "-pk")
    )
    if today:
        approvals = approvals.filter(decided_at__gte=local_midnight(now))
    if status:
        approvals = approvals.filter(action__status__in=DECIDED_STATUS_FILTERS[status][1])
    if kind:
        approvals = approvals.filter(action__kind=kind)
    if decision:
        approvals = approvals.filter(decision=decision)
    page_obj = Paginator(approvals, DECIDED_PER_PAGE).get_page(page)
    limits = _limit_map(approval_limit_list(user=user))
    items = list(page_obj.object_list)
    lines = [
        DecidedLine(
            approval=approval,
            row=_row(approval.action, user=user, limits=limits),
        )
        for approval in items
    ]
    pending = [
        _row(action, user=user, limits=limits)
        for action in _actions_for_rows().filter(pending_rejection__requested_by=user).order_by("created_at")
    ]
    return Decided(
        lines=lines,
        page=page_obj,
        today=today,
        status=status,
        kind=kind,
        decision=decision,
        kinds=[(k.name, k.label) for k in all_kinds()],
        statuses=[(name, label) for name, (label, _) in DECIDED_STATUS_FILTERS.items()],
        pending=pending,
    )


# --- the outcome timeline ---------------------------------------------------------------------------

# The steps a clerk follows, Stripe-style; other transitions stay in the audit trail.
TIMELINE_TRANSITIONS = frozenset(
    {
        "propose",
        "approve",
        "reject",
        "invalidate",
        "reopen",
        "cancel",
        "begin_submission",
        "retry",
        "record_pending",
        "mark_unknown",
        "escalate",
        "record_success",
        "reconcile_found",
        "settle",
        "record_failure",
        "record_not_sent",
        "resolve_succeeded",
        "resolve_failed",
        "resolve_retry",
    }
)
_PROBLEM_TRANSITIONS = frozenset({"mark_unknown", "record_failure", "record_not_sent", "escalate"})


@dataclass(frozen=True)
class TimelineStep:
    title: str
    at: datetime | None
    tone: str  # done, current, failed, waiting
    who: str = ""
    detail: str = ""
    technical: str = ""


def outcome_timeline(action: Action, events: list[ActionEvent], *, receiver: str) -> list[TimelineStep]:
    """Proposed -> approved -> sent -> succeeded re_..., from the audit trail, in words for a
    clerk; the raw reason goes to the step's technical details. An action still on its way ends
    with the step it waits for."""
    steps: list[TimelineStep] = []
    effect = "refund" if action.order_id else "adjustment" if action.bill_id else "message"
    for event in events:
        if event.transition not in TIMELINE_TRANSITIONS:
            continue
        title = plain.transition_words(event.transition, receiver=receiver)
        tone = "done"
        detail = ""
        if event.to_state == S.SUCCEEDED and action.provider_reference:
            title = f"Succeeded · {action.provider_reference}"
        if event.transition in _PROBLEM_TRANSITIONS:
            tone = "failed" if event.to_state in (S.FAILED_FINAL, S.NEEDS_REVIEW) else "current"
            detail = plain.error_words(event.reason, receiver=receiver, effect=effect)
        elif event.transition == "invalidate":
            tone = "failed"
            failures = event.evidence.get("failed_bindings") or []
            detail = " ".join(plain.binding_words(f.get("binding", "")) for f in failures)
        elif event.transition in ("reject", "cancel"):
            tone = "failed"
            detail = event.reason
        steps.append(
            TimelineStep(
                title=title,
                at=event.created_at,
                tone=tone,
                who=plain.actor_words(event.actor_label),
                detail=detail,
                technical=f"{event.transition}: {event.from_state or '(new)'} -> {event.to_state}. {event.reason}",
            )
        )
    waiting_for = {
        S.PROPOSED: "Waiting for a manager's decision",
        S.AUTHORIZED: f"Waiting to be sent to the {receiver}",
        S.SUBMITTING: f"Waiting for the {receiver}'s answer",
        S.UNKNOWN: f"Checking with the {receiver} whether the {effect} was made",
        S.SETTLING: f"Waiting for the {receiver}'s final result",
        S.NEEDS_REVIEW: "Waiting for finance to check",
    }.get(S(action.status))
    if waiting_for:
        steps.append(TimelineStep(title=waiting_for, at=None, tone="waiting"))
    return steps


def action_outcome_get(*, action_pk: int, user: Any) -> tuple[ProposalRow, list[TimelineStep]]:
    """A proposal's card and its outcome timeline, as they are now (the detail page's live part)."""
    row = proposal_row_get(action_pk=action_pk, user=user)
    events = list(ActionEvent.objects.filter(action_id=action_pk).order_by("created_at", "id"))
    return row, outcome_timeline(row.action, events, receiver=row.receiver)
