"""The review queue stays quick however long the history grows.

A query per row is invisible with five actions in development and a queue that times out after a
year in production. The first tests measure the queue and the detail page with a little history
and again with five times as much, and expect the same query count. The last one fills
PostgreSQL with 200,000 resolved actions and 1,000 open ones and checks that the queue's main
query is served by an index (the partial index over the live statuses), not a scan of the table.
"""

from __future__ import annotations

import time
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from actions.models import Action, Attempt, Remedy
from actions.review import services as finance_services
from actions.review.selectors.common import QUEUE_PAGE_SIZE
from actions.review.selectors.queue import queue_actions_queryset
from actions.services import Actor
from tests.actions.test_finance_services import (
    escalated,
    failed,
    settling,
    stuck_submitting,
    succeeded,
    unknown,
)
from tests.factories import make_order, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_broker(dispatched: list[int]) -> list[int]:
    return dispatched


@pytest.fixture(autouse=True)
def caps_out_of_the_way(settings: Any) -> None:
    """The builders auto-approve every refund for one agent: raise the per-agent cap on
    autonomy (tested in tests/security) so that scale, not the cap, is measured."""
    settings.AUTO_APPROVAL_AGENT_DAILY_AMOUNTS = {"EUR": Decimal("1000000")}


def queries_for(client: Client, url: str) -> tuple[int, str]:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200
    return len(captured.captured_queries), response.content.decode()


def add_history(proposer: Actor, *, resolved: int) -> None:
    """Resolved actions, half succeeded and half failed (with their remedies closed)."""
    for number in range(resolved):
        if number % 2:
            succeeded(proposer)
        else:
            Remedy.objects.filter(action=failed(proposer)).update(status="done")


def add_open_items(proposer: Actor, *, owner: Any) -> None:
    """One of each kind of open item, owned by different people, so every row variant renders."""
    escalated(proposer, owner=owner)
    escalated(proposer)
    unknown(proposer)
    stuck_submitting(proposer)
    settling(proposer)
    failed(proposer)


def test_the_queue_runs_as_many_queries_with_50_resolved_actions_as_with_10(
    client: Client, finance: Any, agent_actor: Actor
) -> None:
    """Invariant 8 at scale: the queue must keep showing everything unresolved, quickly."""
    make_user("felix.finance", "finance")
    client.force_login(finance)
    add_open_items(agent_actor, owner=finance)
    add_history(agent_actor, resolved=10)
    few, _ = queries_for(client, "/review/")

    add_history(agent_actor, resolved=40)
    add_open_items(agent_actor, owner=finance)
    many, page = queries_for(client, "/review/")

    assert Action.objects.filter(status__in=["SUCCEEDED", "FAILED_FINAL"]).count() >= 50
    assert page.count('<tr id="queue-') == 12, "every open item is on the page"
    assert many == few


def test_the_detail_page_runs_as_many_queries_after_many_lookups_as_after_one(
    client: Client, finance: Any, agent_actor: Actor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant 9 at scale: the whole trail stays on the page without a query per line."""
    review = escalated(agent_actor, owner=finance)
    url = reverse("review-action", args=[review.pk])
    client.force_login(finance)

    def add_lookups(count: int) -> None:
        now = timezone.now()
        Attempt.objects.bulk_create(
            Attempt(
                action=review,
                kind="lookup",
                idempotency_key=review.idempotency_key,
                request={"requested_by": finance.username},
                response={"refunds": []},
                outcome="not_found",
                started_at=now,
                finished_at=now,
            )
            for _ in range(count)
        )
        for _ in range(count):
            finance_services.action_assign(action_pk=review.pk, user=finance, owner_pk=felix.pk)
            finance_services.action_assign(action_pk=review.pk, user=felix, owner_pk=finance.pk)

    felix = make_user("felix.finance", "finance")
    add_lookups(1)
    few, _ = queries_for(client, url)
    add_lookups(10)
    many, page = queries_for(client, url)

    assert page.count("<strong>Lookup at the provider</strong>") == 11
    # The trail names each transition in words (actions/plain.py), not by its code name.
    assert page.count("<strong>Assigned to a person in finance</strong>") == 22
    assert many == few


# --- PostgreSQL at scale ---------------------------------------------------------------------

RESOLVED = 200_000
OPEN = 1_000


ACTIONS_SQL = """
INSERT INTO actions_action (
    action_id, kind, idempotency_key, payload, payload_hash, order_id, amount, currency,
    reason_code, evidence, status, rejection_reasons, attempt_count, reconcile_attempts,
    reconcile_failures, provider_reference, created_at, updated_at, status_changed_at,
    lease_expires_at, next_reconcile_at, due_at, first_attempt_at, last_attempt_at
)
SELECT
    'refund:order-scale:request-' || n, 'refund', 'refund:order-scale:request-' || n,
    '{}'::jsonb, 'sha256:scale', %(order_id)s, 10.00, 'EUR', 'damaged', '',
    (%(statuses)s::text[])[1 + n %% cardinality(%(statuses)s::text[])],
    '[]'::jsonb, 1, 0, 0, '', now() - (n || ' seconds')::interval, now(),
    now() - (n || ' seconds')::interval,
    -- Open rows: past their lease (stuck), reconciled in five minutes, due in a day.
    CASE WHEN %(open)s THEN now() - interval '1 hour' END,
    CASE WHEN %(open)s THEN now() + interval '5 minutes' END,
    CASE WHEN %(open)s THEN now() + interval '1 day' END,
    now() - interval '2 hours', now() - interval '2 hours'
FROM generate_series(%(start)s::int, %(stop)s::int) AS n
"""

ATTEMPTS_SQL = """
INSERT INTO actions_attempt (action_id, kind, idempotency_key, request, error, outcome, held_lease,
                             started_at, finished_at)
SELECT a.id, 'submit', a.idempotency_key, '{}'::jsonb,
       '{"type": "AmbiguousError", "message": "read timed out"}'::jsonb, 'unknown', true,
       a.created_at, a.created_at
FROM actions_action a
WHERE a.action_id LIKE 'refund:order-scale:request-%%'
  AND substring(a.action_id from 28)::int BETWEEN %(start)s::int AND %(stop)s::int
"""


def _bulk_actions(*, order_id: int, start: int, count: int, statuses: list[str], open_items: bool) -> None:
    """Insert ``count`` actions (and one attempt each) with INSERT ... SELECT generate_series.

    Plain inserts only: the material-immutability trigger fires on UPDATE, and the audit trail is
    not touched, so the database's own guards are not in the way.
    """
    params: dict[str, Any] = {
        "order_id": order_id,
        "start": start,
        "stop": start + count - 1,
        "statuses": statuses,
        "open": open_items,
    }
    with connection.cursor() as cursor:
        cursor.execute(ACTIONS_SQL, params)
        cursor.execute(ATTEMPTS_SQL, params)


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_queue_uses_an_index_and_a_constant_number_of_queries_over_200000_resolved_actions(
    client: Client, finance: Any, agent_actor: Actor
) -> None:
    """Invariant 8 at scale: 200,000 resolved actions and 1,000 open ones; the queue's main query
    is an index scan over the live statuses and the page's query count does not change."""
    started = time.monotonic()
    client.force_login(finance)
    add_open_items(agent_actor, owner=finance)
    few, _ = queries_for(client, "/review/")

    order = make_order(captured="1000000.00")
    resolved = ["SUCCEEDED", "FAILED_FINAL", "REJECTED", "CANCELLED"]
    _bulk_actions(order_id=order.pk, start=1, count=RESOLVED, statuses=resolved, open_items=False)
    live = ["NEEDS_REVIEW", "UNKNOWN", "SETTLING", "SUBMITTING"]
    _bulk_actions(order_id=order.pk, start=RESOLVED + 1, count=OPEN, statuses=live, open_items=True)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE actions_action")
        cursor.execute("ANALYZE actions_attempt")
    assert Action.objects.count() >= RESOLVED + OPEN

    plan = queue_actions_queryset(now=timezone.now()).explain()

    assert "Seq Scan on actions_action" not in plan, plan
    assert "action_live_idx" in plan or "Index" in plan, plan
    many, page = queries_for(client, "/review/")
    assert many == few
    assert page.count('<tr id="queue-') == QUEUE_PAGE_SIZE
    assert f"Items 1 to {QUEUE_PAGE_SIZE} of {OPEN + 6}, most urgent first" in page
    assert time.monotonic() - started < 60, "the scale check should stay under a minute"
