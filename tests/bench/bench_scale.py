"""The review queue and the search at 10,000 and at 1,000,000 actions, side by side (P-e).

    python -m tests.bench.bench_scale                      # 10k beside 1M, 7 timings each
    python -m tests.bench.bench_scale --large 200000       # a quicker look

Not a pytest test: it measures and prints. It exits non-zero only when the run went wrong (a page
that did not answer 200, a search that found nothing it should have found).

Two databases, made with Django's test database machinery (migrated) and filled by
``search_bench``'s bulk builder (INSERT ... SELECT generate_series, invented customers, four in
five refunds SUCCEEDED): one with ``--small`` actions, the other built the same way to
``--small`` and then grown with history to ``--large``, each VACUUMed and ANALYZEd. Both sizes
are then measured side by side by one process on one PostgreSQL: each timed request at one size
is followed by the same request at the other (the order alternating, ABBA), so a change in the
machine's load falls on both halves of a ratio alike. (Until 5 December 2026 one database was
measured, grown, and measured again minutes later, and the ratios of one page swung by 0.3 to 0.7
between runs of the same code.) Then both databases are dropped.

The work waiting for people is the same at both sizes: the small build leaves one action in 100
waiting for a person (NEEDS_REVIEW, half of them owned by the clerk) and one in 200 UNKNOWN, 150
live rows at 10k, more than the queue's first page; the growth adds history only (resolved,
rejected, stale...), a quarter of whose succeeded refunds stay the clerk's, as resolving keeps
the owner. That is the question P-e asks: does the console slow down as the history
grows? (A queue whose live rows grow with the history is slower because it shows more, which
is a question for the people working it, not for an index.)

Measured, per page and size, through Django's test client as a logged-in finance clerk (the
whole request: middleware, queries, template; one clerk and client per database): the wall time
of ``--repeat`` requests after one warm-up, printed as min and median, and the number of SQL
statements of one request. The ratio column is median at the large size / median at the small
size; the issue's bar is 1.2, with the same statement count at both sizes. The database column
is the median time of a request's SQL statements alone.

The search terms are taken from the small build (an order placed early on): a customer's email,
a refund's provider reference, an order number, an action id, two common customer names, and part
of one (the trigram indexes). A whole name goes by the exact lookup's btree:
- "Maria Garcia", the commonest name (one order in 37 at both sizes, as real names are spread),
  fills the page's sections at both sizes: the same rows shown, more history behind them;
- "Grace Hopper" (one order in 400) has 7 orders and 28 actions at 10k and fills the sections
  (50 and 50) only at 1M: that page shows about three times the rows at 1M, so its ratio measures
  the page growing to its limit as well as the history.
The rows each page shows (every table row of its bodies) are printed beside its times, and a page
over the bar whose rows differ between the sizes says so.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlencode

LIVE_SQL = """
UPDATE actions_action SET status = CASE WHEN id %% 200 = 7 THEN 'UNKNOWN' ELSE 'NEEDS_REVIEW' END,
       owner_id = CASE WHEN (id / 100) %% 2 = 0 THEN %(owner)s ELSE NULL END,
       next_reconcile_at = CASE WHEN id %% 200 = 7 THEN now() + interval '1 hour' ELSE NULL END,
       due_at = now() + interval '1 day'
WHERE id %% 100 = 3 OR id %% 200 = 7
"""
# (The live rows' ids are all odd, so owning by "id % 2" would give the clerk none of them and
# "mine" would time an empty page: every other hundred is the clerk's instead.)

# The commonest name, on one order in 37 of each build (the ids of an order's customer are spread
# over the name's every 400th order otherwise; see search_bench.ORDERS_SQL).
COMMONEST_NAME = "Maria Garcia"
COMMONEST_NAME_SQL = """
UPDATE actions_order SET customer_name = %(name)s WHERE number LIKE %(prefix)s AND id %% 37 = 11
"""

# Resolving keeps the owner: a quarter of the succeeded history is the clerk's, at both sizes,
# so "mine" and the owner counts are measured against an owned history that grows.
OWNED_HISTORY_SQL = """
UPDATE actions_action SET owner_id = %(owner)s WHERE status = 'SUCCEEDED' AND owner_id IS NULL AND id %% 4 = 1
"""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--small", type=int, default=10_000, help="actions at the first size (default 10,000)")
    parser.add_argument("--large", type=int, default=1_000_000, help="actions at the second size (default 1M)")
    parser.add_argument("--repeat", type=int, default=7, help="timed requests per page and size (default 7)")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
        help="a PostgreSQL server; the benchmark creates and drops a database of its own on it",
    )
    args = parser.parse_args(argv)
    if args.large <= args.small:
        parser.error("--large must be more actions than --small")
    return args


def configure_django(args: argparse.Namespace, workdir: str) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "console.settings"
    os.environ["DATABASE_URL"] = args.database_url
    os.environ["DATABASE_POOL"] = "0"
    os.environ["DATABASE_TEST_NAME"] = f"bench_scale_{os.getpid()}"
    os.environ["CONSOLE_DATA_DIR"] = workdir
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    import django

    django.setup()


def build(*, upto: int, tag: str, owner_pk: int, live: bool) -> float:
    """Add actions until the table holds ``upto`` (leaving the live rows among them if ``live``);
    returns the seconds it took."""
    from django.db import connection

    from actions.management.commands.search_bench import bulk_build

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM actions_action")
        (count,) = cursor.fetchone()
    started = time.monotonic()
    missing = upto - count
    if missing > 0:
        bulk_build(actions=missing, orders=max(1, missing // 4), tag=tag)
        with connection.cursor() as cursor:
            cursor.execute(COMMONEST_NAME_SQL, {"name": COMMONEST_NAME, "prefix": f"B{tag}-%"})
            if live:
                cursor.execute(LIVE_SQL, {"owner": owner_pk})
            cursor.execute(OWNED_HISTORY_SQL, {"owner": owner_pk})
            # VACUUM as well as ANALYZE: after a bulk insert autovacuum would otherwise start on
            # its own during the timed requests, and the trigram GIN indexes keep the new rows
            # in their unsorted pending list until a vacuum merges it. A table in service has
            # been vacuumed; the measurement should not include its first vacuum.
            cursor.execute("VACUUM (ANALYZE) actions_action")
            cursor.execute("VACUUM (ANALYZE) actions_order")
    return time.monotonic() - started


def pages(tag: str) -> list[tuple[str, str]]:
    """(label, path) of each measured page, with terms from the small build."""
    from django.urls import reverse

    from actions.management.commands.search_bench import sample_terms

    terms = dict(sample_terms(tag, order=42))
    search = reverse("search")
    return [
        ("review queue, first page", reverse("review-queue")),
        ("review queue, needs review only", reverse("review-queue") + "?" + urlencode({"state": "NEEDS_REVIEW"})),
        ("review queue, mine", reverse("review-queue") + "?" + urlencode({"mine": "1"})),
        ("search: customer email", f"{search}?{urlencode({'q': terms['customer email']})}"),
        ("search: refund reference", f"{search}?{urlencode({'q': terms['refund reference (re_...)']})}"),
        ("search: order number", f"{search}?{urlencode({'q': terms['order number']})}"),
        ("search: action id", f"{search}?{urlencode({'q': terms['action id']})}"),
        ("search: commonest name, a full page at both sizes", f"{search}?{urlencode({'q': COMMONEST_NAME})}"),
        ("search: common name, a full page at 1M only", f"{search}?{urlencode({'q': 'Grace Hopper'})}"),
        # Part of a name: the trigram indexes, whose cost grows with the rows sharing it.
        ("search: part of a common name", f"{search}?{urlencode({'q': 'Hopper'})}"),
    ]


class StatementLog:
    """Every SQL statement a request sends, with its time (an execute wrapper: Django's own query
    log is reset at each request's start, so it cannot count a whole request)."""

    def __init__(self) -> None:
        self.statements: list[tuple[float, str]] = []

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.statements.append(((time.perf_counter() - started) * 1000, sql))


Measured = tuple[float, float, int, list[tuple[float, str]], float, int]

TABLE_BODY = re.compile(r"<tbody>(.*?)</tbody>", re.DOTALL)


def rows_shown(html: str) -> int:
    """The table rows a page shows: every ``<tr`` inside a ``<tbody>`` (headers are not rows)."""
    return sum(body.count("<tr") for body in TABLE_BODY.findall(html))


class Size:
    """One of the two databases: its size, a connection of its own, and a client logged in to
    it as the clerk."""

    def __init__(self, actions: int, connection: Any, client: Any) -> None:
        self.actions = actions
        self.connection = connection
        self.client = client


def use(size: Size) -> None:
    """Make ``size``'s connection Django's default one, connected before any timing starts. Each
    database keeps its own open connection, as a server's process does: a new connection at
    every switch would time a cold backend (its catalog caches empty) at every request."""
    from django.db import connections

    connections["default"] = size.connection
    size.connection.ensure_connection()


def measure(sizes: Sequence[Size], path: str, repeat: int) -> dict[int, Measured]:
    """For each size: (min ms, median ms, statements of one request, the slowest three
    statements of it, the median ms of a request's statements, the rows the page shows).

    One warm-up request at each size (whose statements and rows are the ones counted), then
    ``repeat`` rounds of one timed request at each size, the first size alternating from round
    to round. The database's share is the part an index changes. The rest is Python (middleware,
    the view, the template), which on a shared machine is what another process's load slows
    down most: the alternation gives both sizes the same share of that."""
    from django.db import connection

    first: dict[int, tuple[StatementLog, str]] = {}
    for size in sizes:
        use(size)
        log = StatementLog()
        with connection.execute_wrapper(log):
            response = size.client.get(path)
        if response.status_code != 200:
            raise SystemExit(f"{path} answered {response.status_code} at {size.actions:,} actions")
        first[size.actions] = (log, response.content.decode())
    times: dict[int, list[float]] = {size.actions: [] for size in sizes}
    database: dict[int, list[float]] = {size.actions: [] for size in sizes}
    for round_number in range(repeat):
        for size in sizes if round_number % 2 == 0 else list(reversed(sizes)):
            use(size)
            timed = StatementLog()
            with connection.execute_wrapper(timed):
                started = time.perf_counter()
                size.client.get(path)
                times[size.actions].append((time.perf_counter() - started) * 1000)
            database[size.actions].append(sum(ms for ms, _ in timed.statements))
    measured = {}
    for size in sizes:
        log, html = first[size.actions]
        measured[size.actions] = (
            min(times[size.actions]),
            statistics.median(times[size.actions]),
            len(log.statements),
            sorted(log.statements, reverse=True)[:3],
            statistics.median(database[size.actions]),
            rows_shown(html),
        )
    return measured


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="bench-scale-")
    configure_django(args, workdir)

    from django.contrib.auth.models import Group
    from django.db import connection, connections
    from django.test import Client

    from tests.factories import make_user

    original_name = connection.settings_dict["NAME"]
    blank = copy.deepcopy(connections["default"].settings_dict)
    sizes: list[Size] = []
    try:
        built = {}
        for actions in (args.small, args.large):
            # A connection of its own for each database (see ``use``).
            own = type(connections["default"])(copy.deepcopy(blank), "default")
            own.settings_dict.setdefault("TEST", {})["NAME"] = f"bench_scale_{os.getpid()}_{actions}"
            connections["default"] = own
            own.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
            sizes.append(Size(actions, own, Client()))
            clerk = make_user("bench-finance", "finance")
            assert Group.objects.filter(name="finance", user=clerk).exists()
            sizes[-1].client.force_login(clerk)
            # The same small build in both, the large one then grown with history only.
            built[actions] = build(upto=args.small, tag="s", owner_pk=clerk.pk, live=True)
            if actions > args.small:
                built[actions] += build(upto=actions, tag="l", owner_pk=clerk.pk, live=False)
        built_small, built_large = built[args.small], built[args.large]

        measured: dict[str, dict[int, Measured]] = {}
        page_list = pages("s")
        for label, path in page_list:
            measured[label] = measure(sizes, path, args.repeat)

        use(sizes[-1])
        with connection.cursor() as cursor:
            cursor.execute("SELECT status, count(*) FROM actions_action GROUP BY status ORDER BY status")
            states = ", ".join(f"{status} {count:,}" for status, count in cursor.fetchall())
            cursor.execute("SELECT version()")
            version = cursor.fetchone()[0]
        print(
            f"{version.split(' on ')[0]}; built {args.small:,} in {built_small:.1f} s and {args.large:,} in "
            f"{built_large:.1f} s; {args.repeat} timed requests per cell after one warm-up, the sizes alternating"
        )
        print(f"states at {args.large:,}: {states}\n")
        small, large = f"{args.small // 1000}k", f"{args.large // 1000}k" if args.large < 1_000_000 else "1M"
        if args.large >= 1_000_000 and args.large % 1_000_000 == 0:
            large = f"{args.large // 1_000_000}M"
        header = (
            f"| page | {small} min / median ms | {large} min / median ms | ratio {large} / {small} "
            f"(median) | statements {small} / {large} | database ms {small} / {large} (median) "
            f"| rows shown {small} / {large} |"
        )
        print(header)
        print("|---|---|---|---|---|---|---|")
        problems = []
        for label, by_size in measured.items():
            s_min, s_med, s_q, _, s_db, s_rows = by_size[args.small]
            l_min, l_med, l_q, _, l_db, l_rows = by_size[args.large]
            ratio = l_med / s_med if s_med else float("inf")
            print(
                f"| {label} | {s_min:.1f} / {s_med:.1f} | {l_min:.1f} / {l_med:.1f} | {ratio:.2f} | {s_q} / {l_q} "
                f"| {s_db:.1f} / {l_db:.1f} | {s_rows} / {l_rows} |"
            )
            if ratio > 1.2 or s_q != l_q:
                problems.append(label)
        print()
        named = []
        for label in problems:
            s_rows, l_rows = measured[label][args.small][5], measured[label][args.large][5]
            shows_more = f" (shows {s_rows} rows at {small}, {l_rows} at {large})" if s_rows != l_rows else ""
            named.append(label + shows_more)
        print("over the bar (ratio > 1.2 or a statement count that grew): " + ("; ".join(named) or "none"))
        for label in problems:
            print(f"\n{label}: its slowest statements at {large}")
            for ms, sql in measured[label][args.large][3]:
                print(f"  {ms:7.1f} ms  {sql[:400]}")
        return 0
    finally:
        for size in sizes:
            size.connection.close()
        for size in sizes:
            connections["default"] = size.connection
            size.connection.creation.destroy_test_db(original_name, verbosity=0)


if __name__ == "__main__":
    sys.exit(main())
