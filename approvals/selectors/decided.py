"""The dashboard's counts and the manager's own decisions ("Decided")."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, time
from typing import Any

from django.core.paginator import Page, Paginator
from django.db.models import Count, Prefetch
from django.utils import timezone

from actions.models import Action, ActionStatus
from approvals.models import Approval, Decision
from approvals.selectors.rows import (
    DECIDED_PER_PAGE,
    ProposalRow,
    actions_for_rows,
    kind_choices,
    proposal_row,
    user_limit_map,
)

S = ActionStatus
# --- the dashboard's counts ------------------------------------------------------------------


def local_midnight(now: datetime) -> datetime:
    """Midnight today in the active time zone (the person's own, see console.timezones)."""
    return timezone.make_aware(datetime.combine(timezone.localdate(now), time.min))


@dataclass(frozen=True)
class ManagerSummary:
    waiting: int
    stale: int
    approved_today: int


def approval_summary_get(*, user: Any, now: datetime | None = None) -> ManagerSummary:
    """The manager's home page: the inbox's size and what ``user`` approved since midnight (in
    the console's time zone)."""
    midnight = local_midnight(now or timezone.now())
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
        .prefetch_related(Prefetch("action", queryset=actions_for_rows()))
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
    limits = user_limit_map(user=user)
    items = list(page_obj.object_list)
    lines = [
        DecidedLine(
            approval=approval,
            row=proposal_row(approval.action, user=user, limits=limits),
        )
        for approval in items
    ]
    pending = [
        proposal_row(action, user=user, limits=limits)
        for action in actions_for_rows().filter(pending_rejection__requested_by=user).order_by("created_at")
    ]
    return Decided(
        lines=lines,
        page=page_obj,
        today=today,
        status=status,
        kind=kind,
        decision=decision,
        kinds=kind_choices(),
        statuses=[(name, label) for name, (label, _) in DECIDED_STATUS_FILTERS.items()],
        pending=pending,
    )
