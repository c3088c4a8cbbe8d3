"""Per-receiver rate limits (actions.engine.throttle) and Retry-After: a burst never
turns into a wave of 429s, each of which would become UNKNOWN and a reconciliation."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import requests
import stripe
from django.utils import timezone

from actions import tasks
from actions.engine import throttle
from actions.engine.reconcile import reconcile_action
from actions.engine.record import submission_record
from actions.engine.sweeps import sweep_authorized
from actions.engine.throttle import dispatch_wait, throttle_pause, throttle_wait
from actions.kinds.base import Answer, Effect, Lookup, LookupVerdict, Outcome
from actions.kinds.refund.contract import refund_contract
from actions.models import Action, ActionStatus, Attempt
from actions.providers.accounting.client import AccountingClient
from actions.providers.base import AmbiguousError, LookupFailed, retry_after_seconds
from actions.providers.stripe_adapter import map_create_error, map_lookup_error
from actions.services import Actor
from tests.actions.test_dispatcher_fence import claimed
from tests.actions.test_reconciliation import authorized_refund, guarantees, unknown_and_due

S = ActionStatus
PAYMENTS = "provider"  # the refund contract's receiver name


@pytest.fixture
def receiver() -> str:
    """A receiver name of its own per test: the in-memory buckets outlive a test."""
    return f"receiver-{uuid.uuid4().hex[:8]}"


@pytest.fixture(autouse=True)
def memory_buckets(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.RECEIVER_RATE_LIMIT_STORAGE = "memory://"
    # A test whose store fails leaves the store "down" for 30 s in this process; each test starts
    # with it up, and leaves it as it found it (otherwise the shared-store test passed only
    # because it ran before the unreachable-store test in file order).
    monkeypatch.setattr(throttle, "_store_down_until", 0.0)


# --- the bucket --------------------------------------------------------------------------------


def test_a_receiver_without_a_limit_is_never_throttled(settings: Any, receiver: str) -> None:
    settings.RECEIVER_RATE_LIMITS = {}
    assert [throttle_wait(receiver) for _ in range(50)] == [0.0] * 50


def test_the_bucket_lets_its_limit_through_then_says_how_long_to_wait(settings: Any, receiver: str) -> None:
    settings.RECEIVER_RATE_LIMITS = {receiver: "3/second"}
    assert [throttle_wait(receiver) for _ in range(3)] == [0.0, 0.0, 0.0]
    wait = throttle_wait(receiver)
    assert 0 < wait <= 1.0
    # Another receiver has its own bucket.
    other = f"{receiver}-other"
    settings.RECEIVER_RATE_LIMITS[other] = "1/second"
    assert throttle_wait(other) == 0.0


@pytest.mark.django_db(transaction=True)
def test_retry_after_empties_the_bucket_for_that_long(settings: Any, receiver: str) -> None:
    settings.RECEIVER_RATE_LIMITS = {receiver: "100/second"}
    throttle_pause(receiver, 30)
    assert 25 < throttle_wait(receiver) <= 31


def test_a_shared_store_is_one_bucket_for_every_worker_process(settings: Any, receiver: str) -> None:
    """With Redis, two processes' storages (two clients) draw from the same bucket."""
    settings.RECEIVER_RATE_LIMITS = {receiver: "2/minute"}
    settings.RECEIVER_RATE_LIMIT_STORAGE = "redis://127.0.0.1:6379/14"
    assert throttle_wait(receiver) == 0.0
    throttle._storage.cache_clear()  # a second process: a client of its own
    assert throttle_wait(receiver) == 0.0
    throttle._storage.cache_clear()
    assert throttle_wait(receiver) > 1


def test_an_unreachable_store_holds_a_limited_receivers_calls_and_not_the_others(
    settings: Any, receiver: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The limit is kept while its store is down: the call waits (the action stays AUTHORIZED and
    comes back), rather than going out unthrottled in the burst the limit exists to prevent."""
    settings.RECEIVER_RATE_LIMITS = {receiver: "1000/second"}
    settings.RECEIVER_RATE_LIMIT_STORAGE = "redis://127.0.0.1:1/0"
    assert 0 < throttle_wait(receiver) <= throttle.STORE_BACKOFF_SECONDS
    assert 0 < throttle_wait(receiver) <= throttle.STORE_BACKOFF_SECONDS  # held without asking the store
    assert throttle_wait("a receiver without a limit") == 0.0
    # Once the backoff has passed and the store answers again, calls go through.
    settings.RECEIVER_RATE_LIMIT_STORAGE = "memory://"
    monkeypatch.setattr(throttle, "_store_down_until", 0.0)
    assert throttle_wait(receiver) == 0.0


def test_limits_on_a_per_process_store_are_refused_by_the_check(settings: Any, receiver: str) -> None:
    from console.checks import receiver_rate_limits_check

    settings.RECEIVER_RATE_LIMITS = {receiver: "5/second"}
    settings.RECEIVER_RATE_LIMIT_STORAGE = "memory://"
    [error] = receiver_rate_limits_check()
    assert error.id == "console.E009" and "memory://" in error.msg
    settings.RECEIVER_RATE_LIMIT_STORAGE = "redis://127.0.0.1:6379/14"
    assert receiver_rate_limits_check() == []
    settings.RECEIVER_RATE_LIMITS = {}
    settings.RECEIVER_RATE_LIMIT_STORAGE = "memory://"
    assert receiver_rate_limits_check() == []  # no limits: a per-process store is harmless


@pytest.mark.parametrize(
    ("header", "seconds"),
    [("7", 7.0), (" 2.5 ", 2.5), ("", None), (None, None), ("Wed, 21 Oct 2026 07:28:00 GMT", None), ("nan", None)],
)
def test_retry_after_is_read_in_seconds_only(header: str | None, seconds: float | None) -> None:
    assert retry_after_seconds(header) == seconds
    assert retry_after_seconds("999999") == 3600.0  # bounded
    assert retry_after_seconds("-4") == 0.0


# --- the receivers' 429s carry Retry-After --------------------------------------------------------


def test_stripes_429_carries_its_retry_after() -> None:
    error = stripe.RateLimitError("Too many requests", http_status=429, headers={"Retry-After": "7"})
    mapped = map_create_error(error)
    assert isinstance(mapped, AmbiguousError) and mapped.retry_after == 7.0


def test_the_accounting_systems_429_carries_its_retry_after(monkeypatch: pytest.MonkeyPatch) -> None:
    response = requests.Response()
    response.status_code = 429
    response._content = b'{"Type": "RateLimit", "Message": "Rate limit exceeded"}'
    response.headers["Retry-After"] = "12"
    client = AccountingClient(api_base="http://accounting.invalid", access_token="t", tenant_id="x", timeout_seconds=1)
    monkeypatch.setattr(client.session, "request", lambda *a, **k: response)
    with pytest.raises(LookupFailed) as raised:
        client.find_credit_notes(reference="invoice-adjustment:bill-1:adjustment-1")
    assert raised.value.retry_after == 12.0


# --- dispatch ------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_throttled_dispatch_leaves_the_action_authorized_and_publishes_it_again(
    settings: Any, agent_actor: Actor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No claim, no lease, no attempt while the bucket is empty; the dispatch comes back later."""
    settings.RECEIVER_RATE_LIMITS = {PAYMENTS: "1/minute"}
    throttle._storage.cache_clear()  # a fresh in-memory bucket for the payment provider
    action = authorized_refund(agent_actor)
    assert throttle_wait(PAYMENTS) == 0.0  # another dispatch took this minute's token
    republished: list[tuple[Any, dict[str, Any]]] = []
    monkeypatch.setattr(tasks.dispatch, "apply_async", lambda args, **kw: republished.append((args, kw)))

    assert tasks.dispatch(action.pk) == "throttled"

    action.refresh_from_db()
    assert action.status == S.AUTHORIZED and action.lease_token is None
    assert not Attempt.objects.filter(action=action).exists()
    [(args, options)] = republished
    assert args == (action.pk,) and 0 < options["countdown"] <= 60
    # The AUTHORIZED sweep leaves it too, until the bucket refills.
    assert sweep_authorized(now=timezone.now() + timedelta(minutes=5)) == 0
    assert Action.objects.get(pk=action.pk).status == S.AUTHORIZED
    throttle._storage.cache_clear()
    assert dispatch_wait(action_pk=action.pk) == 0.0


@pytest.mark.django_db(transaction=True)
def test_without_limits_dispatch_reads_nothing_more(
    settings: Any, agent_actor: Actor, django_assert_num_queries: Any
) -> None:
    settings.RECEIVER_RATE_LIMITS = {}
    action = authorized_refund(agent_actor)
    with django_assert_num_queries(0):
        assert dispatch_wait(action_pk=action.pk) == 0.0


@pytest.mark.django_db(transaction=True)
def test_a_429_with_retry_after_is_not_asked_again_before_then(settings: Any, agent_actor: Actor) -> None:
    """UNKNOWN (a 429 proves nothing), but its reconciliation is not due before Retry-After, and
    the receiver's bucket is paused for every other call too."""
    settings.RECEIVER_RATE_LIMITS = {PAYMENTS: "100/second"}
    throttle._storage.cache_clear()
    action, attempt, token = claimed(agent_actor)
    error = AmbiguousError("Too many requests", code="rate_limit", http_status=429, retry_after=120)
    before = timezone.now()
    submission_record(
        action_pk=action.pk, attempt_pk=attempt.pk, lease_token=token, answer=Answer(Outcome.UNKNOWN, error=error)
    )
    action.refresh_from_db()
    assert action.status == S.UNKNOWN
    assert action.next_reconcile_at is not None and action.next_reconcile_at >= before + timedelta(seconds=120)
    assert throttle_wait(PAYMENTS) > 100


class RateLimitedLookups:
    """A receiver whose lookups are refused with 429 and Retry-After."""

    def __init__(self) -> None:
        self.contract = refund_contract(guarantees(keys=True, lookup=True, authoritative=True))
        self.lookups = 0

    def lookup(self, action: Action) -> Lookup:
        self.lookups += 1
        return Lookup(
            LookupVerdict.INCONCLUSIVE,
            error=LookupFailed("Too many requests", code="rate_limit", http_status=429, retry_after=90),
        )

    def send(self, action: Action) -> Answer:
        raise AssertionError("nothing is sent while the outcome is unknown")

    def ledger(self, window: object = None) -> Iterator[Effect]:
        return iter(())


@pytest.mark.django_db(transaction=True)
def test_a_rate_limited_lookup_is_not_asked_again_before_retry_after(agent_actor: Actor) -> None:
    action, attempt, token = claimed(agent_actor)
    timeout = AmbiguousError("read timed out", code="timeout")
    submission_record(
        action_pk=action.pk, attempt_pk=attempt.pk, lease_token=token, answer=Answer(Outcome.UNKNOWN, error=timeout)
    )
    Action.objects.filter(pk=action.pk).update(next_reconcile_at=timezone.now() - timedelta(seconds=1))
    receiver = RateLimitedLookups()
    before = timezone.now()

    assert reconcile_action(action_pk=action.pk, receiver=receiver) == "inconclusive"

    action.refresh_from_db()
    assert receiver.lookups == 1 and action.status == S.UNKNOWN
    # The engine counts on the database's clock (actions.foundation.clock), read through this
    # host's with an offset: the two agree to well within a second, not to the microsecond.
    assert action.next_reconcile_at is not None
    assert action.next_reconcile_at >= before + timedelta(seconds=90) - timedelta(seconds=1)


# --- the review's points: a hanging store, a longer Retry-After, spent tokens, a bad limit ---------


@pytest.fixture
def hanging_store() -> Iterator[str]:
    """A TCP server that accepts and never answers: a Redis that hangs rather than refuses."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"redis://127.0.0.1:{server.getsockname()[1]}/0"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def test_a_store_that_hangs_costs_one_short_timeout_then_is_left_alone(
    settings: Any, receiver: str, hanging_store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.RECEIVER_RATE_LIMITS = {receiver: "1/minute"}
    settings.RECEIVER_RATE_LIMIT_STORAGE = hanging_store
    monkeypatch.setattr(throttle, "_store_down_until", 0.0)
    started = time.monotonic()
    assert throttle_wait(receiver) > 0  # held, not stuck
    first = time.monotonic() - started
    assert first < 2.0, f"the first call waited {first:.1f} s"
    started = time.monotonic()
    assert all(throttle_wait(receiver) > 0 for _ in range(20))
    assert time.monotonic() - started < 0.2, "the store is left alone after a failure"


@pytest.mark.django_db(transaction=True)
def test_a_longer_retry_after_extends_the_pause_and_a_shorter_one_does_not_shorten_it(
    settings: Any, receiver: str
) -> None:
    settings.RECEIVER_RATE_LIMITS = {receiver: "100/second"}
    throttle_pause(receiver, 5)  # outside a transaction: on_commit runs it at once
    assert 3 < throttle_wait(receiver) <= 5.5
    throttle_pause(receiver, 60)
    assert 55 < throttle_wait(receiver) <= 61
    throttle_pause(receiver, 2)
    assert throttle_wait(receiver) > 55


@pytest.mark.django_db(transaction=True)
def test_a_dispatch_for_an_action_no_longer_authorized_spends_no_token(settings: Any, agent_actor: Actor) -> None:
    """A duplicate message, or one for an action the sweep already sent, goes to the claim (which
    turns it away) without spending the receiver's budget."""
    settings.RECEIVER_RATE_LIMITS = {PAYMENTS: "1/minute"}
    throttle._storage.cache_clear()
    action, _attempt, _token = claimed(agent_actor)  # SUBMITTING now
    assert [dispatch_wait(action_pk=action.pk) for _ in range(5)] == [0.0] * 5
    assert throttle_wait(PAYMENTS) == 0.0, "the minute's one token is still there"


def test_a_throttled_dispatch_comes_back_spread_and_within_a_sweep_interval(settings: Any) -> None:
    settings.SWEEP_INTERVAL_SECONDS = 10
    delays = [throttle.republish_delay(0.4) for _ in range(200)]
    assert all(0.4 <= d <= 0.8 for d in delays)
    assert len({round(d, 3) for d in delays}) > 50, "the waiters do not all wake at once"
    assert throttle.republish_delay(3600) == 10  # a long pause: the sweep's pace, not an hour-long ETA


def test_a_limit_that_cannot_be_read_is_named_by_the_check_and_leaves_dispatch_unthrottled(
    settings: Any, receiver: str
) -> None:
    from console.checks import receiver_rate_limits_check

    settings.RECEIVER_RATE_LIMITS = {receiver: "lots per second"}
    settings.RECEIVER_RATE_LIMIT_STORAGE = "redis://127.0.0.1:6379/14"
    [error] = receiver_rate_limits_check()
    assert error.id == "console.E004" and receiver in error.msg
    assert throttle_wait(receiver) == 0.0
    settings.RECEIVER_RATE_LIMITS = {receiver: "5/second"}
    assert receiver_rate_limits_check() == []


def test_a_stripe_lookup_refused_with_429_carries_its_retry_after() -> None:
    error = stripe.RateLimitError("Too many requests", http_status=429, headers={"Retry-After": "3"})
    mapped = map_lookup_error(error)
    assert isinstance(mapped, LookupFailed) and mapped.retry_after == 3.0
    # Another lookup failure says nothing about when to call again.
    unavailable = stripe.APIError("Service unavailable", http_status=503, headers={"Retry-After": "3"})
    assert map_lookup_error(unavailable).retry_after is None


# --- reconciliation's lookups take tokens too ------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_throttled_reconciliation_asks_nothing_and_comes_back_with_its_mark(
    settings: Any, agent_actor: Actor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After an outage the UNKNOWN actions fall due together: their lookups wait for the bucket
    like dispatches do, with no claim, no lookup attempt and the published mark kept."""
    settings.RECEIVER_RATE_LIMITS = {PAYMENTS: "1/minute"}
    throttle._storage.cache_clear()
    action = unknown_and_due(agent_actor)
    before = Action.objects.get(pk=action.pk)
    assert throttle_wait(PAYMENTS) == 0.0  # another call took this minute's token
    republished: list[tuple[Any, dict[str, Any]]] = []
    monkeypatch.setattr(tasks.reconcile, "apply_async", lambda args, **kw: republished.append((args, kw)))
    mark = "2026-12-01T10:00:00+00:00"

    assert tasks.reconcile(action.pk, mark) == "throttled"

    after = Action.objects.get(pk=action.pk)
    assert (after.status, after.lease_token, after.reconcile_attempts, after.next_reconcile_at) == (
        S.UNKNOWN,
        None,
        before.reconcile_attempts,
        before.next_reconcile_at,
    )
    assert not Attempt.objects.filter(action=action, kind="lookup").exists()
    [(args, options)] = republished
    assert args == (action.pk, mark) and 0 < options["countdown"] <= settings.SWEEP_INTERVAL_SECONDS


@pytest.mark.django_db(transaction=True)
def test_a_reconciliation_spends_its_receivers_token(settings: Any, agent_actor: Actor) -> None:
    settings.RECEIVER_RATE_LIMITS = {PAYMENTS: "1/minute"}
    throttle._storage.cache_clear()
    action = unknown_and_due(agent_actor)

    assert throttle.reconcile_wait(action_pk=action.pk, now=timezone.now()) == 0.0

    assert throttle_wait(PAYMENTS) > 1, "the lookup took the minute's one token"


@pytest.mark.django_db(transaction=True)
def test_a_reconciliation_message_the_claim_would_turn_away_spends_no_token(settings: Any, agent_actor: Actor) -> None:
    """Not due (another reconciler holds it, its mark moved), or no longer in reconciliation."""
    settings.RECEIVER_RATE_LIMITS = {PAYMENTS: "1/minute"}
    throttle._storage.cache_clear()
    action = unknown_and_due(agent_actor)
    now = timezone.now()
    later = now + timedelta(minutes=5)
    Action.objects.filter(pk=action.pk).update(next_reconcile_at=later)
    stale_mark = now + timedelta(seconds=30)
    assert [throttle.reconcile_wait(action_pk=action.pk, now=now, published_mark=stale_mark) for _ in range(3)] == [
        0.0
    ] * 3
    Action.objects.filter(pk=action.pk).update(status=S.SUCCEEDED, next_reconcile_at=None)
    assert throttle.reconcile_wait(action_pk=action.pk, now=now) == 0.0
    assert throttle.reconcile_wait(action_pk=10**9, now=now) == 0.0
    assert throttle_wait(PAYMENTS) == 0.0, "the minute's one token is still there"
    # The task's own mark still on the action: due for this task, so it takes the token.
    Action.objects.filter(pk=action.pk).update(status=S.UNKNOWN, next_reconcile_at=later)
    assert throttle.reconcile_wait(action_pk=action.pk, now=now, published_mark=later) > 1


@pytest.mark.django_db(transaction=True)
def test_without_limits_reconciliation_reads_nothing_more(
    settings: Any, agent_actor: Actor, django_assert_num_queries: Any
) -> None:
    settings.RECEIVER_RATE_LIMITS = {}
    action = unknown_and_due(agent_actor)
    with django_assert_num_queries(0):
        assert throttle.reconcile_wait(action_pk=action.pk, now=timezone.now()) == 0.0
