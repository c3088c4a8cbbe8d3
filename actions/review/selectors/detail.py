"""One action in full (its timeline and the receiver's latest lookup) and one follow-up."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from actions.foundation.trail import trail_events
from actions.kinds import kind_for
from actions.kinds.base import EffectKind
from actions.models import (
    Action,
    ActionStatus,
    Attempt,
    AttemptKind,
    Discrepancy,
    DiscrepancyStatus,
    FollowUpStatus,
    Remedy,
)
from actions.review.rules import (
    follow_up_kind,
    lookup_fresh_until,
    owner_rule_refusal,
    retry_evidence_from_attempt,
    retry_lookup_max_age,
)
from actions.review.selectors.common import (
    ITEM_PERMISSION,
    QUEUE_ACTION_STATUSES,
    RESOLVE_PERMISSION,
    ItemKind,
    attempt_summary,
    effect_fields,
    review_people_get,
)
from actions.review.selectors.queue import action_due, follow_up_due
from approvals.models import Approval

S = ActionStatus

# --- one action in full ---------------------------------------------------------------------------


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str)


@dataclass(frozen=True)
class TimelineEntry:
    """One line of an action's story. ``kind`` is event, approval, attempt, remedy or discrepancy."""

    at: datetime
    kind: str
    item: Any
    order: int
    details: dict[str, str] = field(default_factory=dict)
    summary: str = ""
    approval: Any = None


@dataclass(frozen=True)
class LookupView:
    """The latest lookup at the provider, as the detail page shows it."""

    attempt: Attempt
    verdict: str
    refunds: list[dict[str, Any]]
    summary: str
    fresh: bool
    fresh_until: datetime | None

    @property
    def not_found(self) -> bool:
        return self.verdict == "not_found"

    @property
    def found_reference(self) -> str:
        """The provider's reference when exactly one refund was found: the likely evidence."""
        if len(self.refunds) == 1:
            found = effect_fields(self.refunds[0])["id"]
            return "" if found == "?" else found
        return ""

    def refund_lines(self) -> list[dict[str, str]]:
        return [
            {name: value for name, value in effect_fields(refund).items() if name != "noun"} for refund in self.refunds
        ]


class _Workable:
    """A page of something a person may work on, unless ``work_refusal`` says why not."""

    work_refusal: str | None

    @property
    def may_work(self) -> bool:
        return self.work_refusal is None


@dataclass(frozen=True)
class ActionDetail(_Workable):
    action: Action
    row_due: datetime | None
    overdue: bool
    timeline: list[TimelineEntry]
    latest_lookup: LookupView | None
    remedies: list[Remedy]
    discrepancies: list[Discrepancy]
    members: list[Any]
    refusal: str | None
    retry_allowed: bool
    retry_refusal: str
    limits: dict[str, str]
    # Why this person may not work on the action at all (``resolver_refusal``), or None.
    work_refusal: str | None = None

    @property
    def is_needs_review(self) -> bool:
        return self.action.status == S.NEEDS_REVIEW

    @property
    def is_unknown(self) -> bool:
        return self.action.status == S.UNKNOWN

    @property
    def was_sent(self) -> bool:
        return self.action.attempt_count > 0

    # What the kind offers finance, in its own words (a refund is retried with its key; an
    # email, whose relay can be neither asked nor trusted to deduplicate, is sent again only
    # as a recorded decision).
    @property
    def kind(self) -> EffectKind:
        return kind_for(self.action.kind)

    @property
    def resolutions(self) -> tuple[str, ...]:
        return self.kind.resolutions

    @property
    def resolution_labels(self) -> dict[str, str]:
        return self.kind.resolution_labels

    @property
    def default_reference(self) -> str:
        return self.kind.default_reference(self.action)

    @property
    def receiver(self) -> str:
        return self.kind.contract().receiver

    @property
    def receiver_can_be_asked(self) -> bool:
        return self.kind.contract().can_be_asked


def lookup_view(attempt: Attempt | None, *, now: datetime) -> LookupView | None:
    if attempt is None:
        return None
    fresh_until = lookup_fresh_until(attempt)
    response = attempt.response or {}
    return LookupView(
        attempt=attempt,
        verdict=attempt.outcome,
        # Lookups recorded before effect kinds listed "refunds"; newer ones list "effects".
        refunds=list(response.get("effects") or response.get("refunds") or []),
        summary=attempt_summary(attempt),
        fresh=fresh_until is not None and fresh_until >= now,
        fresh_until=fresh_until,
    )


def _minutes(delta: timedelta) -> int:
    return max(int(delta.total_seconds() // 60), 1)


def retry_evidence(latest_lookup: LookupView | None) -> tuple[bool, str]:
    """Whether the latest lookup allows offering a retry with the same key, and if not, why."""
    return retry_evidence_from_attempt(latest_lookup.attempt if latest_lookup else None, now=timezone.now())


def _attempt_entry(attempt: Attempt) -> TimelineEntry:
    details = {"request": _pretty(attempt.request)}
    if attempt.response is not None:
        details["response"] = _pretty(attempt.response)
    if attempt.error is not None:
        details["error"] = _pretty(attempt.error)
    return TimelineEntry(
        at=attempt.started_at, kind="attempt", item=attempt, order=2, details=details, summary=attempt_summary(attempt)
    )


def review_action_detail_get(*, action_pk: int, user: Any, now: datetime | None = None) -> ActionDetail:
    """Everything finance needs to decide: the whole story of the action, and the latest lookup.

    Raises Action.DoesNotExist.
    """
    now = now or timezone.now()
    action = Action.objects.select_related(
        "order", "refund_request", "bill", "adjustment_request", "owner", "proposed_by_agent", "proposed_by_user"
    ).get(pk=action_pk)
    events = trail_events(action_id=action.pk, select_related=("actor_user",))
    approvals = list(Approval.objects.filter(action_id=action.pk).order_by("decided_at", "pk"))
    attempts = list(Attempt.objects.filter(action_id=action.pk).order_by("started_at", "pk"))
    remedies = list(Remedy.objects.filter(action_id=action.pk).select_related("owner").order_by("created_at", "pk"))
    discrepancies = list(
        Discrepancy.objects.filter(action_id=action.pk).select_related("owner").order_by("detected_at", "pk")
    )

    # A decision is shown with the event that recorded it ("approve", "reject"), binding and all.
    approvals_by_pk = {approval.pk: approval for approval in approvals}
    timeline: list[TimelineEntry] = []
    for event in events:
        details = {"evidence": _pretty(event.evidence)} if event.evidence else {}
        approval = approvals_by_pk.pop(event.evidence.get("approval_id"), None) if event.evidence else None
        timeline.append(
            TimelineEntry(at=event.created_at, kind="event", item=event, order=1, details=details, approval=approval)
        )
    for approval in approvals_by_pk.values():
        timeline.append(
            TimelineEntry(at=approval.decided_at, kind="approval", item=approval, order=0, approval=approval)
        )
    for attempt in attempts:
        timeline.append(_attempt_entry(attempt))
    for remedy in remedies:
        timeline.append(TimelineEntry(at=remedy.created_at, kind="remedy", item=remedy, order=3))
    for discrepancy in discrepancies:
        timeline.append(TimelineEntry(at=discrepancy.detected_at, kind="discrepancy", item=discrepancy, order=3))
    timeline.sort(key=lambda entry: (entry.at, entry.order, entry.item.pk))

    finished_lookups = [a for a in attempts if a.kind == AttemptKind.LOOKUP and a.finished_at is not None]
    latest = max(finished_lookups, key=lambda a: (a.finished_at, a.pk)) if finished_lookups else None
    latest_lookup = lookup_view(latest, now=now)
    allowed, why = retry_evidence(latest_lookup)
    due = action_due(action, now=now) if action.status in QUEUE_ACTION_STATUSES else None
    who = review_people_get()
    return ActionDetail(
        action=action,
        row_due=due,
        overdue=due is not None and due < now,
        timeline=timeline,
        latest_lookup=latest_lookup,
        remedies=remedies,
        discrepancies=discrepancies,
        members=who.choices(kind=action.kind, permission=RESOLVE_PERMISSION),
        refusal=owner_rule_refusal(user=user, owner=action.owner),
        work_refusal=who.refusal(user, kind=action.kind, owner=action.owner, permission=RESOLVE_PERMISSION),
        retry_allowed=allowed,
        retry_refusal=why,
        limits={
            "lease": f"{settings.LEASE_SECONDS} s",
            "escalation": f"{settings.RECONCILE_MAX_FAILURES} inconclusive lookups within "
            f"{settings.RECONCILE_WINDOW_SECONDS // 3600} h",
            "review_due": f"{settings.REVIEW_DUE_HOURS} h after escalation",
            "retry_evidence": f"a not-found lookup from the last {_minutes(retry_lookup_max_age())} min",
            "visibility_delay": f"{settings.PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS} s",
        },
    )


# --- one follow-up ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class FollowUpDetail(_Workable):
    kind: str
    item: Any
    due: datetime
    overdue: bool
    members: list[Any]
    refusal: str | None
    next_states: list[tuple[str, str]]
    # Why this person may not work on the follow-up at all (``resolver_refusal``), or None.
    work_refusal: str | None = None

    @property
    def is_open(self) -> bool:
        return self.item.status in (FollowUpStatus.OPEN, FollowUpStatus.IN_PROGRESS)

    @property
    def currency(self) -> str:
        """The currency its money is in: its action's, or, for an effect that no action of the
        console's made, the one the receiver reported in the audit's evidence."""
        action = getattr(self.item, "action", None)
        if action is not None:
            return str(action.currency)
        details = getattr(self.item, "details", None)
        return str((details or {}).get("currency") or "").upper() if isinstance(details, dict) else ""


REMEDY_NEXT = {
    FollowUpStatus.OPEN: [(FollowUpStatus.IN_PROGRESS.value, "Start work")],
    FollowUpStatus.IN_PROGRESS: [(FollowUpStatus.DONE.value, "Mark done")],
}
DISCREPANCY_NEXT = {
    DiscrepancyStatus.OPEN: [(DiscrepancyStatus.IN_PROGRESS.value, "Start work")],
    DiscrepancyStatus.IN_PROGRESS: [
        (DiscrepancyStatus.EXPLAINED.value, "Explained"),
        (DiscrepancyStatus.CORRECTED.value, "Corrected"),
    ],
}


def follow_up_detail_get(*, kind: str, pk: int, user: Any, now: datetime | None = None) -> FollowUpDetail:
    """A remedy or a discrepancy with its workflow. Raises Remedy/Discrepancy.DoesNotExist."""
    now = now or timezone.now()
    item: Remedy | Discrepancy
    if kind == ItemKind.REMEDY:
        item = Remedy.objects.select_related("action", "action__order", "owner").get(pk=pk)
        opened, next_states = item.created_at, REMEDY_NEXT.get(item.status, [])  # type: ignore[call-overload]
    else:
        item = Discrepancy.objects.select_related("action", "action__order", "owner").get(pk=pk)
        opened, next_states = item.detected_at, DISCREPANCY_NEXT.get(item.status, [])  # type: ignore[call-overload]
    due = follow_up_due(opened)
    permission = ITEM_PERMISSION[kind]
    who = review_people_get()
    return FollowUpDetail(
        kind=kind,
        item=item,
        due=due,
        overdue=due < now and item.status in (FollowUpStatus.OPEN, FollowUpStatus.IN_PROGRESS),
        members=who.choices(kind=follow_up_kind(item), permission=permission),
        refusal=owner_rule_refusal(user=user, owner=item.owner),
        next_states=list(next_states),
        work_refusal=who.refusal(user, kind=follow_up_kind(item), owner=item.owner, permission=permission),
    )
