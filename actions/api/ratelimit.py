"""Request rate limits of the agent API: fixed-window counters, counted atomically.

Per token (``API_RATE_LIMIT_PER_MINUTE``) for authenticated requests, and per client address
(``API_ANONYMOUS_RATE_LIMIT_PER_MINUTE``) for every request before it is authenticated, so
that guessing tokens or hammering the public documents is limited too.

Why a table and one upsert: the count must hold under a parallel burst. The earlier counter in
Django's database cache was a read followed by a write, and 400 parallel requests of one token
against a limit of 120 got 398 answers of 200 (lost updates). Here every request is one
statement, ``INSERT ... ON CONFLICT (key, window) DO UPDATE SET count = count + 1 RETURNING
count``, which PostgreSQL and SQLite both run atomically: no two requests read the same count.
It runs in its own autocommit statement, outside the transactions that record actions, and
never waits on them.

Why a fixed window: one row per key and minute, and ``Retry-After`` is exact (the seconds until
the window ends). A client can send up to twice the limit across a window boundary, which a
limit meant to stop runaway loops and guessing can live with. Rows of past windows are deleted
when a key opens a new window.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from django.conf import settings
from django.db import connection

from actions.models import AgentToken, RateCounter

WINDOW_SECONDS = 60
DEFAULT_PER_MINUTE = 120
DEFAULT_ANONYMOUS_PER_MINUTE = 60


@dataclass(frozen=True)
class RateDecision:
    allowed: bool
    limit: int
    count: int
    retry_after: int


def rate_limit_per_minute() -> int:
    return int(getattr(settings, "API_RATE_LIMIT_PER_MINUTE", DEFAULT_PER_MINUTE))


def anonymous_rate_limit_per_minute() -> int:
    return int(getattr(settings, "API_ANONYMOUS_RATE_LIMIT_PER_MINUTE", DEFAULT_ANONYMOUS_PER_MINUTE))


def _increment(key: str, window: int) -> int:
    table = connection.ops.quote_name(RateCounter._meta.db_table)
    # "window" is a reserved word in PostgreSQL: every column name is quoted.
    key_col, window_col, count_col = (connection.ops.quote_name(name) for name in ("key", "window", "count"))
    sql = (
        f"INSERT INTO {table} ({key_col}, {window_col}, {count_col}) VALUES (%s, %s, 1) "  # noqa: S608 (names only)
        f"ON CONFLICT ({key_col}, {window_col}) DO UPDATE SET {count_col} = {table}.{count_col} + 1 "
        f"RETURNING {count_col}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [key, window])
        row = cursor.fetchone()
    count = int(row[0]) if row else 1
    if count == 1:
        # The first request of a new window clears this key's old windows.
        RateCounter.objects.filter(key=key, window__lt=window).delete()
    return count


def ratelimit_hit(*, key: str, limit: int | None = None, now: float | None = None) -> RateDecision:
    """Count one request for ``key`` in the current window and say whether it may proceed.

    A limit of 0 or less switches the limit off (and counts nothing).
    """
    limit = rate_limit_per_minute() if limit is None else limit
    now = time.time() if now is None else now
    window = int(now // WINDOW_SECONDS)
    retry_after = max(1, math.ceil((window + 1) * WINDOW_SECONDS - now))
    if limit <= 0:
        return RateDecision(allowed=True, limit=limit, count=0, retry_after=retry_after)
    count = _increment(key[:100], window)
    return RateDecision(allowed=count <= limit, limit=limit, count=count, retry_after=retry_after)


def token_ratelimit_hit(token: AgentToken) -> RateDecision:
    """Count one call on the token's budget: one budget per token, whether the agent calls the
    HTTP API or the MCP server."""
    return ratelimit_hit(key=f"token:{token.pk}")
