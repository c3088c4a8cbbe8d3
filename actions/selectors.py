"""Reads of the intent log for the agent API: one action, a page of actions, and what a
status means in plain language.

An agent sees only the actions it proposed (``Action.proposed_by_agent``). The selectors
filter by agent in the query itself, so "not yours" and "does not exist" are the same empty
result and no caller can tell them apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core import signing
from django.db.models import Q, QuerySet
from django.utils.dateparse import parse_datetime

from actions.models import Action, ActionStatus, Agent, RefundRequest
from actions.models.actions import TERMINAL_STATUSES

S = ActionStatus

_CURSOR_SALT = "actions.selectors.action_list_for_agent"
MAX_PAGE_SIZE = 200


class InvalidCursor(ValueError):
    """The cursor was not issued by this console (or was edited)."""


@dataclass(frozen=True)
class ActionPage:
    items: list[Action]
    next_cursor: str | None


def storable_text(value: str) -> bool:
    """Whether ``value`` can be compared with a text column at all.

    PostgreSQL's text cannot hold NUL (the driver refuses the query outright) and UTF-8 has no
    lone surrogates. A value with either cannot equal anything stored, so a read answers as
    for any unknown value instead of failing on the query.
    """
    return "\x00" not in value and not any("\ud800" <= char <= "\udfff" for char in value)


def _for_agent(agent: Agent) -> QuerySet[Action]:
    return Action.objects.filter(proposed_by_agent=agent).select_related("order", "refund_request", "owner")


def action_get_for_agent(*, agent: Agent, action_id: str) -> Action | None:
    """The agent's own action with this id, or None (whether it is someone else's or absent)."""
    if not storable_text(action_id):
        return None
    return _for_agent(agent).filter(action_id=action_id).first()


def _encode_cursor(action: Action) -> str:
    # Signed, so that the cursor is opaque to clients and an edited one is refused rather than
    # silently paging from somewhere else.
    return signing.dumps({"t": action.created_at.isoformat(), "i": action.pk}, salt=_CURSOR_SALT, compress=True)


def _decode_cursor(cursor: str) -> tuple[datetime, int]:
    if not storable_text(cursor):
        raise InvalidCursor("The cursor is not one this API issued. Start again without a cursor.")
    try:
        data = signing.loads(cursor, salt=_CURSOR_SALT)
        created_at = parse_datetime(data["t"])
        pk = int(data["i"])
    except (signing.BadSignature, KeyError, TypeError, ValueError) as exc:
        raise InvalidCursor("The cursor is not one this API issued. Start again without a cursor.") from exc
    if created_at is None:
        raise InvalidCursor("The cursor is not one this API issued. Start again without a cursor.")
    return created_at, pk


def action_list_for_agent(
    *, agent: Agent, statuses: Sequence[str] = (), cursor: str | None = None, limit: int = 50
) -> ActionPage:
    """The agent's actions, newest first, ``limit`` at a time.

    The cursor is a position (created_at, pk) rather than an offset: actions proposed while an
    agent pages through do not shift the pages, and each page is an index range scan.
    """
    limit = max(1, min(limit, MAX_PAGE_SIZE))
    queryset = _for_agent(agent).order_by("-created_at", "-pk")
    if statuses:
        queryset = queryset.filter(status__in=list(statuses))
    if cursor:
        created_at, pk = _decode_cursor(cursor)
        queryset = queryset.filter(Q(created_at__lt=created_at) | Q(created_at=created_at, pk__lt=pk))
    rows = list(queryset[: limit + 1])
    items = rows[:limit]
    next_cursor = _encode_cursor(items[-1]) if len(rows) > limit else None
    return ActionPage(items=items, next_cursor=next_cursor)


# --- what a status means -----------------------------------------------------------------


@dataclass(frozen=True)
class StatusExplanation:
    """What a status means for the one waiting on it.

    ``summary``: what is true now. ``next_step``: what happens next, and what the agent should
    (not) do. ``held_by``: who or what the action waits for. ``final``: nothing will change any
    more. ``needs_person``: a named person must act before anything changes.
    """

    summary: str
    next_step: str
    held_by: str
    final: bool
    needs_person: bool


def _finance_role(user: Any) -> str:
    # A role, never a name: agents read this, and who works in finance is not theirs to know
    # (a name is a target for phishing and pressure).
    if user is None:
        return "finance (not yet assigned)"
    return "a person in finance"


def _when(moment: datetime | None) -> str:
    return f"{moment:%Y-%m-%d %H:%M} UTC" if moment else "soon"


def _held_by(holder: str, *, summary: str, next_step: str, needs_person: bool = False) -> StatusExplanation:
    """An action on its way, which ``holder`` holds: a person who must act (``needs_person``) or a
    part of the console or the receiver that moves it on by itself."""
    return StatusExplanation(
        summary=summary, next_step=next_step, held_by=holder, final=False, needs_person=needs_person
    )


def _waits_for_a_manager(summary: str, decision: str) -> StatusExplanation:
    """Proposed, or stale: a manager's ``decision`` is next, and a new proposal would only find
    this action."""
    return _held_by(
        "a manager", summary=summary, next_step=f"{decision} Poll this action. {_NEVER_AGAIN}", needs_person=True
    )


def _final(*, summary: str, next_step: str, held_by: str = "nobody") -> StatusExplanation:
    """An action in a status nothing changes any more."""
    return StatusExplanation(summary=summary, next_step=next_step, held_by=held_by, final=True, needs_person=False)


_NEVER_AGAIN = "Do not propose it again: a new proposal for the same request returns this action."


def action_explain_status(action: Action) -> StatusExplanation:
    """A plain-language explanation of ``action.status``: what happens next and who holds it.

    Each stage of the action's life explains its own statuses: before anything is sent, while a
    send's outcome is open, and once it is final.
    """
    money = f"{action.amount} {action.currency}"
    for explain in (_explain_before_sending, _explain_while_open, _explain_final):
        explanation = explain(action, money)
        if explanation is not None:
            return explanation
    return StatusExplanation(
        summary=f"The action is {action.get_status_display().lower()}.",
        next_step="Poll this action.",
        held_by="the console",
        final=action.status in TERMINAL_STATUSES,
        needs_person=False,
    )


def _explain_before_sending(action: Action, money: str) -> StatusExplanation | None:
    """Proposed, approved or stale: nothing was sent to the receiver."""
    status = action.status
    if status == S.PROPOSED:
        return _waits_for_a_manager(
            f"The refund of {money} is proposed and waits for a decision. Nothing was sent to the payment provider.",
            "A manager whose approval limit covers the amount approves or rejects it.",
        )
    if status == S.AUTHORIZED:
        return _held_by(
            "the console's workers",
            summary=f"The refund of {money} is approved. Nothing was sent to the payment provider yet.",
            next_step="A console worker reserves the amount on the order and sends the refund, usually within "
            f"{settings.SWEEP_INTERVAL_SECONDS} seconds. Poll this action. {_NEVER_AGAIN}",
        )
    if status == S.STALE:
        return _waits_for_a_manager(
            "The approval no longer holds: the order changed since it was given, or it expired. Nothing was sent to "
            "the payment provider.",
            "A manager asks for a new decision on the same action, or cancels it.",
        )
    return None


def _explain_while_open(action: Action, money: str) -> StatusExplanation | None:
    """Being sent, or sent with its final outcome not yet known: the console or a person holds it."""
    status = action.status
    if status == S.SUBMITTING:
        return _held_by(
            "the console's workers",
            summary=f"The refund of {money} is being sent to the payment provider; the amount is reserved on the "
            "order.",
            next_step="The worker records the provider's answer. If the answer is unclear, the console asks the "
            f"provider what happened before anything else. Poll this action. {_NEVER_AGAIN}",
        )
    if status == S.UNKNOWN:
        return _held_by(
            "the console's reconciliation",
            summary=f"The refund of {money} was sent, but the payment provider's answer was unclear (a timeout or "
            "an error). It may or may not have happened; the amount stays reserved.",
            next_step="The console asks the provider for its record of this refund (next check "
            f"{_when(action.next_reconcile_at)}); after {settings.RECONCILE_MAX_FAILURES} inconclusive checks a named "
            "person in finance takes it over. "
            "Wait and read this action: never send a new request, and never tell the customer it failed.",
        )
    if status == S.SETTLING:
        return _held_by(
            "the payment provider",
            summary=f"The payment provider accepted the refund of {money}; its final status is pending.",
            next_step="The console records the provider's final status when it settles. Poll this action.",
        )
    if status == S.NEEDS_REVIEW:
        due = f" by {_when(action.due_at)}" if action.due_at else ""
        return _held_by(
            _finance_role(action.owner),
            summary=f"The outcome of the refund of {money} could not be established automatically; the amount stays "
            "reserved.",
            next_step=f"{_finance_role(action.owner)} resolves it{due} with the payment provider's evidence. "
            "Wait and read this action: never send a new request.",
            needs_person=True,
        )
    return None


def _explain_final(action: Action, money: str) -> StatusExplanation | None:
    """Succeeded, failed, rejected or cancelled: nothing changes any more."""
    status = action.status
    if status == S.SUCCEEDED:
        reference = f" (provider reference {action.provider_reference})" if action.provider_reference else ""
        return _final(
            summary=f"The refund of {money} succeeded{reference}.",
            next_step="Nothing: this is final. The customer's bank shows the money in its own time.",
        )
    if status == S.FAILED_FINAL:
        return _final(
            summary=f"The refund of {money} failed for good: the payment provider refused it, and no money moved.",
            next_step="Nothing for the agent: this is final. Finance follows up with the customer (store credit or "
            "a bank transfer).",
            held_by="finance (follow-up)",
        )
    if status == S.REJECTED:
        reasons = "; ".join(str(r.get("message", "")) for r in action.rejection_reasons if isinstance(r, dict))
        because = f": {reasons}" if reasons else "."
        return _final(
            summary=f"The refund of {money} was rejected{because}",
            next_step="Nothing: this is final and nothing was sent to the payment provider. A different refund needs "
            "a new refund request.",
        )
    if status == S.CANCELLED:
        return _final(
            summary=f"The refund of {money} was cancelled before anything was sent to the payment provider.",
            next_step="Nothing: this is final. A different refund needs a new refund request.",
        )
    return None


def refund_request_by_reference(
    *, order_number: str, external_reference: str, agent: Agent | None = None
) -> RefundRequest | None:
    """The refund request on this order opened with this external reference, or None.

    A reference that exists on another order is None too: the caller named the wrong order. So
    is, for an agent, a request another agent opened (``RefundRequest.objects.visible_to``).
    """
    if not (storable_text(order_number) and storable_text(external_reference)):
        return None
    return (
        RefundRequest.objects.visible_to(agent)
        .select_related("order")
        .filter(external_reference=external_reference, order__number=order_number)
        .first()
    )
