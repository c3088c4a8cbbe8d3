"""The review queue: every item waiting for a person, sorted and paged by the database."""

from __future__ import annotations

import functools
import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.db.models import Case, Count, F, IntegerField, OuterRef, Q, QuerySet, Subquery, Value, When
from django.db.models.functions import Coalesce
from django.db.models.lookups import LessThan
from django.utils import timezone

from actions.engine.invariants import max_unknown_seconds
from actions.models import (
    Action,
    ActionStatus,
    Attempt,
    AttemptKind,
    Discrepancy,
    Order,
    Remedy,
)
from actions.review.rules import (
    follow_up_kind,
    owner_rule_refusal,
    owners_only,
)
from actions.review.selectors.common import (
    ACTION_STATES,
    ITEM_PERMISSION,
    OPEN_DISCREPANCY,
    OPEN_FOLLOW_UP,
    QUEUE_ACTION_STATUSES,
    QUEUE_PAGE_SIZE,
    RANK,
    ItemKind,
    attempt_summary,
    attempt_words,
    review_people_get,
)

S = ActionStatus

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
    # The receiver's own words for ``last_answer``, for the technical details; empty when the
    # sentence above says all there is.
    last_answer_technical: str = ""

    @property
    def pk(self) -> int:
        return int(self.item.pk)

    @property
    def technical_id(self) -> str:
        """The id behind the item, for the technical details: the action's id, or the id of
        the action a follow-up is about."""
        if self.kind == ItemKind.ACTION:
            return str(self.item.action_id)
        action = getattr(self.item, "action", None)
        return str(action.action_id) if action is not None else ""

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


def _answer_columns(attempt: Attempt | None, action: Action) -> tuple[str, str]:
    """The last answer in a clerk's words, and the receiver's own words when they differ."""
    words = attempt_words(attempt, action=action)
    raw = attempt_summary(attempt)
    return words, raw if raw != words else ""


def _with_answer(row: QueueRow, attempt: Attempt | None) -> QueueRow:
    words, technical = _answer_columns(attempt, row.item)
    return replace(row, last_answer=words, last_answer_technical=technical)


def _action_row(action: Action, attempts: dict[int, Attempt], *, user: Any, now: datetime) -> QueueRow:
    due = action_due(action, now=now)
    label = "Stuck submitting" if action.status == S.SUBMITTING else action.get_status_display()
    latest_pk = getattr(action, "latest_attempt_pk", None)
    last_answer, last_answer_technical = _answer_columns(attempts.get(latest_pk) if latest_pk else None, action)
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
        last_answer=last_answer,
        last_answer_technical=last_answer_technical,
        next_reconcile_at=action.next_reconcile_at if action.status in (S.UNKNOWN, S.SETTLING) else None,
        next_reconcile_note=_next_reconcile_note(action),
        rank=RANK[action.status],
        refusal=owner_rule_refusal(user=user, owner=action.owner),
    )


def _remedy_row(remedy: Remedy, *, user: Any, now: datetime) -> QueueRow:
    answer = f"{remedy.get_kind_display()}: the refund failed for good; the customer still expects the money."
    return _follow_up_row(remedy, remedy.created_at, (remedy.amount, remedy.currency), answer, user=user, now=now)


def _discrepancy_row(discrepancy: Discrepancy, *, user: Any, now: datetime) -> QueueRow:
    action = discrepancy.action
    money = (action.amount, action.currency) if action is not None else (None, "")
    reference = f" ({discrepancy.provider_reference})" if discrepancy.provider_reference else ""
    answer = f"{discrepancy.get_kind_display()}{reference}"
    return _follow_up_row(discrepancy, discrepancy.detected_at, money, answer, user=user, now=now)


def _follow_up_row(
    item: Remedy | Discrepancy,
    opened_at: datetime,
    money: tuple[Decimal | None, str],
    answer: str,
    *,
    user: Any,
    now: datetime,
) -> QueueRow:
    """A remedy's or a discrepancy's row: due a set time after it opened, about its action's
    order, never looked up, and ranked by its kind."""
    kind = str(type(item)._meta.model_name)  # ItemKind.REMEDY or ItemKind.DISCREPANCY
    due = follow_up_due(opened_at)
    action = item.action
    amount, currency = money
    return QueueRow(
        kind=kind,
        item=item,
        state=item.status,
        state_label=f"{kind.capitalize()} {item.get_status_display().lower()}",
        owner=item.owner,
        since=opened_at,
        due=due,
        overdue=due < now,
        amount=amount,
        currency=currency,
        order=action.order if action is not None else None,
        submissions=action.attempt_count if action is not None else 0,
        lookups=0,
        last_answer=answer,
        next_reconcile_at=None,
        next_reconcile_note="",
        rank=RANK[kind],
        refusal=owner_rule_refusal(user=user, owner=item.owner),
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
    sources = _queue_sources(user=user, filters=filters, now=now)
    total = later = 0
    for source in sources:
        in_source, after_in_source = source.counts(after_key)
        total += in_source
        later += after_in_source
    # One more row than the page, to tell whether another page follows.
    merged = heapq.merge(*(source.page(after_key, page_size + 1) for source in sources), key=row_sort_key)
    candidates = list(itertools.islice(merged, page_size + 1))
    has_more = len(candidates) > page_size
    page_rows = _with_who_may_work(_with_last_answers(candidates[:page_size]), user=user)
    return Queue(
        rows=page_rows,
        total=total,
        filters=filters,
        owners_only=owners_only(),
        after=after,
        next_after=cursor_encode(row_sort_key(page_rows[-1])) if has_more and page_rows else "",
        position=total - later,
    )


def _queue_sources(*, user: Any, filters: QueueFilters, now: datetime) -> list[_QueueSource]:
    """The kinds of item the filters ask for (actions, remedies, discrepancies), each a query the
    database sorts and counts, narrowed to the filters' state, owner and overdue."""
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
    return sources


def _with_last_answers(page_rows: list[QueueRow]) -> list[QueueRow]:
    """The page's actions with their latest attempt's answer, read in one query for the page."""
    attempt_pks = [
        pk
        for pk in (getattr(row.item, "latest_attempt_pk", None) for row in page_rows if row.kind == ItemKind.ACTION)
        if pk
    ]
    if attempt_pks:
        attempts = Attempt.objects.in_bulk(attempt_pks)
        page_rows = [
            _with_answer(row, attempts.get(row.item.latest_attempt_pk))
            if row.kind == ItemKind.ACTION and getattr(row.item, "latest_attempt_pk", None)
            else row
            for row in page_rows
        ]
    return page_rows
