"""Per-token rate limit: a fixed-window counter in Django's cache.

Why the cache and not a table: the counter is disposable. Losing it resets at most one
window, it must never take part in (or wait for) the transactions that record actions, and
one ``add`` plus one ``incr`` per request is the cheapest shared counter Django offers. It
is only correct across several web processes when the cache is shared by all of them: a
database cache (``django.core.cache.backends.db.DatabaseCache``, on the one database every
process already shares, SQLite or PostgreSQL) or Redis. The per-process local-memory cache
that Django uses when nothing is configured counts each process separately; the alias is
``settings.API_RATE_LIMIT_CACHE`` (default ``"default"``).

On Redis ``incr`` is atomic. On the database cache it is a read followed by a write, so a
burst of parallel requests from one token can slip a few requests past the limit; that is
acceptable for a limit that protects the console's capacity, not money (money is protected
by the invariants, whatever the request rate).

Why a fixed window: one counter per token and minute, and ``Retry-After`` is exact (the
seconds until the window ends). The price is that a client can send up to twice the limit
across a window boundary, which a limit meant to stop runaway loops can live with.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import caches

WINDOW_SECONDS = 60
DEFAULT_PER_MINUTE = 120


@dataclass(frozen=True)
class RateDecision:
    allowed: bool
    limit: int
    count: int
    retry_after: int


def rate_limit_per_minute() -> int:
    return int(getattr(settings, "API_RATE_LIMIT_PER_MINUTE", DEFAULT_PER_MINUTE))


def ratelimit_hit(*, key: str, limit: int | None = None, now: float | None = None) -> RateDecision:
    """Count one request for ``key`` in the current window and say whether it may proceed.

    A limit of 0 or less switches the limit off.
    """
    limit = rate_limit_per_minute() if limit is None else limit
    now = time.time() if now is None else now
    window = int(now // WINDOW_SECONDS)
    retry_after = max(1, math.ceil((window + 1) * WINDOW_SECONDS - now))
    if limit <= 0:
        return RateDecision(allowed=True, limit=limit, count=0, retry_after=retry_after)
    cache = caches[getattr(settings, "API_RATE_LIMIT_CACHE", "default")]
    cache_key = f"api-rate:{key}:{window}"
    # The entry outlives its window a little so that a late incr never finds it expired.
    timeout = WINDOW_SECONDS + 10
    if cache.add(cache_key, 1, timeout=timeout):
        count = 1
    else:
        try:
            count = cache.incr(cache_key)
        except ValueError:
            # Expired between add and incr: this request opens the window again.
            cache.add(cache_key, 1, timeout=timeout)
            count = 1
    return RateDecision(allowed=count <= limit, limit=limit, count=count, retry_after=retry_after)
