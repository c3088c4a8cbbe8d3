"""The numbers on finance's home page."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Case, Count, IntegerField, Min, Q, Value, When
from django.db.models.functions import Coalesce
from django.utils import timezone

from actions.models import (
    Action,
    ActionStatus,
    Bill,
    Discrepancy,
    LedgerAuditRun,
    Remedy,
)
from actions.review.selectors.common import (
    OPEN_DISCREPANCY,
    OPEN_FOLLOW_UP,
    QUEUE_ACTION_STATUSES,
    STATE_CHOICES,
    ItemKind,
)

S = ActionStatus

# --- the home page ------------------------------------------------------------------------------

AGE_BUCKETS = (
    ("< 1 h", timedelta(hours=1)),
    ("1-4 h", timedelta(hours=4)),
    ("4-24 h", timedelta(hours=24)),
    ("> 24 h", None),
)


@dataclass(frozen=True)
class StateLine:
    state: str
    label: str
    count: int
    oldest: datetime | None
    overdue: int = 0


@dataclass(frozen=True)
class ChartBar:
    label: str
    count: int
    x: int
    y: int
    width: int
    height: int
    label_y: int
    tone: str

    @property
    def center(self) -> int:
        return self.x + self.width // 2


@dataclass(frozen=True)
class FinanceSummary:
    states: list[StateLine]
    follow_ups: list[StateLine]
    mine: int
    stuck_total: int
    buckets: list[ChartBar]
    chart_width: int
    chart_height: int
    baseline: int


CHART_WIDTH, CHART_HEIGHT, CHART_TOP, CHART_BOTTOM = 360, 170, 24, 140


def _chart(counts: Iterable[tuple[str, int]]) -> list[ChartBar]:
    counts = list(counts)
    peak = max([count for _, count in counts] + [1])
    slot = CHART_WIDTH // len(counts)
    width = slot - 24
    tones = ("accent", "accent", "warn", "bad")
    bars = []
    for index, (label, count) in enumerate(counts):
        height = round((CHART_BOTTOM - CHART_TOP) * count / peak)
        y = CHART_BOTTOM - height
        bars.append(
            ChartBar(
                label=label,
                count=count,
                x=index * slot + 12,
                y=y,
                width=width,
                height=height,
                label_y=y - 6,
                tone=tones[index],
            )
        )
    return bars


def review_summary_get(*, user: Any, now: datetime | None = None) -> FinanceSummary:
    """Finance's home page: open items by state and age, and stuck actions by age bucket."""
    now = now or timezone.now()
    since = Coalesce("status_changed_at", "created_at")
    whens = [
        When(**{"since__gte": now - limit}, then=Value(index))
        for index, (_, limit) in enumerate(AGE_BUCKETS)
        if limit is not None
    ]
    grouped = (
        Action.objects.filter(status__in=list(QUEUE_ACTION_STATUSES))
        .exclude(status=S.SUBMITTING, lease_expires_at__gte=now)
        .annotate(since=since)
        .annotate(bucket=Case(*whens, default=Value(len(AGE_BUCKETS) - 1), output_field=IntegerField()))
        .values("status", "bucket")
        .annotate(
            n=Count("pk"),
            oldest=Min("since"),
            overdue=Count("pk", filter=Q(status=S.NEEDS_REVIEW, due_at__lt=now)),
            mine=Count("pk", filter=Q(owner=user)),
        )
        .order_by()
    )
    by_state: dict[str, dict[str, Any]] = {}
    bucket_counts = [0] * len(AGE_BUCKETS)
    mine = 0
    for row in grouped:
        state = by_state.setdefault(row["status"], {"count": 0, "oldest": None, "overdue": 0})
        state["count"] += row["n"]
        state["overdue"] += row["overdue"]
        if state["oldest"] is None or row["oldest"] < state["oldest"]:
            state["oldest"] = row["oldest"]
        bucket_counts[row["bucket"]] += row["n"]
        mine += row["mine"]
    labels = dict(STATE_CHOICES)
    states = [
        StateLine(
            state=status.value,
            label=labels[status.value],
            count=by_state.get(status.value, {}).get("count", 0),
            oldest=by_state.get(status.value, {}).get("oldest"),
            overdue=by_state.get(status.value, {}).get("overdue", 0),
        )
        for status in QUEUE_ACTION_STATUSES
    ]
    remedies = Remedy.objects.filter(status__in=list(OPEN_FOLLOW_UP)).aggregate(
        n=Count("pk"), oldest=Min("created_at"), mine=Count("pk", filter=Q(owner=user))
    )
    discrepancies = Discrepancy.objects.filter(status__in=list(OPEN_DISCREPANCY)).aggregate(
        n=Count("pk"), oldest=Min("detected_at"), mine=Count("pk", filter=Q(owner=user))
    )
    follow_ups = [
        StateLine(
            state=ItemKind.DISCREPANCY,
            label="Open discrepancies",
            count=discrepancies["n"],
            oldest=discrepancies["oldest"],
        ),
        StateLine(state=ItemKind.REMEDY, label="Open remedies", count=remedies["n"], oldest=remedies["oldest"]),
    ]
    return FinanceSummary(
        states=states,
        follow_ups=follow_ups,
        mine=mine + remedies["mine"] + discrepancies["mine"],
        stuck_total=sum(bucket_counts),
        buckets=_chart(zip([label for label, _ in AGE_BUCKETS], bucket_counts, strict=True)),
        chart_width=CHART_WIDTH,
        chart_height=CHART_HEIGHT,
        baseline=CHART_BOTTOM,
    )


@dataclass(frozen=True)
class LedgerAuditState:
    """Where the ledger audit stands: its latest run, and the discrepancies nobody has closed.

    The audit reads each receiver a window at a time, from where its last run stopped, so a run
    finds only what is new since then: "the ledgers agree" is said of the open discrepancies,
    found by whichever run, not of the latest run's findings."""

    run: LedgerAuditRun | None
    open_discrepancies: int

    @property
    def finished(self) -> bool:
        return self.run is not None and self.run.finished_at is not None and not self.run.error

    @property
    def agree(self) -> bool:
        return self.finished and self.open_discrepancies == 0


def ledger_audit_state() -> LedgerAuditState:
    """The ledger audit's latest run and the open discrepancies: everyone's home page, the
    metrics and ``manage.py audit_ledger`` read them here."""
    return LedgerAuditState(
        run=LedgerAuditRun.objects.order_by("-started_at", "-pk").first(),
        open_discrepancies=Discrepancy.objects.filter(status__in=OPEN_DISCREPANCY).count(),
    )


# --- accounts payable's home page ------------------------------------------------------------

PAYABLE_KINDS = ("invoice-adjustment", "credit-note-void")


@dataclass(frozen=True)
class PayableSummary:
    needs_review: int
    unclear: int
    mine: int
    waiting_for_manager: int
    bills_open: int
    bills_mismatched: int


def payable_summary_get(*, user: Any) -> PayableSummary:
    """Accounts payable's home page: invoice adjustments and credit-note voids by where they
    stand, and the supplier bills they draw on."""
    from_kinds = Action.objects.filter(kind__in=PAYABLE_KINDS)
    counts = from_kinds.aggregate(
        needs_review=Count("pk", filter=Q(status=S.NEEDS_REVIEW)),
        unclear=Count("pk", filter=Q(status__in=[S.UNKNOWN, S.SUBMITTING])),
        mine=Count("pk", filter=Q(owner=user, status__in=list(QUEUE_ACTION_STATUSES))),
        waiting=Count("pk", filter=Q(status=S.PROPOSED)),
    )
    bills = Bill.objects.filter(voided=False).aggregate(
        open=Count("pk", filter=Q(amount_due__gt=0)),
        mismatched=Count("pk", filter=~Q(po_mismatch={})),
    )
    return PayableSummary(
        needs_review=counts["needs_review"],
        unclear=counts["unclear"],
        mine=counts["mine"],
        waiting_for_manager=counts["waiting"],
        bills_open=bills["open"],
        bills_mismatched=bills["mismatched"],
    )
