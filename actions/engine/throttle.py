"""Per-receiver rate limits: a token bucket in front of each receiver, and its Retry-After honoured.

Why: a burst of approvals (a manager approving a page, a sweep after an outage) would otherwise
hit the receiver all at once. Each 429 is an unclear answer (it proves nothing either way), so it
becomes UNKNOWN and a reconciliation, which calls the receiver again: a burst would turn into a
wave. So a dispatch first takes a token from its receiver's bucket, *before* the claim: an
action that must wait stays AUTHORIZED, holds no lease, and its dispatch is published again for
when the bucket refills. A 429 that says how long to wait (Retry-After) empties the receiver's
bucket for that long, for every worker, and the action's reconciliation is not due before it.

The bucket is the `limits` library's moving window (what Flask-Limiter and SlowAPI use), kept in
Redis when the broker is Redis (shared by every worker process, updated atomically by its Lua
scripts) and in memory otherwise (the embedded default runs one worker). Limits come from
settings.RECEIVER_RATE_LIMITS, per receiver name (``ReceiverContract.receiver``); a receiver
with none is never throttled, and then nothing here costs a statement or a round trip.

If the bucket's store cannot be reached, dispatch goes on unthrottled (logged): a rate limit is
an optimisation of the receiver's load, never a reason to stop moving actions.
"""

from __future__ import annotations

import logging
import math
import time
from functools import lru_cache

from django.conf import settings
from limits import RateLimitItem, parse
from limits.storage import Storage, storage_from_string
from limits.strategies import MovingWindowRateLimiter

from actions.kinds import kind_for
from actions.models import Action

log = logging.getLogger(__name__)

NAMESPACE = "receiver"
PAUSE_NAMESPACE = "receiver-pause"
# The shortest wait handed back: a dispatch published again sooner would only be throttled again.
MIN_WAIT_SECONDS = 0.05


@lru_cache(maxsize=8)
def _storage(uri: str) -> Storage:
    storage = storage_from_string(uri)
    assert isinstance(storage, Storage), "a synchronous store (memory:// or redis://)"
    return storage


@lru_cache(maxsize=32)
def _rate(text: str) -> RateLimitItem:
    return parse(text)


def _limiter() -> MovingWindowRateLimiter:
    return MovingWindowRateLimiter(_storage(settings.RECEIVER_RATE_LIMIT_STORAGE))


def throttling_enabled() -> bool:
    return bool(settings.RECEIVER_RATE_LIMITS)


def _pause_key(receiver: str) -> str:
    return f"{PAUSE_NAMESPACE}/{receiver}"


def throttle_wait(receiver: str) -> float:
    """Take one call's token from ``receiver``'s bucket. Returns 0 if the call may start now,
    otherwise the seconds to wait (nothing was taken)."""
    limit = settings.RECEIVER_RATE_LIMITS.get(receiver)
    if not limit:
        return 0.0
    try:
        storage = _storage(settings.RECEIVER_RATE_LIMIT_STORAGE)
        pause_key = _pause_key(receiver)
        if storage.get(pause_key) > 0:
            return max(storage.get_expiry(pause_key) - time.time(), MIN_WAIT_SECONDS)
        item = _rate(limit)
        limiter = _limiter()
        if limiter.hit(item, NAMESPACE, receiver):
            return 0.0
        stats = limiter.get_window_stats(item, NAMESPACE, receiver)
        return max(stats.reset_time - time.time(), MIN_WAIT_SECONDS)
    except Exception:  # the store is down: see the module's docstring
        log.warning("rate limit store unreachable; dispatching %s unthrottled", receiver, exc_info=True)
        return 0.0


def throttle_pause(receiver: str, seconds: float) -> None:
    """The receiver said to wait ``seconds`` (Retry-After): no call to it starts before then."""
    if not throttling_enabled() or seconds <= 0:
        return
    try:
        _storage(settings.RECEIVER_RATE_LIMIT_STORAGE).incr(_pause_key(receiver), expiry=math.ceil(seconds))
    except Exception:
        log.warning("rate limit store unreachable; Retry-After of %s not shared", receiver, exc_info=True)


def dispatch_wait(*, action_pk: int) -> float:
    """How long the dispatch of this action must wait for its receiver's bucket (0: go now).
    Reads the action's kind only when some receiver has a limit."""
    if not throttling_enabled():
        return 0.0
    kind = Action.objects.filter(pk=action_pk).values_list("kind", flat=True).first()
    if kind is None:
        return 0.0  # the claim reports the missing action
    return throttle_wait(kind_for(kind).contract().receiver)


__all__ = ["dispatch_wait", "throttle_pause", "throttle_wait", "throttling_enabled"]
