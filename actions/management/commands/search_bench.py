"""Build a large actions table fast and show how the console's search runs on it.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/console_search_bench \\
        .venv/bin/python manage.py migrate
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/console_search_bench \\
        .venv/bin/python manage.py search_bench --actions 1000000

Use a database of its own: the rows are invented (orders "B<tag>-n", customers, refunds with
``re_`` references) and are not removed afterwards (``--build-only`` / ``--explain-only`` split
the two halves). The rows go in with INSERT ... SELECT generate_series, a few seconds per 100,000;
then ANALYZE, then EXPLAIN (ANALYZE, BUFFERS) of each query ``actions.search`` runs, for a
customer's email, a provider reference, an order number, an action id and a ticket-like term.
PostgreSQL only: on SQLite there is no plan worth reading (and no trigram index).
"""

from __future__ import annotations

import time
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from actions.search import SECTION_LIMIT, matching_bills, matching_orders, matching_requests, search, search_actions

FIRST = [
    "Ada",
    "Alan",
    "Grace",
    "Edsger",
    "Barbara",
    "Katherine",
    "Donald",
    "Margaret",
    "Frances",
    "John",
    "Radia",
    "Leslie",
    "Ken",
    "Sophie",
    "Dennis",
    "Adele",
    "Jean",
    "Tim",
    "Linus",
    "Guido",
]
LAST = [
    "Lovelace",
    "Turing",
    "Hopper",
    "Dijkstra",
    "Liskov",
    "Johnson",
    "Knuth",
    "Hamilton",
    "Allen",
    "Backus",
    "Perlman",
    "Lamport",
    "Thompson",
    "Wilson",
    "Ritchie",
    "Goldberg",
    "Sammet",
    "Berners",
    "Torvalds",
    "Rossum",
]

ORDERS_SQL = """
INSERT INTO actions_order (number, customer_name, customer_email, currency, captured_amount, refunded_amount,
                           reserved_amount, outside_refunded_amount, version, charge_reference, paid_at, created_at)
SELECT %(prefix)s || n,
       (%(first)s::text[])[1 + n %% 20] || ' ' || (%(last)s::text[])[1 + (n / 20) %% 20],
       lower((%(first)s::text[])[1 + n %% 20]) || '.' || lower((%(last)s::text[])[1 + (n / 20) %% 20])
           || n || '@example.com',
       'EUR', 1000.00, 0, 0, 0, 1, 'ch_' || substr(md5(%(prefix)s || 'ch' || n), 1, 24),
       now() - (n || ' minutes')::interval, now()
FROM generate_series(1, %(orders)s::int) AS n
"""

# Four in five actions succeeded and carry the provider's refund id; the rest are spread over the
# other statuses with no reference. Each order gets actions in turn (action n on order 1 + n % orders).
ACTIONS_SQL = """
INSERT INTO actions_action (
    action_id, kind, idempotency_key, payload, payload_hash, order_id, amount, currency,
    reason_code, evidence, status, rejection_reasons, attempt_count, reconcile_attempts,
    reconcile_failures, provider_reference, created_at, updated_at, status_changed_at
)
SELECT 'refund:order-' || o.number || ':request-' || n, 'refund', 'refund:order-' || o.number || ':request-' || n,
       '{}'::jsonb, 'sha256:bench', o.id, 10.00, 'EUR', 'damaged', '',
       CASE WHEN n %% 5 = 0 THEN (ARRAY['PROPOSED','REJECTED','FAILED_FINAL','CANCELLED','STALE'])[1 + (n / 5) %% 5]
            ELSE 'SUCCEEDED' END,
       '[]'::jsonb, 1, 0, 0,
       CASE WHEN n %% 5 = 0 THEN '' ELSE 're_' || substr(md5(%(prefix)s || 're' || n), 1, 24) END,
       now() - (n || ' seconds')::interval, now(), now() - (n || ' seconds')::interval
FROM generate_series(%(start)s::int, %(stop)s::int) AS n
JOIN actions_order o ON o.number = %(prefix)s || (1 + n %% %(orders)s::int)
"""


def bulk_build(*, actions: int, orders: int, tag: str, batch: int = 250_000) -> None:
    """Insert ``orders`` orders and ``actions`` actions named after ``tag``, then ANALYZE."""
    prefix = f"B{tag}-"
    with connection.cursor() as cursor:
        cursor.execute(ORDERS_SQL, {"prefix": prefix, "orders": orders, "first": FIRST, "last": LAST})
        for start in range(1, actions + 1, batch):
            stop = min(start + batch - 1, actions)
            cursor.execute(ACTIONS_SQL, {"prefix": prefix, "start": start, "stop": stop, "orders": orders})
        cursor.execute("ANALYZE actions_order")
        cursor.execute("ANALYZE actions_action")


def sample_terms(tag: str, order: int = 4822) -> list[tuple[str, str]]:
    """One real term of each kind from the built rows (order ``order``): (what it is, the term)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT a.action_id, a.provider_reference, o.number, o.customer_email, o.charge_reference "
            "FROM actions_action a JOIN actions_order o ON o.id = a.order_id "
            "WHERE o.number = %s AND a.provider_reference <> '' ORDER BY a.id LIMIT 1",
            [f"B{tag}-{order}"],
        )
        row = cursor.fetchone()
    if row is None:
        raise CommandError(f"No built rows for tag {tag!r}: run without --explain-only first.")
    action_id, reference, number, email, charge = row
    return [
        ("customer email", email),
        ("refund reference (re_...)", reference),
        ("order number", number),
        ("action id", action_id),
        ("charge reference (ch_...)", charge),
        ("customer name, common: many matches", "Grace Hopper"),
    ]


def explain(sql: str, params: Any) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", params)
        return "\n".join(line for (line,) in cursor.fetchall())


class Command(BaseCommand):
    help = "Build many actions with generate_series and print the EXPLAIN ANALYZE of the console's search."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--actions", type=int, default=1_000_000)
        parser.add_argument("--orders", type=int, default=0, help="default: a quarter of --actions")
        parser.add_argument("--tag", default="bench", help="names the built rows (orders B<tag>-1...)")
        parser.add_argument("--build-only", action="store_true")
        parser.add_argument("--explain-only", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        if connection.vendor != "postgresql":
            raise CommandError("search_bench needs PostgreSQL (DATABASE_URL=postgres://...): the plan is the point.")
        tag = options["tag"]
        if not options["explain_only"]:
            orders = options["orders"] or max(1, options["actions"] // 4)
            started = time.monotonic()
            bulk_build(actions=options["actions"], orders=orders, tag=tag)
            self.stdout.write(
                f"Built {options['actions']:,} actions on {orders:,} orders in {time.monotonic() - started:.1f} s."
            )
        if options["build_only"]:
            return
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM actions_action")
            total = cursor.fetchone()[0]
            cursor.execute("SELECT version()")
            version = cursor.fetchone()[0]
        self.stdout.write(f"{version}\nactions_action: {total:,} rows\n")
        for what, term in sample_terms(tag):
            self.stdout.write(f"\n=== {what}: {term!r}")
            # Each query the search runs for this term, as actions.search builds it.
            parts = [
                ("orders (matching_orders)", matching_orders(term).order_by().values_list("pk", flat=True)[:200]),
                ("tickets (matching_requests)", matching_requests(term).order_by().values_list("pk", flat=True)[:200]),
                ("bills (matching_bills)", matching_bills(term).order_by().values_list("pk", flat=True)[:200]),
                ("actions, newest first, one page (search_actions)",
                 search_actions(term).order_by("-created_at", "-pk")[: SECTION_LIMIT + 1]),
            ]  # fmt: skip
            for label, queryset in parts:
                try:
                    sql, params = queryset.query.sql_with_params()
                except EmptyResultSet:
                    self.stdout.write(f"-- {label}: not queried for this kind of term")
                    continue
                self.stdout.write(f"-- {label}")
                self.stdout.write(explain(sql, params))
            started = time.monotonic()
            results = search(user=_Everyone(), raw=term)
            self.stdout.write(
                f"-- the whole search (actions.search.search, every query, as the page runs it): "
                f"{(time.monotonic() - started) * 1000:.1f} ms, {len(results.actions)} actions"
                f"{' (more)' if results.more_actions else ''}, {len(results.orders)} orders"
            )


class _Everyone:
    """A reader who may see everything (the search's widest case)."""

    def has_perm(self, name: str) -> bool:
        return True
