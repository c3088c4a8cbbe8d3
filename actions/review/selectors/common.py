"""The review queue's vocabulary: its states, its item kinds, who may work on an item, and what
the receiver last said."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import Q

from actions import permissions as perms
from actions.engine.housekeeping import body_pruned
from actions.engine.resolution_checks import resolver_refusal
from actions.kinds import kind_for, owner_groups
from actions.models import (
    Action,
    ActionStatus,
    Attempt,
    AttemptKind,
    DiscrepancyStatus,
    FollowUpStatus,
)
from actions.plain import error_words
from actions.providers.money import from_minor_units, money_text

S = ActionStatus

# Who may open finance's pages: finance resolves, admins read (and correct in the admin site).
RESOLVE_PERMISSION = perms.RESOLVE
CORRECT_PERMISSION = perms.CORRECT

# Action statuses the queue watches. SUBMITTING only counts once its lease has expired: within
# the lease a worker is still at work and nobody should step in.
QUEUE_ACTION_STATUSES = (S.NEEDS_REVIEW, S.UNKNOWN, S.SUBMITTING, S.SETTLING)
OPEN_FOLLOW_UP = (FollowUpStatus.OPEN, FollowUpStatus.IN_PROGRESS)
OPEN_DISCREPANCY = (DiscrepancyStatus.OPEN, DiscrepancyStatus.IN_PROGRESS)

# The queue shows the most urgent rows first, a page at a time, so a backlog of thousands still
# gives a page that renders (and refreshes every few seconds) quickly. The pages follow each other
# by a cursor (keyset): the next page starts after the last row's sort key, so an item resolved
# or added meanwhile neither repeats a row nor skips one, as an offset would.
QUEUE_PAGE_SIZE = 50


class ItemKind:
    ACTION = "action"
    REMEDY = "remedy"
    DISCREPANCY = "discrepancy"

    CHOICES = ((ACTION, "Actions"), (REMEDY, "Remedies"), (DISCREPANCY, "Discrepancies"))


# The state filter: the four watched action statuses, and the two open follow-up statuses.
STATE_CHOICES = (
    (S.NEEDS_REVIEW.value, "Needs review"),
    (S.UNKNOWN.value, "Unknown"),
    (S.SUBMITTING.value, "Stuck submitting"),
    (S.SETTLING.value, "Settling"),
    (FollowUpStatus.OPEN.value, "Follow-up open"),
    (FollowUpStatus.IN_PROGRESS.value, "Follow-up in progress"),
)
ACTION_STATES = frozenset(status.value for status in QUEUE_ACTION_STATUSES)

# Urgency after "overdue": what a person must do something about comes first.
RANK = {
    S.NEEDS_REVIEW.value: 0,
    S.UNKNOWN.value: 1,
    S.SUBMITTING.value: 2,
    S.SETTLING.value: 3,
    ItemKind.DISCREPANCY: 4,
    ItemKind.REMEDY: 5,
}


def may_view_review(user: Any) -> bool:
    return bool(user.has_perm(RESOLVE_PERMISSION) or user.has_perm(CORRECT_PERMISSION))


# --- who may work on an item, and whom it can be passed on to -------------------------------------

# The permission each kind of review item is worked with.
ITEM_PERMISSION = {
    ItemKind.ACTION: perms.RESOLVE,
    ItemKind.REMEDY: perms.CHANGE_REMEDY,
    ItemKind.DISCREPANCY: perms.CHANGE_DISCREPANCY,
}


@dataclass(frozen=True)
class ReviewPeople:
    """What ``resolver_refusal`` is asked with on a page, read once: the owner group of every
    kind, and every active person whose role works review items, with their groups. The rule
    itself decides; these reads only keep a page's queries the same whatever its items are."""

    groups: dict[str, str]
    people: list[Any]

    def person(self, user: Any) -> Any:
        """``user`` as read with the others (groups and all), or ``user`` when not among them."""
        return next((person for person in self.people if person.pk == getattr(user, "pk", None)), user)

    def refusal(self, user: Any, *, kind: str | None, owner: Any, permission: str) -> str | None:
        return resolver_refusal(
            user=self.person(user), kind=kind, owner=owner, permission=permission, groups=self.groups
        )

    def choices(self, *, kind: str | None, permission: str) -> list[Any]:
        """Whom an item of ``kind`` can be (re)assigned to: those who may work on it without
        being given it, the same rule the assignment service checks a new owner with."""
        return [
            person
            for person in self.people
            if resolver_refusal(user=person, kind=kind, owner=None, permission=permission, groups=self.groups) is None
        ]


def review_people_get() -> ReviewPeople:
    """Everyone a page may offer for an item or ask the rule about, in a constant number of
    queries: active people holding a review permission through a group or by themselves."""
    codenames = [permission.split(".", 1)[1] for permission in ITEM_PERMISSION.values()]
    holds = Q(groups__permissions__codename__in=codenames) | Q(user_permissions__codename__in=codenames)
    people = get_user_model().objects.filter(holds, is_active=True).distinct().order_by("username")
    return ReviewPeople(groups=owner_groups(), people=list(people.prefetch_related("groups")))


# --- what the receiver last said -----------------------------------------------------------------


def _money_minor(amount: object, currency: object) -> str:
    if isinstance(amount, int) and not isinstance(amount, bool) and isinstance(currency, str) and currency:
        try:
            return money_text(from_minor_units(amount, currency.upper()), currency)
        except (ValueError, KeyError):
            pass
    return f"{amount} {currency}"


def effect_fields(record: dict[str, Any]) -> dict[str, str]:
    """A receiver's record of an effect, as the pages name it: a Stripe-shaped refund, or a
    Xero-shaped credit note (an invoice adjustment's effect)."""
    if "CreditNoteID" in record:
        noun, key, status, created = "credit note", "CreditNoteID", "Status", "UpdatedDateUTC"
        amount = money_text(record.get("Total"), record.get("CurrencyCode"))
    else:
        noun, key, status, created = "refund", "id", "status", "created"
        amount = _money_minor(record.get("amount"), record.get("currency"))
    return {
        "noun": noun,
        "id": str(record.get(key, "?")),
        "status": str(record.get(status, "?")),
        "amount": amount,
        "created": str(record.get(created, "")),
    }


def _refund_phrase(refund: dict[str, Any]) -> str:
    fields = effect_fields(refund)
    return f"{fields['noun']} {fields['id']} {fields['status']} ({fields['amount']})"


def attempt_words(attempt: Attempt | None, *, action: Action) -> str:
    """``attempt_summary`` for a clerk: a receiver's error becomes one sentence (the one mapping,
    ``actions.plain.error_words``); the raw line stays for the technical details."""
    error = attempt.error if attempt is not None else None
    if not error:
        return attempt_summary(attempt)
    kind = kind_for(action.kind)
    return error_words(error, receiver=kind.contract().receiver, effect=kind.explanations.noun)


def attempt_summary(attempt: Attempt | None) -> str:
    """One line for a person: what the receiver answered to this attempt."""
    if attempt is None:
        return "Nothing has been sent to the provider."
    if body_pruned(attempt.response) or body_pruned(attempt.request):
        return (
            f"Answer recorded: {attempt.outcome or 'unknown'}. The request and answer were removed after "
            f"{settings.ATTEMPT_BODY_RETENTION_DAYS} days (the action is final)."
        )
    error = attempt.error or None
    if attempt.kind == AttemptKind.LOOKUP:
        refunds = (attempt.response or {}).get("effects") or (attempt.response or {}).get("refunds") or []
        if attempt.finished_at is None:
            return "Lookup: no answer recorded yet."
        if error:
            return f"Lookup could not tell: {error.get('type', 'error')}: {error.get('message', '')}".strip()
        if not refunds:
            return "Lookup: no refund for this action at the provider."
        return "Lookup found " + "; ".join(_refund_phrase(refund) for refund in refunds) + "."
    if attempt.finished_at is None:
        return "Sent; no answer recorded yet."
    if error:
        code = f" ({error['code']})" if error.get("code") else ""
        return f"{error.get('type', 'Error')}: {error.get('message', '')}{code}"
    if attempt.response:
        return _refund_phrase(attempt.response).capitalize() + "."
    return f"Answer recorded: {attempt.outcome or 'unknown'}."
