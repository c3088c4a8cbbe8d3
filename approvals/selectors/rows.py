"""The manager's proposal rows and their building blocks: one row per proposal, with its
refusal reason, its history and its pending rejection, read in a fixed number of queries."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import Count, Prefetch, QuerySet
from django.utils import timezone

from actions import plain
from actions.kinds import all_kinds, kind_for
from actions.models import Action, ActionEvent, ActionStatus
from actions.models.actions import TERMINAL_STATUSES
from approvals.caps import AUTO_APPROVAL_HELD
from approvals.models import ApprovalLimit, PendingRejection
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


# --- building blocks ------------------------------------------------------------------------


def approval_limit_list(*, user: Any) -> list[ApprovalLimit]:
    return list(ApprovalLimit.objects.filter(user=user).order_by("currency"))


def limit_map(limits: list[ApprovalLimit]) -> dict[str, Decimal]:
    return {limit.currency: limit.max_amount for limit in limits}


def user_limit_map(*, user: Any) -> dict[str, Decimal]:
    """The most ``user`` may approve, per currency: what each row's refusal is checked against."""
    return limit_map(approval_limit_list(user=user))


def kind_choices() -> list[tuple[str, str]]:
    """Every kind of action, as (name, label): the choices of a page's kind filter."""
    return [(kind.name, kind.label) for kind in all_kinds()]


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


def actions_for_rows() -> QuerySet[Action]:
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


def proposal_row(
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
