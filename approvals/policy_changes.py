"""Changes to approval limits and auto-approval caps: proposed in the admin site, in force only
once a second person, a member of finance, confirms them.

An admin alone could otherwise raise a manager's limit or the caps on autonomy, with only the
admin log to tell. So the admin site calls ``policy_change_propose`` instead of saving a limit or
a cap, and the row keeps its old values until ``policy_change_confirm`` writes the new ones, in
the transaction that marks the change confirmed. Who may confirm is decided by
``approvals.four_eyes.policy_change_refusal``. Each step (proposed, confirmed, rejected) goes
into the security trail with the values before and after. Finance hears of waiting changes
through the notifications (actions/notifications.py) and decides them on one page
(approvals/policy_change_views.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from actions.foundation.security import security_event_record
from actions.models import SecurityEventKind
from approvals.four_eyes import policy_change_reader_refusal, policy_change_refusal
from approvals.models import (
    ApprovalLimit,
    AutoApprovalCap,
    PolicyChange,
    PolicyChangeStatus,
    PolicyOperation,
    PolicyTarget,
)

PolicyRow = ApprovalLimit | AutoApprovalCap

# How many decided changes the finance page lists under the waiting ones.
RECENTLY_DECIDED = 20


class PolicyChangeRefused(Exception):
    """A change that cannot be proposed, confirmed or rejected. ``status`` is what an interface
    answers: 400 for bad values, 403 for a rule about the person, 409 for the change's state."""

    def __init__(self, message: str, *, status: int = 409) -> None:
        super().__init__(message)
        self.status = status


def _money(value: Decimal | None) -> str | None:
    # Two places, as the tables store them: "750" typed in the admin equals the stored "750.00".
    return None if value is None else str(Decimal(value).quantize(Decimal("0.01")))


def _values(row: PolicyRow) -> dict[str, Any]:
    if isinstance(row, ApprovalLimit):
        return {"max_amount": _money(row.max_amount)}
    return {"max_amount": _money(row.max_amount), "max_count": row.max_count, "window_hours": row.window_hours}


def _rows_of(change: PolicyChange) -> QuerySet[Any]:
    """The limit or cap the change is about, by its natural key (at most one row)."""
    if change.target == PolicyTarget.APPROVAL_LIMIT:
        assert change.limit_user_id is not None  # the table's check constraint holds it too
        return ApprovalLimit.objects.filter(user_id=change.limit_user_id, currency=change.currency)
    return AutoApprovalCap.objects.filter(scope=change.scope, currency=change.currency)


def _security_trail_record(change: PolicyChange, kind: SecurityEventKind, *, user: Any) -> None:
    """One step of ``change`` (proposed, confirmed, rejected) in the security trail: who took it,
    and the change in full."""
    security_event_record(kind=kind, user=user, subject=change.what(), detail=_trail_detail(change))


def _trail_detail(change: PolicyChange) -> dict[str, Any]:
    detail: dict[str, Any] = {
        "change": change.pk,
        "what": change.what(),
        "operation": change.operation,
        "currency": change.currency,
        "before": change.before,
        "after": change.after,
        "proposed_by": change.proposed_by.get_username(),
    }
    if change.target == PolicyTarget.APPROVAL_LIMIT:
        assert change.limit_user is not None
        detail["user"] = change.limit_user.get_username()
    else:
        detail["scope"] = change.scope
    if change.decision_note:
        detail["note"] = change.decision_note
    return detail


def _change_for(*, row: PolicyRow, operation: str, proposed_by: Any, now: datetime) -> PolicyChange:
    # A limit is named by its person, a cap by its scope; both by their currency.
    named: dict[str, Any] = (
        {"target": PolicyTarget.APPROVAL_LIMIT, "limit_user": row.user}
        if isinstance(row, ApprovalLimit)
        else {"target": PolicyTarget.AUTO_APPROVAL_CAP, "scope": row.scope}
    )
    return PolicyChange(**named, operation=operation, currency=row.currency, proposed_by=proposed_by, proposed_at=now)


def _waiting_refusal(change: PolicyChange) -> PolicyChangeRefused | None:
    waiting = (
        PolicyChange.objects.filter(
            status=PolicyChangeStatus.PENDING,
            target=change.target,
            limit_user_id=change.limit_user_id,
            scope=change.scope,
            currency=change.currency,
        )
        .select_related("proposed_by", "limit_user")
        .first()
    )
    if waiting is None:
        return None
    return PolicyChangeRefused(
        f"Nothing was changed: a change to the {waiting.what()} ({waiting.before_text()} to {waiting.after_text()}, "
        f"proposed by {waiting.proposed_by.get_username()}) is already waiting for finance. "
        "Finance confirms or rejects it first."
    )


def policy_change_propose(
    *, proposed_by: Any, row: PolicyRow, operation: str, now: datetime | None = None
) -> PolicyChange | None:
    """Propose ``row``'s values (for a removal, its removal) for finance to confirm. The limit or
    cap itself is not written. Returns None when the values asked for are those in force.

    ``row`` is an unsaved or edited instance, as the admin's form leaves it; its person (or
    scope) and currency name the row.
    """
    now = now or timezone.now()
    change = _change_for(row=row, operation=operation, proposed_by=proposed_by, now=now)
    if change.limit_user_id is not None and change.limit_user_id == proposed_by.pk:
        # The admin site hides one's own limit already; this holds for any other caller.
        raise PolicyChangeRefused("Nobody proposes a change to their own approval limit.", status=403)
    if operation != PolicyOperation.DELETE:
        try:
            row.clean_fields()
        except ValidationError as invalid:
            raise PolicyChangeRefused(" ".join(invalid.messages), status=400) from invalid
        change.after = _values(row)
    with transaction.atomic():
        stored = _rows_of(change).select_for_update().first()
        if operation == PolicyOperation.CREATE and stored is not None:
            raise PolicyChangeRefused(f"The {change.what()} exists already: change it instead.")
        if operation != PolicyOperation.CREATE and (stored is None or stored.pk != row.pk):
            raise PolicyChangeRefused(f"There is no such {change.what()}: add it instead.")
        change.before = _values(stored) if stored is not None else None
        if operation == PolicyOperation.UPDATE and change.before == change.after:
            return None
        refused = _waiting_refusal(change)
        if refused is not None:
            raise refused
        try:
            with transaction.atomic():
                change.save()
        except IntegrityError as lost:
            # Another admin proposed a change to the same row in the meantime.
            raise _waiting_refusal(change) or PolicyChangeRefused("Nothing was changed: try again.") from lost
        _security_trail_record(change, SecurityEventKind.POLICY_CHANGE_PROPOSED, user=proposed_by)
    return change


def _locked(change_pk: int) -> PolicyChange:
    return (
        PolicyChange.objects.select_for_update(of=("self",))
        .select_related("proposed_by", "limit_user")
        .get(pk=change_pk)
    )


def _still_pending(change: PolicyChange) -> None:
    if change.status != PolicyChangeStatus.PENDING:
        assert change.decided_by is not None
        raise PolicyChangeRefused(
            f"This change was {change.get_status_display().lower()} already, by {change.decided_by.get_username()}."
        )


def _apply(change: PolicyChange) -> None:
    """Write the change's ``after`` to its row, while the row still holds ``before``."""
    stored = _rows_of(change).select_for_update().first()
    current = _values(stored) if stored is not None else None
    if current != change.before:
        raise PolicyChangeRefused(
            f"The {change.what()} changed since this was proposed: it is {change.values_text(current)} now, "
            f"not {change.before_text()}. Reject this change; the admin proposes it again if it is still wanted."
        )
    if change.operation == PolicyOperation.DELETE:
        assert stored is not None
        stored.delete()
        return
    after = {**(change.after or {})}
    after["max_amount"] = Decimal(after["max_amount"])
    if stored is not None:
        for field, value in after.items():
            setattr(stored, field, value)
        stored.save(update_fields=list(after))
    elif change.target == PolicyTarget.APPROVAL_LIMIT:
        assert change.limit_user is not None
        ApprovalLimit.objects.create(user=change.limit_user, currency=change.currency, **after)
    else:
        AutoApprovalCap.objects.create(scope=change.scope, currency=change.currency, **after)


def policy_change_confirm(*, change_pk: int, user: Any, now: datetime | None = None) -> PolicyChange:
    """Confirm a waiting change as ``user``: the limit or cap takes the new values now."""
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        change = _locked(change_pk)
        refusal = policy_change_refusal(change=change, user=user)
        if refusal is not None:
            raise PolicyChangeRefused(refusal, status=403)
        _still_pending(change)
        _apply(change)
        change.confirm(by=user, at=now)
        change.save(update_fields=["status", "decided_by", "decided_at"])
        _security_trail_record(change, SecurityEventKind.POLICY_CHANGE_CONFIRMED, user=user)
    return change


def policy_change_reject(*, change_pk: int, user: Any, note: str = "", now: datetime | None = None) -> PolicyChange:
    """Reject a waiting change as ``user``: the limit or cap keeps its values. Any member of
    finance may reject, the proposer too (a withdrawal): nothing changes either way."""
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        change = _locked(change_pk)
        refusal = policy_change_reader_refusal(user=user)
        if refusal is not None:
            raise PolicyChangeRefused(refusal, status=403)
        _still_pending(change)
        change.reject(by=user, at=now, note=note)
        change.save(update_fields=["status", "decided_by", "decided_at", "decision_note"])
        _security_trail_record(change, SecurityEventKind.POLICY_CHANGE_REJECTED, user=user)
    return change


# --- what finance reads ------------------------------------------------------------------------


@dataclass(frozen=True)
class WaitingChange:
    change: PolicyChange
    # Why this person may not confirm it (their own proposal, their own limit), or None.
    refusal: str | None


@dataclass(frozen=True)
class PolicyChangesPage:
    waiting: list[WaitingChange]
    decided: list[PolicyChange]


def policy_changes_page_get(*, user: Any) -> PolicyChangesPage:
    related = ("proposed_by", "limit_user", "decided_by")
    waiting = PolicyChange.objects.filter(status=PolicyChangeStatus.PENDING).select_related(*related)
    decided = PolicyChange.objects.exclude(status=PolicyChangeStatus.PENDING).select_related(*related)
    return PolicyChangesPage(
        waiting=[
            WaitingChange(change, policy_change_refusal(change=change, user=user))
            for change in waiting.order_by("proposed_at", "pk")
        ],
        decided=list(decided.order_by("-decided_at", "-pk")[:RECENTLY_DECIDED]),
    )


def policy_changes_waiting_count(*, user: Any) -> int:
    """How many waiting changes ``user`` may confirm (they are few: one per limit or cap)."""
    waiting = PolicyChange.objects.filter(status=PolicyChangeStatus.PENDING).select_related("limit_user")
    return sum(1 for change in waiting if policy_change_refusal(change=change, user=user) is None)
