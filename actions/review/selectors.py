"""Reads for finance's pages: the review queue, one action's whole story, a follow-up, and the
numbers on the home page.

Every function here runs a fixed number of queries however long the history is: related rows
are joined, the latest attempt of each action is found by a subquery and fetched in one more
query, and the queue's main query only touches the live statuses, which the partial index
``action_live_idx`` covers. ``tests/actions/test_review_scale.py`` holds them to that.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import Case, Count, F, IntegerField, Min, OuterRef, Q, QuerySet, Subquery, Value, When
from django.db.models.functions import Coalesce
from django.db.models.lookups import LessThan
from django.utils import timezone

from actions import permissions as perms
from actions.engine.invariants import max_unknown_seconds
from actions.engine.resolutions import resolver_refusal
from actions.housekeeping import body_pruned
from actions.kinds import kind_for, owner_groups
from actions.kinds.base import EffectKind
from actions.models import (
    Action,
    ActionEvent,
    ActionStatus,
    Attempt,
    AttemptKind,
    Discrepancy,
    DiscrepancyStatus,
    FollowUpStatus,
    LedgerAuditRun,
    Order,
    Remedy,
)
from actions.providers.money import from_minor_units
from actions.review.rules import (
    follow_up_kind,
    lookup_fresh_until,
    owner_rule_refusal,
    owners_only,
    retry_evidence_from_attempt,
    retry_lookup_max_age,
)
from approvals.models import Approval

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
            return f"{from_minor_units(amount, currency.upper())} {currency.upper()}"
        except (ValueError, KeyError):
            pass
    return f"{amount} {currency}"


def _effect_fields(record: dict[str, Any]) -> dict[str, str]:
    """A receiver's record of an effect, as the pages name it: a Stripe-shaped refund, or a
    Xero-shaped credit note (an invoice adjustment's effect)."""
    if "CreditNoteID" in record:
        return {
            "noun": "credit note",
            "id": str(record.get("CreditNoteID", "?")),
            "status": str(record.get("Status", "?")),
            "amount": f"{record.get('Total')} {record.get('CurrencyCode', '')}".strip(),
            "created": str(record.get("UpdatedDateUTC", "")),
        }
    return {
        "noun": "refund",
        "id": str(record.get("id", "?")),
        "status": str(record.get("status", "?")),
        "amount": _money_minor(record.get("amount"), record.get("currency")),
        "created": str(record.get("created", "")),
    }


def _refund_phrase(refund: dict[str, Any]) -> str:
    fields = _effect_fields(refund)
    return f"{fields['noun']} {fields['id']} {fields['status']} ({fields['amount']})"


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


# --- the queue ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueueFilters:
    mine: bool = False
    unassigned: bool = False
    overdue: bool = False
    state: str = ""
    kind: str = ""

    @property
    def active(self) -> bool:
        return any((self.mine, self.unassigned, self.overdue, self.state, self.kind))

    @property
    def query(self) -> str:
        """The filters as a query string ("?mine=1&state=UNKNOWN"), or "" when none is set."""
        params = {name: "1" for name in ("mine", "unassigned", "overdue") if getattr(self, name)}
        params.update({name: getattr(self, name) for name in ("state", "kind") if getattr(self, name)})
        return f"?{urlencode(params)}" if params else ""


@dataclass(frozen=True)
class QueueRow:
    """One item in the review queue, whatever its kind, with what the columns show."""

    kind: str
    item: Any
    state: str
    state_label: str
    owner: Any
    since: datetime
    due: datetime | None
    overdue: bool
    amount: Decimal | None
    currency: str
    order: Order | None
    submissions: int
    lookups: int
    last_answer: str
    next_reconcile_at: datetime | None
    next_reconcile_note: str
    rank: int
    refusal: str | None
    # Why this person may not work on the item at all (``resolver_refusal``), and whom its
    # Reassign list offers; set for the rows of the page shown.
    work_refusal: str | None = None
    members: tuple[Any, ...] = ()

    @property
    def pk(self) -> int:
        return int(self.item.pk)

    @property
    def may_work(self) -> bool:
        return self.work_refusal is None

    @property
    def dom_id(self) -> str:
        return f"queue-{self.kind}-{self.item.pk}"


# The kinds in the order the queue breaks ties in (the last part of the sort key).
_KIND_ORDER = {ItemKind.ACTION: 0, ItemKind.REMEDY: 1, ItemKind.DISCREPANCY: 2}
SortKey = tuple[int, int, int, int, int]


class BadCursor(ValueError):
    """The ``after`` parameter is not a cursor this queue wrote."""


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def row_sort_key(row: QueueRow) -> SortKey:
    """Overdue first, then by state, oldest first; the kind and id make every key unique.

    The moment is counted in whole microseconds by integer arithmetic, as PostgreSQL keeps it:
    a float's ``timestamp() * 1e6`` is one off for about 2 % of moments between 1970 and 2112
    (2004-07-19 13:23:06.993841 UTC is one), and the next page's query, which compares the
    moments in the database, would then show the cursor's own row again."""
    since = (row.since - _EPOCH) // _MICROSECOND
    return (0 if row.overdue else 1, row.rank, since, _KIND_ORDER[row.kind], row.pk)


def cursor_encode(key: SortKey) -> str:
    return ".".join(str(part) for part in key)


def cursor_decode(text: str) -> SortKey:
    parts = text.split(".")
    if len(parts) != 5 or not all(part.lstrip("-").isdigit() and len(part) < 20 for part in parts):
        raise BadCursor("after: not a page of this queue (use the queue's own Next link)")
    a, b, c, d, e = (int(part) for part in parts)
    return (a, b, c, d, e)


@dataclass(frozen=True)
class Queue:
    rows: list[QueueRow]
    total: int
    filters: QueueFilters
    owners_only: bool
    refresh_seconds: int = 5
    # The cursor this page starts after ("" for the first page), and the next page's, if any.
    after: str = ""
    next_after: str = ""
    # How many rows come before this page (its first row is number position + 1).
    position: int = 0

    @property
    def truncated(self) -> bool:
        return self.total > len(self.rows)

    @property
    def first_number(self) -> int:
        return self.position + 1

    @property
    def last_number(self) -> int:
        return self.position + len(self.rows)


def queue_actions_queryset(*, now: datetime) -> QuerySet[Action]:
    """The queue's main query, as its first page runs it (without the page's LIMIT): live
    actions that need a person or a look, in the queue's order, with their latest attempt.

    The status list matches the partial index ``action_live_idx``, so the scan stays small
    however many resolved actions pile up; SUBMITTING within its lease is left out afterwards.
    """
    source = _action_source(queue_actions_live(now=now), user=None, now=now)
    return source.shown(source.keyed()).order_by(*_QUEUE_ORDER)


def queue_actions_live(*, now: datetime) -> QuerySet[Action]:
    """The live actions the queue lists (see ``queue_actions_queryset``), as bare rows: what
    the queue counts and sorts."""
    return Action.objects.filter(status__in=list(QUEUE_ACTION_STATUSES)).exclude(
        status=S.SUBMITTING, lease_expires_at__gte=now
    )


def _with_what_a_row_shows(actions: QuerySet[Action]) -> QuerySet[Action]:
    """The order and owner joined, the latest attempt's key and the number of lookups as
    subqueries: for a page's rows only."""
    latest_attempt = Attempt.objects.filter(action=OuterRef("pk")).order_by("-started_at", "-pk").values("pk")[:1]
    lookups = (
        Attempt.objects.filter(action=OuterRef("pk"), kind=AttemptKind.LOOKUP)
        .order_by()
        .values("action")
        .annotate(n=Count("pk"))
        .values("n")
    )
    return actions.select_related("order", "owner").annotate(
        latest_attempt_pk=Subquery(latest_attempt),
        lookup_count=Coalesce(Subquery(lookups, output_field=IntegerField()), Value(0)),
    )


def action_due(action: Action, *, now: datetime) -> datetime | None:
    """When the action should have left its state, by the rule that applies to that state.

    NEEDS_REVIEW: the owner's due time. SUBMITTING: its lease plus a sweep interval (invariant
    8), after which the lease sweeper should have moved it. UNKNOWN: the escalation policy's
    longest schedule. SETTLING: the provider decides, so there is no due time.
    """
    if action.status == S.NEEDS_REVIEW:
        return action.due_at
    if action.status == S.SUBMITTING:
        expiry = action.lease_expires_at or action.status_changed_at or action.created_at
        return expiry + timedelta(seconds=settings.SWEEP_INTERVAL_SECONDS)
    if action.status == S.UNKNOWN:
        since = action.status_changed_at or action.created_at
        return since + timedelta(seconds=max_unknown_seconds())
    return None


def follow_up_due(opened_at: datetime) -> datetime:
    """Remedies and discrepancies are due like escalated actions: REVIEW_DUE_HOURS after opening."""
    return opened_at + timedelta(hours=settings.REVIEW_DUE_HOURS)


def _next_reconcile_note(action: Action) -> str:
    if action.status == S.NEEDS_REVIEW:
        return "stopped: a person decides"
    if action.status == S.SUBMITTING:
        return "after the lease sweep moves it to Unknown"
    if action.next_reconcile_at is None:
        return "not scheduled"
    return ""


def _action_row(action: Action, attempts: dict[int, Attempt], *, user: Any, now: datetime) -> QueueRow:
    due = action_due(action, now=now)
    label = "Stuck submitting" if action.status == S.SUBMITTING else action.get_status_display()
    latest_pk = getattr(action, "latest_attempt_pk", None)
    return QueueRow(
        kind=ItemKind.ACTION,
        item=action,
        state=action.status,
        state_label=label,
        owner=action.owner,
        since=action.status_changed_at or action.created_at,
        due=due,
        overdue=due is not None and due < now,
        amount=action.amount,
        currency=action.currency,
        order=action.order,
        submissions=action.attempt_count,
        lookups=int(getattr(action, "lookup_count", 0) or 0),
        last_answer=attempt_summary(attempts.get(latest_pk) if latest_pk else None),
        next_reconcile_at=action.next_reconcile_at if action.status in (S.UNKNOWN, S.SETTLING) else None,
        next_reconcile_note=_next_reconcile_note(action),
        rank=RANK[action.status],
        refusal=owner_rule_refusal(user=user, owner=action.owner),
    )


def _remedy_row(remedy: Remedy, *, user: Any, now: datetime) -> QueueRow:
    due = follow_up_due(remedy.created_at)
    action = remedy.action
    return QueueRow(
        kind=ItemKind.REMEDY,
        item=remedy,
        state=remedy.status,
        state_label=f"Remedy {remedy.get_status_display().lower()}",
        owner=remedy.owner,
        since=remedy.created_at,
        due=due,
        overdue=due < now,
        amount=remedy.amount,
        currency=remedy.currency,
        order=action.order if action is not None else None,
        submissions=action.attempt_count if action is not None else 0,
        lookups=0,
        last_answer=f"{remedy.get_kind_display()}: the refund failed for good; the customer still expects the money.",
        next_reconcile_at=None,
        next_reconcile_note="",
        rank=RANK[ItemKind.REMEDY],
        refusal=owner_rule_refusal(user=user, owner=remedy.owner),
    )


def _discrepancy_row(discrepancy: Discrepancy, *, user: Any, now: datetime) -> QueueRow:
    due = follow_up_due(discrepancy.detected_at)
    action = discrepancy.action
    return QueueRow(
        kind=ItemKind.DISCREPANCY,
        item=discrepancy,
        state=discrepancy.status,
        state_label=f"Discrepancy {discrepancy.get_status_display().lower()}",
        owner=discrepancy.owner,
        since=discrepancy.detected_at,
        due=due,
        overdue=due < now,
        amount=action.amount if action is not None else None,
        currency=action.currency if action is not None else "",
        order=action.order if action is not None else None,
        submissions=action.attempt_count if action is not None else 0,
        lookups=0,
        last_answer=f"{discrepancy.get_kind_display()}"
        + (f" ({discrepancy.provider_reference})" if discrepancy.provider_reference else ""),
        next_reconcile_at=None,
        next_reconcile_note="",
        rank=RANK[ItemKind.DISCREPANCY],
        refusal=owner_rule_refusal(user=user, owner=discrepancy.owner),
    )


def _owner_filter(filters: QueueFilters, user: Any) -> Q | None:
    # "Mine" and "unassigned" together mean "what I can pick up": mine or nobody's.
    parts = []
    if filters.mine:
        parts.append(Q(owner=user))
    if filters.unassigned:
        parts.append(Q(owner__isnull=True))
    if not parts:
        return None
    combined = parts[0]
    for part in parts[1:]:
        combined |= part
    return combined


# The sort key's parts as ``_QueueSource.keyed`` names them (the kind is the same in a source).
_QUEUE_ORDER = ("queue_late", "queue_rank", "queue_since", "pk")


@dataclass(frozen=True)
class _QueueSource:
    """One table the queue reads (actions, remedies or discrepancies), with its rows' sort key
    as SQL: whether the row is overdue (0) or not (1), its state's rank, and since when it has
    waited. These are the parts of ``row_sort_key``, worked out by the database with the same
    rules as ``action_due`` and ``follow_up_due``, so that the database sorts and pages the
    queue and only a page's rows come to Python."""

    kind: str
    # The rows as the filters leave them, bare: what is counted and sorted.
    rows: QuerySet[Any]
    overdue: Q
    rank: Any
    since: Any
    # What a page's rows are read with (joins, subqueries), and how each becomes a QueueRow.
    shown: Callable[[QuerySet[Any]], QuerySet[Any]]
    build: Callable[[Any], QueueRow]

    def keyed(self) -> QuerySet[Any]:
        return self.rows.annotate(
            queue_late=Case(When(self.overdue, then=Value(0)), default=Value(1)),
            queue_rank=self.rank,
            queue_since=self.since,
        )

    def after(self, key: SortKey) -> Q:
        """The rows whose sort key comes after ``key``: a row value comparison, spelled out."""
        late, rank, since_micros, kind, pk = key
        since = _EPOCH + since_micros * _MICROSECOND
        same_state = Q(queue_late=late, queue_rank=rank)
        after = (
            Q(queue_late__gt=late) | Q(queue_late=late, queue_rank__gt=rank) | (same_state & Q(queue_since__gt=since))
        )
        own_kind = _KIND_ORDER[self.kind]
        if own_kind > kind:
            after |= same_state & Q(queue_since=since)
        elif own_kind == kind:
            after |= same_state & Q(queue_since=since, pk__gt=pk)
        return after

    def page(self, after: SortKey | None, size: int) -> list[QueueRow]:
        rows = self.keyed()
        if after is not None:
            rows = rows.filter(self.after(after))
        page = self.shown(rows).order_by(*_QUEUE_ORDER)[:size]
        return [self.build(item) for item in page]

    def counts(self, after: SortKey | None) -> tuple[int, int]:
        """(how many rows, how many of them come after ``after``), in one statement."""
        rows = self.keyed().order_by()
        if after is None:
            total = rows.count()
            return total, total
        found = rows.aggregate(total=Count("pk"), later=Count("pk", filter=self.after(after)))
        return found["total"], found["later"]


def _action_source(actions: QuerySet[Action], *, user: Any, now: datetime) -> _QueueSource:
    # Overdue as ``action_due`` decides it: the owner's due time, a lease plus a sweep
    # interval, the escalation policy's longest schedule; a settling refund is never overdue.
    stuck_since = Coalesce("lease_expires_at", "status_changed_at", "created_at")
    waiting_since = Coalesce("status_changed_at", "created_at")
    overdue = (
        Q(status=S.NEEDS_REVIEW, due_at__lt=now)
        | (Q(status=S.SUBMITTING) & Q(LessThan(stuck_since, now - timedelta(seconds=settings.SWEEP_INTERVAL_SECONDS))))
        | (Q(status=S.UNKNOWN) & Q(LessThan(waiting_since, now - timedelta(seconds=max_unknown_seconds()))))
    )
    rank = Case(*(When(status=status, then=Value(RANK[status])) for status in ACTION_STATES))
    return _QueueSource(
        kind=ItemKind.ACTION,
        rows=actions,
        overdue=overdue,
        rank=rank,
        since=waiting_since,
        shown=_with_what_a_row_shows,
        build=lambda action: _action_row(action, {}, user=user, now=now),
    )


def _follow_up_source(
    kind: str, rows: QuerySet[Any], opened: str, *, build: Callable[[Any], QueueRow], now: datetime
) -> _QueueSource:
    # Due REVIEW_DUE_HOURS after opening (``follow_up_due``).
    overdue = Q(**{f"{opened}__lt": now - timedelta(hours=settings.REVIEW_DUE_HOURS)})
    return _QueueSource(
        kind=kind,
        rows=rows,
        overdue=overdue,
        rank=Value(RANK[kind]),
        since=F(opened),
        shown=lambda page: page.select_related("action", "action__order", "owner"),
        build=build,
    )


def _row_kind(row: QueueRow) -> str | None:
    """The effect kind whose owner group works the row's item."""
    return row.item.kind if row.kind == ItemKind.ACTION else follow_up_kind(row.item)


def _with_who_may_work(rows: list[QueueRow], *, user: Any) -> list[QueueRow]:
    """Each row with whether ``user`` may work on it and whom its Reassign list offers, asking
    the rule once per kind of item, effect kind and "it is mine", not once per row."""
    if not rows:
        return rows
    who = review_people_get()

    @functools.cache
    def refusal(item_kind: str, kind: str | None, mine: bool) -> str | None:
        owner = user if mine else None
        return who.refusal(user, kind=kind, owner=owner, permission=ITEM_PERMISSION[item_kind])

    @functools.cache
    def members(item_kind: str, kind: str | None) -> tuple[Any, ...]:
        return tuple(who.choices(kind=kind, permission=ITEM_PERMISSION[item_kind]))

    shown = []
    for row in rows:
        kind = _row_kind(row)
        mine = row.owner is not None and row.owner.pk == getattr(user, "pk", None)
        # The choices are worked out for every row, shown or not, so that the page reads the
        # same people whatever its items are.
        shown.append(replace(row, work_refusal=refusal(row.kind, kind, mine), members=members(row.kind, kind)))
    return shown


def review_queue_get(
    *,
    user: Any,
    filters: QueueFilters | None = None,
    now: datetime | None = None,
    after: str = "",
    page_size: int | None = None,
) -> Queue:
    """Every item that needs finance, most urgent first: overdue ones, then by state, oldest first;
    one page of them, starting after the cursor ``after``. Raises BadCursor.

    The database sorts and pages each kind of item by the sort key (``_QueueSource``) and counts
    them; the page is the first rows of the three merged. Only the page's rows are read whole,
    with their latest attempt: a backlog of fifteen thousand unknown refunds (a provider's outage)
    costs a sort in the database, not fifteen thousand rows built in Python at every refresh."""
    after_key = cursor_decode(after) if after else None
    page_size = page_size or QUEUE_PAGE_SIZE
    now = now or timezone.now()
    filters = filters or QueueFilters()
    owner_q = _owner_filter(filters, user)
    want = filters.kind
    state = filters.state
    if state in ACTION_STATES:
        want = want or ItemKind.ACTION
    sources: list[_QueueSource] = []

    if want in ("", ItemKind.ACTION) and (not state or state in ACTION_STATES):
        actions = queue_actions_live(now=now)
        if state:
            actions = actions.filter(status=state)
        if owner_q is not None:
            actions = actions.filter(owner_q)
        sources.append(_action_source(actions, user=user, now=now))

    follow_up_states = [state] if state and state not in ACTION_STATES else None
    # Remedies and discrepancies: the same filters, each opened at its own moment.
    follow_ups = (
        (ItemKind.REMEDY, Remedy, OPEN_FOLLOW_UP, "created_at", _remedy_row),
        (ItemKind.DISCREPANCY, Discrepancy, OPEN_DISCREPANCY, "detected_at", _discrepancy_row),
    )
    for kind, model, open_states, opened, row in follow_ups:
        if want not in ("", kind) or (state and state in ACTION_STATES):
            continue
        items = model.objects.filter(status__in=follow_up_states or list(open_states))
        if owner_q is not None:
            items = items.filter(owner_q)
        build = functools.partial(row, user=user, now=now)
        sources.append(_follow_up_source(kind, items, opened, build=build, now=now))

    if filters.overdue:
        sources = [replace(source, rows=source.rows.filter(source.overdue)) for source in sources]
    total = later = 0
    for source in sources:
        in_source, after_in_source = source.counts(after_key)
        total += in_source
        later += after_in_source
    # One more row than the page, to tell whether another page follows.
    merged = heapq.merge(*(source.page(after_key, page_size + 1) for source in sources), key=row_sort_key)
    candidates = list(itertools.islice(merged, page_size + 1))
    has_more = len(candidates) > page_size
    page_rows = candidates[:page_size]
    attempt_pks = [
        pk
        for pk in (getattr(row.item, "latest_attempt_pk", None) for row in page_rows if row.kind == ItemKind.ACTION)
        if pk
    ]
    if attempt_pks:
        attempts = Attempt.objects.in_bulk(attempt_pks)
        page_rows = [
            replace(row, last_answer=attempt_summary(attempts.get(row.item.latest_attempt_pk)))
            if row.kind == ItemKind.ACTION and getattr(row.item, "latest_attempt_pk", None)
            else row
            for row in page_rows
        ]
    page_rows = _with_who_may_work(page_rows, user=user)
    return Queue(
        rows=page_rows,
        total=total,
        filters=filters,
        owners_only=owners_only(),
        after=after,
        next_after=cursor_encode(row_sort_key(page_rows[-1])) if has_more and page_rows else "",
        position=total - later,
    )


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
            found = _effect_fields(self.refunds[0])["id"]
            return "" if found == "?" else found
        return ""

    def refund_lines(self) -> list[dict[str, str]]:
        return [
            {name: value for name, value in _effect_fields(refund).items() if name != "noun"} for refund in self.refunds
        ]


@dataclass(frozen=True)
class ActionDetail:
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
    def may_work(self) -> bool:
        return self.work_refusal is None

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
    events = list(
        ActionEvent.objects.filter(action_id=action.pk).select_related("actor_user").order_by("created_at", "id")
    )
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
class FollowUpDetail:
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
    def may_work(self) -> bool:
        return self.work_refusal is None

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


def ledger_audit_last_get() -> LedgerAuditRun | None:
    """The ledger audit's latest run, for everyone's home page."""
    return LedgerAuditRun.objects.order_by("-started_at", "-pk").first()
