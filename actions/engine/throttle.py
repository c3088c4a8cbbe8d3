"""Per-receiver rate limits: a token bucket in front of each receiver, and its Retry-After honoured.

Why: a burst of approvals (a manager approving a page, a sweep after an outage) would otherwise
hit the receiver all at once. Each 429 is an unclear answer (it proves nothing either way), so it
becomes UNKNOWN and a reconciliation, which calls the receiver again: a burst would turn into a
wave. So a dispatch first takes a token from its receiver's bucket, *before* the claim: an
action that must wait stays AUTHORIZED, holds no lease, and its dispatch is published again for
when the bucket refills. A 429 that says how long to wait (Retry-After) empties the receiver's
bucket for that long, for every worker, and the action's reconciliation is not due before it.

The bucket is the `limits` library's moving window (what Flask-Limiter and SlowAPI use), kept in
a store that every worker process on every host shares (Redis: updated atomically by its Lua
scripts). Limits come from settings.RECEIVER_RATE_LIMITS, per receiver name
(``ReceiverContract.receiver``); a receiver with none is never throttled, and then nothing here
costs a statement or a round trip. With limits set, the store must be shared: a per-process
store (``memory://``) would give every process the whole limit, so `manage.py check` refuses it
(console.E008).

If the store cannot be reached, dispatches to a limited receiver are held, not sent unthrottled:
the action stays AUTHORIZED with no lease and its dispatch comes back after a short wait, as if
its bucket were empty. A limit exists because the receiver punishes bursts (429s become UNKNOWN
actions and reconciliations); dropping it the moment the store blinks would send the burst it
is there to prevent. A store that hangs rather than refuses costs at most one short timeout:
its calls time out after STORE_TIMEOUT_SECONDS with no retry, and after a failure the store is
left alone for STORE_BACKOFF_SECONDS, every dispatch in that time held without waiting on it.

Reconciliation's lookups take tokens from the same bucket, also before their claim
(``reconcile_wait``): after an outage, hundreds of UNKNOWN actions fall due at once, and their
lookups would otherwise be the very burst the limit is there to prevent. A lookup that must wait
keeps its published mark and its task is published again. A receiver's 429 on a lookup also
holds that action's next lookup until its Retry-After (actions.engine.reconcile). What is not
throttled: the resend that follows a lookup's authoritative not-found within the same pass (it
rides on the lookup's token; at most one per action per lease).
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache

from django.conf import settings
from django.db import transaction
from limits import RateLimitItem, parse
from limits.storage import Storage, storage_from_string
from limits.strategies import MovingWindowRateLimiter

from actions.kinds import kind_for
from actions.models import Action, ActionStatus

log = logging.getLogger(__name__)

NAMESPACE = "receiver"
PAUSE_NAMESPACE = "receiver-pause"
# The shortest wait handed back: a dispatch published again sooner would only be throttled again.
MIN_WAIT_SECONDS = 0.05
# A call to the store gives up after this long, with no retry (redis-py would otherwise wait 5 s
# and retry), and a store that failed is not tried again for a while.
STORE_TIMEOUT_SECONDS = 0.25
STORE_BACKOFF_SECONDS = 5.0
_store_down_until = 0.0
_store_lock = threading.Lock()


@lru_cache(maxsize=8)
def _storage(uri: str) -> Storage:
    options: dict[str, object] = {}
    if uri.startswith(("redis://", "rediss://")):
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        options = {
            "socket_timeout": STORE_TIMEOUT_SECONDS,
            "socket_connect_timeout": STORE_TIMEOUT_SECONDS,
            "retry": Retry(NoBackoff(), 0),
        }
    storage = storage_from_string(uri, **options)  # type: ignore[arg-type]
    assert isinstance(storage, Storage), "a synchronous store (memory:// or redis://)"
    return storage


def _store_available() -> bool:
    return time.monotonic() >= _store_down_until


def _store_hold() -> float:
    """How long a call to a limited receiver waits while the store is down."""
    return max(_store_down_until - time.monotonic(), MIN_WAIT_SECONDS)


def _store_failed(what: str) -> None:
    global _store_down_until
    with _store_lock:
        _store_down_until = time.monotonic() + STORE_BACKOFF_SECONDS
    log.warning(
        "rate limit store unreachable (%s); holding limited dispatches for %.0f s",
        what,
        STORE_BACKOFF_SECONDS,
        exc_info=True,
    )


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
    if not _store_available():
        return _store_hold()
    try:
        item = _rate(limit)
    except ValueError:
        # `manage.py check` names it (console.E004); a worker does not run the checks, so it
        # dispatches unthrottled rather than failing every dispatch.
        log.error("RECEIVER_RATE_LIMITS: cannot read %s=%r; %s is not throttled", receiver, limit, receiver)
        return 0.0
    try:
        storage = _storage(settings.RECEIVER_RATE_LIMIT_STORAGE)
        pause_key = _pause_key(receiver)
        if storage.get(pause_key) > 0:
            return max(storage.get_expiry(pause_key) - time.time(), MIN_WAIT_SECONDS)
        limiter = _limiter()
        if limiter.hit(item, NAMESPACE, receiver):
            return 0.0
        stats = limiter.get_window_stats(item, NAMESPACE, receiver)
        return max(stats.reset_time - time.time(), MIN_WAIT_SECONDS)
    except Exception:  # the store is down: hold, see the module's docstring
        _store_failed(receiver)
        return _store_hold()


def throttle_pause(receiver: str, seconds: float) -> None:
    """The receiver said to wait ``seconds`` (Retry-After): no call to it starts before then.
    Called inside the transaction that records the answer, so the store is written only once it
    commits: the row lock is never held across a call to the store."""
    if not throttling_enabled() or seconds <= 0:
        return
    transaction.on_commit(lambda: _pause_now(receiver, seconds))


def _pause_now(receiver: str, seconds: float) -> None:
    if not _store_available():
        return
    try:
        storage = _storage(settings.RECEIVER_RATE_LIMIT_STORAGE)
        key = _pause_key(receiver)
        until = time.time() + seconds
        # A later, longer Retry-After extends the pause; a shorter one never shortens it.
        if storage.get(key) > 0 and storage.get_expiry(key) >= until:
            return
        storage.clear(key)
        storage.incr(key, expiry=math.ceil(seconds))
    except Exception:
        _store_failed(receiver)


def dispatch_wait(*, action_pk: int) -> float:
    """How long the dispatch of this action must wait for its receiver's bucket (0: go now).
    Reads the action only when some receiver has a limit, and takes a token only for an action
    still AUTHORIZED: a duplicate message, or one for an action the sweep already sent, goes on
    to the claim (which turns it away) without spending the receiver's budget."""
    if not throttling_enabled():
        return 0.0
    row = Action.objects.filter(pk=action_pk).values_list("kind", "status").first()
    if row is None or row[1] != ActionStatus.AUTHORIZED:
        return 0.0
    return throttle_wait(kind_for(row[0]).contract().receiver)


def reconcile_wait(*, action_pk: int, now: datetime, published_mark: datetime | None = None) -> float:
    """How long this action's reconciliation must wait for its receiver's bucket (0: go now).
    Takes a token only for a pass the claim would let through (an UNKNOWN or SETTLING action that
    is due, or still carries this task's published mark): a message for an action another
    reconciler already took, or that left reconciliation, spends nothing."""
    if not throttling_enabled():
        return 0.0
    row = Action.objects.filter(pk=action_pk).values_list("kind", "status", "next_reconcile_at").first()
    if row is None:
        return 0.0
    kind, status, due_at = row
    if status not in (ActionStatus.UNKNOWN, ActionStatus.SETTLING):
        return 0.0
    if due_at is not None and due_at > now and due_at != published_mark:
        return 0.0
    return throttle_wait(kind_for(kind).contract().receiver)


@dataclass(frozen=True)
class ThrottleState:
    """One limited receiver's bucket as the store has it now (for /metrics)."""

    receiver: str
    limit: int  # calls per window
    window_seconds: int
    remaining: int  # calls left in the current window
    paused_seconds: float  # left of a Retry-After pause (0: none)


def throttle_states() -> list[ThrottleState]:
    """Every limited receiver's bucket, read without taking a token. A receiver whose limit
    cannot be read, or whose store does not answer, is left out (the store is then left alone
    for a while, as a dispatch would)."""
    states: list[ThrottleState] = []
    if not throttling_enabled() or not _store_available():
        return states
    for receiver, text in sorted(settings.RECEIVER_RATE_LIMITS.items()):
        try:
            item = _rate(text)
        except ValueError:
            continue
        try:
            storage = _storage(settings.RECEIVER_RATE_LIMIT_STORAGE)
            pause_key = _pause_key(receiver)
            paused = max(storage.get_expiry(pause_key) - time.time(), 0.0) if storage.get(pause_key) > 0 else 0.0
            stats = _limiter().get_window_stats(item, NAMESPACE, receiver)
        except Exception:  # the store is down: say nothing rather than fail the scrape
            _store_failed(receiver)
            return []
        states.append(
            ThrottleState(
                receiver=receiver,
                limit=item.amount,
                window_seconds=item.get_expiry(),
                remaining=stats.remaining,
                paused_seconds=paused,
            )
        )
    return states


def republish_delay(wait: float) -> float:
    """When to publish a throttled dispatch again: after its wait, spread over one more wait so
    that the actions waiting for one bucket do not all wake at the same instant, and never later
    than a sweep interval (well inside the broker's visibility timeout; the AUTHORIZED sweep
    covers a message lost meanwhile)."""
    return min(wait + random.uniform(0, max(wait, MIN_WAIT_SECONDS)), float(settings.SWEEP_INTERVAL_SECONDS))


def rate_limit_store_is_shared() -> bool:
    """Whether the buckets' store is one every process shares (not a process's own memory)."""
    return not settings.RECEIVER_RATE_LIMIT_STORAGE.startswith("memory://")


def rate_limit_problems() -> list[str]:
    """Each configured limit the `limits` library cannot read (for the start-up check)."""
    problems = []
    for receiver, text in settings.RECEIVER_RATE_LIMITS.items():
        try:
            _rate(text)
        except ValueError:
            problems.append(f"{receiver}={text!r}")
    return problems


__all__ = [
    "ThrottleState",
    "dispatch_wait",
    "rate_limit_problems",
    "rate_limit_store_is_shared",
    "reconcile_wait",
    "republish_delay",
    "throttle_pause",
    "throttle_states",
    "throttle_wait",
    "throttling_enabled",
]
