"""The review queue is sorted and paged by the database: the order it gives must be the one the
queue's rules give (``row_sort_key`` over every open item, each item's due time and overdue flag
by ``action_due`` and ``follow_up_due``), page after page, with every filter.

The rules are written twice on purpose, once in Python for a row the page shows and once in SQL
for the rows the database sorts (``_QueueSource``); these tests hold the two to the same answer
on items of every kind and state, overdue and not, including moments whose float timestamp is
not a whole number of microseconds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from actions.engine.invariants import max_unknown_seconds
from actions.models import Action, Discrepancy, DiscrepancyKind, Remedy
from actions.review.selectors.queue import (
    QueueFilters,
    _action_row,
    _discrepancy_row,
    _remedy_row,
    queue_actions_live,
    review_queue_get,
    row_sort_key,
)
from actions.services import Actor
from tests.actions.test_finance_services import escalated, failed, settling, stuck_submitting, unknown

pytestmark = pytest.mark.django_db

# A moment whose float timestamp times a million is one below its microseconds.
FLOAT_ONE_OFF = datetime(2004, 7, 19, 13, 23, 6, 993841, tzinfo=UTC)


@pytest.fixture(autouse=True)
def no_broker(dispatched: list[int]) -> list[int]:
    return dispatched


def _mixed_queue(proposer: Actor, finance: Any) -> None:
    """Items of every kind and state, some overdue by each state's rule and some not, some with
    the same moment (the kind and key break the tie)."""
    now = timezone.now()
    escalated(proposer, owner=finance, due_at=now - timedelta(hours=1))  # overdue
    escalated(proposer, owner=finance, due_at=now + timedelta(hours=5))
    escalated(proposer)
    late_unknown, fresh_unknown, tied_unknown = unknown(proposer), unknown(proposer), unknown(proposer)
    long_ago = now - timedelta(seconds=max_unknown_seconds() + 60)
    Action.objects.filter(pk=late_unknown.pk).update(status_changed_at=long_ago)  # overdue
    Action.objects.filter(pk__in=[fresh_unknown.pk, tied_unknown.pk]).update(status_changed_at=FLOAT_ONE_OFF)
    stuck = stuck_submitting(proposer)  # its lease ran out 10 minutes ago: within the sweep or not
    Action.objects.filter(pk=stuck.pk).update(
        lease_expires_at=now - timedelta(seconds=settings.SWEEP_INTERVAL_SECONDS + 30)
    )
    stuck_submitting(proposer)
    settling(proposer)
    old_failure, new_failure = failed(proposer), failed(proposer)
    Remedy.objects.filter(action=old_failure).update(
        created_at=now - timedelta(hours=settings.REVIEW_DUE_HOURS + 1), owner=finance
    )
    Remedy.objects.filter(action=new_failure).update(created_at=FLOAT_ONE_OFF)
    Discrepancy.objects.create(kind=DiscrepancyKind.EFFECT_WITHOUT_ACTION, provider_reference="re_stray")
    tied = Discrepancy.objects.create(kind=DiscrepancyKind.DUPLICATE_EFFECT, action=late_unknown)
    Discrepancy.objects.filter(pk=tied.pk).update(detected_at=FLOAT_ONE_OFF)


def _by_the_rules(user: Any, now: datetime, filters: QueueFilters) -> list[tuple[str, int, bool]]:
    """Every open item as the Python rules sort it (the queue's order before the database
    sorted it), as (kind, key, overdue)."""
    rows = [_action_row(action, {}, user=user, now=now) for action in _live_actions(now)]
    rows += [
        _remedy_row(remedy, user=user, now=now) for remedy in Remedy.objects.filter(status__in=["open", "in_progress"])
    ]
    rows += [
        _discrepancy_row(discrepancy, user=user, now=now)
        for discrepancy in Discrepancy.objects.filter(status__in=["open", "in_progress"])
    ]
    if filters.overdue:
        rows = [row for row in rows if row.overdue]
    if filters.mine:
        rows = [row for row in rows if row.owner == user]
    return [(row.kind, row.pk, row.overdue) for row in sorted(rows, key=row_sort_key)]


def _live_actions(now: datetime) -> list[Action]:
    return list(queue_actions_live(now=now).select_related("order", "owner"))


def _walk(user: Any, now: datetime, filters: QueueFilters, page_size: int) -> list[tuple[str, int, bool]]:
    """Every page of the queue, by its cursor, as (kind, key, overdue)."""
    shown: list[tuple[str, int, bool]] = []
    after = ""
    for _ in range(100):
        queue = review_queue_get(user=user, filters=filters, now=now, after=after, page_size=page_size)
        assert queue.position == len(shown)
        shown += [(row.kind, row.pk, row.overdue) for row in queue.rows]
        assert queue.total == len(_by_the_rules(user, now, filters))
        if not queue.next_after:
            return shown
        after = queue.next_after
    raise AssertionError("the cursor never reached the last page")


@pytest.mark.parametrize("page_size", [1, 2, 5, 50])
@pytest.mark.parametrize(
    "filters", [QueueFilters(), QueueFilters(overdue=True), QueueFilters(mine=True)], ids=["all", "overdue", "mine"]
)
def test_the_pages_give_every_open_item_once_in_the_rules_order(
    finance: Any, agent_actor: Actor, page_size: int, filters: QueueFilters
) -> None:
    _mixed_queue(agent_actor, finance)
    now = timezone.now()
    expected = _by_the_rules(finance, now, filters)
    assert len(expected) >= (3 if filters.overdue else 2)
    if not filters.active:
        # Each kind is there, and some are overdue and some are not.
        assert {kind for kind, _, _ in expected} == {"action", "remedy", "discrepancy"}
        assert {overdue for _, _, overdue in expected} == {True, False}

    assert _walk(finance, now, filters, page_size) == expected


def test_a_page_reads_the_rows_it_shows_and_counts_the_rest(finance: Any, agent_actor: Actor) -> None:
    """Fifty open items and a page of five: the attempts and the rows read are the page's, and
    the statements are as many as for a page of fifty."""
    for _ in range(8):
        unknown(agent_actor)
    now = timezone.now()

    with CaptureQueriesContext(connection) as small:
        five = review_queue_get(user=finance, now=now, page_size=5)
    with CaptureQueriesContext(connection) as large:
        everything = review_queue_get(user=finance, now=now, page_size=50)

    assert [row.pk for row in five.rows] == [row.pk for row in everything.rows][:5]
    assert five.total == everything.total == 8 and five.next_after and not everything.next_after
    assert len(small) == len(large)
    # Each row of the page with what the provider last answered (its latest attempt, read for the page).
    # The clerk reads a sentence; the receiver's own words stay behind the technical details.
    assert all("read timed out" in row.last_answer_technical for row in five.rows), [
        row.last_answer_technical for row in five.rows
    ]
