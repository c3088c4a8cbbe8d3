"""CSV exports for finance: actions and the audit trail, by date range.

Rows are streamed from a server-side cursor (``iterator``), so a year of actions does not sit in
memory. Every cell goes through ``csv_safe``: a spreadsheet runs a cell that starts with
``= + - @`` (or a tab or carriage return, which some read past) as a formula, and an agent's
free text (evidence, reasons, customer names) must not become one.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import Any

from django.utils import timezone

from actions.models import Action, ActionEvent, ArchivedActionEvent
from actions.models.actions import AuditEvent

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
MAX_RANGE_DAYS = 366


class ExportRangeInvalid(ValueError):
    """The date range cannot be exported; the message says why."""


@dataclass(frozen=True)
class ExportRange:
    start: date
    end: date  # inclusive

    @property
    def bounds(self) -> tuple[datetime, datetime]:
        zone = timezone.get_current_timezone()
        start = datetime.combine(self.start, time.min, tzinfo=zone)
        end = datetime.combine(self.end + timedelta(days=1), time.min, tzinfo=zone)
        return start, end

    @property
    def label(self) -> str:
        return f"{self.start.isoformat()}_{self.end.isoformat()}"


def export_range_parse(start: str, end: str) -> ExportRange:
    """Read a range from the form's two dates (YYYY-MM-DD), both inclusive."""
    try:
        first = date.fromisoformat((start or "").strip())
    except ValueError:
        raise ExportRangeInvalid(f"The start date {start[:40]!r} is not a date like 2026-01-31.") from None
    try:
        last = date.fromisoformat((end or "").strip())
    except ValueError:
        raise ExportRangeInvalid(f"The end date {end[:40]!r} is not a date like 2026-01-31.") from None
    if last < first:
        raise ExportRangeInvalid("The end date is before the start date.")
    if (last - first).days >= MAX_RANGE_DAYS:
        raise ExportRangeInvalid(f"Export at most {MAX_RANGE_DAYS} days at a time.")
    return ExportRange(first, last)


def csv_safe(value: Any) -> str:
    """A cell's text, with a leading apostrophe where a spreadsheet would see a formula."""
    if value is None:
        return ""
    text = value.isoformat() if isinstance(value, datetime) else str(value)
    if text.startswith(FORMULA_STARTS):
        return "'" + text
    return text


ACTION_COLUMNS = [
    "action_id",
    "kind",
    "status",
    "amount",
    "currency",
    "reason_code",
    "order",
    "proposed_by",
    "owner",
    "provider_reference",
    "created_at",
    "status_changed_at",
]


def actions_export_rows(span: ExportRange) -> Iterator[list[str]]:
    start, end = span.bounds
    yield ACTION_COLUMNS
    found = (
        Action.objects.filter(created_at__gte=start, created_at__lt=end)
        .select_related("order", "proposed_by_agent", "proposed_by_user", "owner")
        .order_by("created_at", "pk")
    )
    for action in found.iterator(chunk_size=2000):
        if action.proposed_by_agent is not None:
            proposer = f"agent:{action.proposed_by_agent.name}"
        else:
            proposer = action.proposed_by_user.get_username() if action.proposed_by_user else ""
        yield [
            csv_safe(value)
            for value in (
                action.action_id,
                action.kind,
                action.status,
                action.amount,
                action.currency,
                action.reason_code,
                action.order.number if action.order else "",
                proposer,
                action.owner.get_username() if action.owner else "",
                action.provider_reference,
                action.created_at,
                action.status_changed_at,
            )
        ]


TRAIL_COLUMNS = ["event", "at", "action_id", "transition", "from_status", "to_status", "actor", "reason", "evidence"]


def trail_export_rows(span: ExportRange) -> Iterator[list[str]]:
    start, end = span.bounds
    yield TRAIL_COLUMNS
    # The live trail and its archive, each read in order and merged as they stream.
    found: Iterator[AuditEvent] = heapq.merge(
        *(
            model.objects.filter(created_at__gte=start, created_at__lt=end)
            .select_related("action")
            .order_by("created_at", "pk")
            .iterator(chunk_size=2000)
            for model in (ActionEvent, ArchivedActionEvent)
        ),
        key=lambda event: (event.created_at, event.pk),
    )
    for event in found:
        yield [
            csv_safe(value)
            for value in (
                event.pk,
                event.created_at,
                event.action.action_id,
                event.transition,
                event.from_state,
                event.to_state,
                event.actor_label,
                event.reason,
                json.dumps(event.evidence, sort_keys=True, default=str) if event.evidence else "",
            )
        ]
