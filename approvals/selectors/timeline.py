"""An approved action's outcome as a timeline of the steps a manager cares about."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from actions import plain
from actions.foundation.trail import trail_events
from actions.models import Action, ActionStatus
from actions.models.actions import AuditEvent
from approvals.selectors.inbox import proposal_row_get
from approvals.selectors.rows import ProposalRow

S = ActionStatus
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


def outcome_timeline(action: Action, events: list[AuditEvent], *, receiver: str) -> list[TimelineStep]:
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
    events = trail_events(action_id=action_pk)
    return row, outcome_timeline(row.action, events, receiver=row.receiver)

