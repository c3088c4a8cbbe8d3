"""The dispatcher process's claim loop, piece by piece (``actions.engine.dispatcher``).

tests/actions/test_dispatcher.py proves the loop end to end (calls in flight, the batch ahead of
the threads, a failed claim). These pin the parts its survivors showed unprotected: how much the
loop asks for at each moment, its idle back-off, what it counts, a record that raises, the
throttled claim, and the connections it checks and closes. The loop's arithmetic is tested with
its claim and its threads replaced, so those tests need no database.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from django.db import connection
from django.db.models import F
from django.utils import timezone

from actions.engine import dispatcher as module
from actions.engine.claim import Claim, ClaimOutcome
from actions.engine.dispatcher import Dispatcher, DispatcherStats
from actions.models import Action, ActionStatus, Attempt, Order
from actions.services import Actor
from tests.actions.test_dispatcher import run_until_drained
from tests.actions.test_reconciliation import FakeReceiver, authorized_refund, guarantees

S = ActionStatus
CLAIMED = Claim(ClaimOutcome.CLAIMED)


# --- how much the loop asks for (no database) --------------------------------------------------


@pytest.mark.parametrize(
    ("concurrency", "batch_size", "lease_seconds", "outstanding", "claimable"),
    [
        # A lease that outlasts the wait (60 s, at least three 10 s timeouts): threads free, plus one batch ahead.
        (4, 2, 60, 0, 6),
        (4, 2, 60, 3, 3),
        # Every thread busy: a full batch ahead is claimable, a part of one is not.
        (4, 2, 60, 4, 2),
        (4, 2, 60, 5, 0),
        (4, 2, 60, 6, 0),
        # The batch ahead is at most one action per thread (min(batch, concurrency)).
        (2, 16, 60, 2, 2),
        (2, 16, 60, 3, 0),
        # One thread, batches of one: the one action ahead is still claimed.
        (1, 1, 60, 1, 1),
        # The lease exactly three provider timeouts long still fits.
        (4, 2, 30, 4, 2),
        # A lease too short for the wait: nothing claimed ahead of a free thread.
        (4, 2, 29, 0, 4),
        (4, 2, 29, 3, 1),
        (4, 2, 29, 4, 0),
    ],
)
def test_the_loop_claims_for_its_free_threads_and_one_batch_ahead_while_the_lease_allows(
    settings: Any, concurrency: int, batch_size: int, lease_seconds: int, outstanding: int, claimable: int
) -> None:
    settings.LEASE_SECONDS, settings.PROVIDER_TIMEOUT_SECONDS = lease_seconds, 10
    dispatcher = Dispatcher(concurrency=concurrency, batch_size=batch_size)
    dispatcher._outstanding = outstanding
    assert dispatcher._claimable() == claimable


def test_the_batch_ahead_is_one_action_per_thread_and_only_with_a_lease_three_timeouts_long(settings: Any) -> None:
    settings.LEASE_SECONDS, settings.PROVIDER_TIMEOUT_SECONDS = 30, 10
    assert Dispatcher(concurrency=3, batch_size=8).prefetch == 3
    assert Dispatcher(concurrency=8, batch_size=3).prefetch == 3
    settings.LEASE_SECONDS = 29
    assert Dispatcher(concurrency=3, batch_size=8).prefetch == 0


class ScriptedLoop:
    """Replaces the loop's claim, its threads and its waits: each claim answers the next entry of
    ``script`` (a number of CLAIMED claims), and the loop stops after ``rounds`` claims or waits."""

    def __init__(self, dispatcher: Dispatcher, monkeypatch: pytest.MonkeyPatch, script: list[int], rounds: int) -> None:
        self.events: list[tuple[str, float]] = []
        self.script = iter(script)
        self.rounds = rounds
        self.dispatcher = dispatcher
        monkeypatch.setattr(dispatcher, "_claim", self.claim)
        monkeypatch.setattr(dispatcher, "_wait", lambda seconds: self.events.append(("wait", seconds)))
        monkeypatch.setattr(dispatcher, "_start", lambda pool, claim: self.events.append(("start", 0)))

    def claim(self, limit: int) -> list[Claim]:
        self.events.append(("claim", limit))
        return [CLAIMED] * next(self.script, 0)

    def run(self) -> list[tuple[str, float]]:
        self.dispatcher.run(until=lambda: len(self.events) >= self.rounds)
        return self.events


def test_an_empty_table_is_looked_at_again_after_an_idle_wait_that_doubles_up_to_its_cap(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.LEASE_SECONDS, settings.PROVIDER_TIMEOUT_SECONDS = 60, 10
    dispatcher = Dispatcher(concurrency=2, batch_size=4, idle_seconds=0.05, max_idle_seconds=0.3)
    waits = [seconds for what, seconds in ScriptedLoop(dispatcher, monkeypatch, [], rounds=12).run() if what == "wait"]
    assert waits == [0.05, 0.1, 0.2, 0.3, 0.3, 0.3]
    assert dispatcher.peak_outstanding == 0, "nothing was ever in flight"


def test_an_idle_dispatcher_as_the_command_starts_it_looks_at_the_table_at_least_every_second(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``manage.py dispatcher`` passes ``--idle`` (0.05 s) and leaves the cap to its default: a new
    AUTHORIZED action waits at most a second for an idle dispatcher."""
    settings.LEASE_SECONDS, settings.PROVIDER_TIMEOUT_SECONDS = 60, 10
    dispatcher = Dispatcher(concurrency=1, batch_size=1, idle_seconds=0.05)
    waits = [seconds for what, seconds in ScriptedLoop(dispatcher, monkeypatch, [], rounds=16).run() if what == "wait"]
    assert waits == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]


def test_a_claim_that_finds_work_resets_the_idle_wait_and_a_full_batch_claims_again_at_once(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No batch ahead (the lease is too short), so the loop asks for its free threads only.
    settings.LEASE_SECONDS, settings.PROVIDER_TIMEOUT_SECONDS = 20, 10
    dispatcher = Dispatcher(concurrency=8, batch_size=2, idle_seconds=0.05, max_idle_seconds=1.0)
    events = ScriptedLoop(dispatcher, monkeypatch, [0, 0, 1, 0, 2, 2, 0], rounds=16).run()
    assert events[:16] == [
        ("claim", 2),
        ("wait", 0.05),
        ("claim", 2),
        ("wait", 0.1),
        # One found: sent, then the short wait again (the table had no more just now), not 0.2.
        ("claim", 2),
        ("start", 0),
        ("wait", 0.05),
        ("claim", 2),
        ("wait", 0.05),
        # Full batches: claimed again straight away, with no wait between them.
        ("claim", 2),
        ("start", 0),
        ("start", 0),
        ("claim", 2),
        ("start", 0),
        ("start", 0),
        ("claim", 2),
    ]


def test_the_loop_asks_for_at_most_a_batch_and_waits_its_longest_when_nothing_is_claimable(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.LEASE_SECONDS, settings.PROVIDER_TIMEOUT_SECONDS = 60, 10
    dispatcher = Dispatcher(concurrency=3, batch_size=2, idle_seconds=0.05, max_idle_seconds=0.7)
    dispatcher._outstanding = 1  # 2 threads free and a batch of 2 ahead: 4 claimable, a batch is 2
    assert ScriptedLoop(dispatcher, monkeypatch, [], rounds=2).run() == [("claim", 2), ("wait", 0.05)]

    dispatcher = Dispatcher(concurrency=3, batch_size=2, idle_seconds=0.05, max_idle_seconds=0.7)
    dispatcher._outstanding = 5  # every thread busy and a batch waiting
    assert ScriptedLoop(dispatcher, monkeypatch, [], rounds=2).run() == [("wait", 0.7), ("wait", 0.7)]


def test_one_free_thread_and_no_batch_ahead_claims_its_one_action_at_once(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.LEASE_SECONDS, settings.PROVIDER_TIMEOUT_SECONDS = 20, 10  # too short to claim ahead
    dispatcher = Dispatcher(concurrency=2, batch_size=2, idle_seconds=0.05, max_idle_seconds=0.7)
    dispatcher._outstanding = 1
    assert ScriptedLoop(dispatcher, monkeypatch, [1], rounds=2).run() == [("claim", 1), ("start", 0)]


def test_shutdown_stops_the_loop_and_ends_an_idle_wait_at_once() -> None:
    dispatcher = Dispatcher(concurrency=1, batch_size=1)
    dispatcher.shutdown()
    assert dispatcher.stop.is_set()
    assert dispatcher._wake.is_set(), "an idle wait would run to its timer"


def test_a_finished_call_is_counted_frees_its_thread_and_wakes_the_loop(caplog: pytest.LogCaptureFixture) -> None:
    dispatcher = Dispatcher(concurrency=3, batch_size=3)
    dispatcher._outstanding = 3
    answered: Future[str] = Future()
    answered.set_result(S.SUCCEEDED)
    dispatcher._done(answered)
    assert (dispatcher._outstanding, dispatcher.stats.recorded, dispatcher.stats.errors) == (2, {S.SUCCEEDED: 1}, 0)
    assert dispatcher._wake.is_set()

    for left, errors in ((1, 1), (0, 2)):
        dispatcher._wake.clear()
        failed: Future[str] = Future()
        failed.set_exception(RuntimeError("connection lost at the record"))
        with caplog.at_level(logging.ERROR, logger=module.__name__):
            dispatcher._done(failed)
        assert (dispatcher._outstanding, dispatcher.stats.recorded, dispatcher.stats.errors) == (
            left,
            {S.SUCCEEDED: 1},
            errors,
        )
        assert dispatcher._wake.is_set()
    assert [record.getMessage() for record in caplog.records] == [
        "dispatcher: a call's record failed; its lease expires to reconciliation"
    ] * 2
    assert all(
        record.exc_info is not None and "connection lost at the record" in str(record.exc_info[1])
        for record in caplog.records
    )


def test_the_stats_count_each_result_from_nothing() -> None:
    stats = DispatcherStats()
    assert stats.recorded is None
    for result in (S.SUCCEEDED, S.UNKNOWN, S.SUCCEEDED):
        stats.count(result)
    assert stats.recorded == {S.SUCCEEDED: 2, S.UNKNOWN: 1}


@pytest.mark.parametrize("missing", ["action", "attempt", "lease_token"])
def test_a_claim_without_its_action_attempt_or_lease_token_is_never_sent(
    monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    """Invariant 3: no receiver call without a lease the caller holds. Without a token the call
    would go out and only its record would be fenced off, after the effect."""
    sent: list[dict[str, Any]] = []

    def send(**kwargs: Any) -> Any:
        sent.append(kwargs)
        return SimpleNamespace(action=kwargs["action"])

    monkeypatch.setattr(module, "submission_send", send)
    records = module.RecordGroups(record=lambda group: [S.SUCCEEDED] * len(group))
    parts = claimed_parts()
    parts[missing] = None
    with pytest.raises(AssertionError):
        module._send_and_record(Claim(ClaimOutcome.CLAIMED, **parts), records)
    assert sent == []


def claimed_parts() -> dict[str, Any]:
    """A CLAIMED claim's action, attempt and lease token (not saved: the send is replaced)."""
    return {"action": Action(action_id="refund:order-1:request-1"), "attempt": Attempt(), "lease_token": uuid.uuid4()}


def test_each_call_logs_its_action_and_how_long_the_call_and_its_record_took(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(module, "submission_send", lambda **kwargs: SimpleNamespace(action=kwargs["action"]))
    records = module.RecordGroups(record=lambda group: [S.SUCCEEDED] * len(group))
    clock = iter([100.0, 100.0, 100.25])  # the start, the idle connection check, the end
    monkeypatch.setattr(module, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    monkeypatch.setattr(module, "_last_use", threading.local())
    with caplog.at_level(logging.DEBUG, logger=module.__name__):
        assert module._send_and_record(Claim(ClaimOutcome.CLAIMED, **claimed_parts()), records) == S.SUCCEEDED
    assert [record.getMessage() for record in caplog.records] == [
        "action_id=refund:order-1:request-1 sent and recorded in 0.250 s"
    ]


def test_each_batch_claim_counts_what_it_claimed_what_went_stale_and_one_transaction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The dispatcher's stats (its log line at stop and the benchmarks read them): a batch asks
    for at most a batch, as the dispatcher process, and an empty batch is still a transaction."""
    stale, taken = Claim(ClaimOutcome.STALE), Claim(ClaimOutcome.TAKEN)
    batches = iter([[CLAIMED, stale, taken], [], [CLAIMED, CLAIMED, stale]])
    asked: list[dict[str, Any]] = []

    def begin_batch(**kwargs: Any) -> list[Claim]:
        asked.append(kwargs)
        return next(batches)

    monkeypatch.setattr(module, "submission_begin_batch", begin_batch)
    monkeypatch.setattr(module, "throttling_enabled", lambda: False)
    dispatcher = Dispatcher(concurrency=4, batch_size=3)
    assert dispatcher._claim(5) == [CLAIMED, stale, taken]
    assert dispatcher._claim(2) == []
    assert dispatcher._claim(3) == [CLAIMED, CLAIMED, stale]

    assert asked == [{"limit": limit, "action_pks": None, "actor": module.DISPATCHER_PROCESS} for limit in (3, 2, 3)]
    stats = dispatcher.stats
    assert (stats.claim_transactions, stats.claimed, stats.stale, stats.batches, list(stats.batch_sizes)) == (
        3,
        3,
        2,
        2,
        [1, 2],
    )
    assert stats.errors == 0


def test_a_failed_batch_claim_is_counted_logged_drops_the_connection_and_waits_the_longest_idle(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def begin_batch(**kwargs: Any) -> list[Claim]:
        raise RuntimeError("deadlock detected")

    monkeypatch.setattr(module, "submission_begin_batch", begin_batch)
    monkeypatch.setattr(module, "throttling_enabled", lambda: False)
    fake = FakeConnection(open_=True, usable=True)
    monkeypatch.setattr(module, "connection", fake)
    dispatcher = Dispatcher(concurrency=2, batch_size=2, idle_seconds=0.05, max_idle_seconds=0.7)
    waits: list[float] = []
    monkeypatch.setattr(dispatcher, "_wait", waits.append)
    with caplog.at_level(logging.ERROR, logger=module.__name__):
        assert dispatcher._claim(2) == []
        assert dispatcher._claim(2) == []

    assert (dispatcher.stats.errors, dispatcher.stats.claim_transactions, dispatcher.stats.claimed) == (2, 0, 0)
    assert (waits, fake.closed) == ([0.7, 0.7], 2)
    assert [record.getMessage() for record in caplog.records] == [
        "dispatcher: a batch claim failed; nothing of it was claimed"
    ] * 2
    assert all(record.exc_info is not None and "deadlock" in str(record.exc_info[1]) for record in caplog.records)


class FakeConnection:
    def __init__(self, *, open_: bool, usable: bool) -> None:
        self.connection = object() if open_ else None
        self.usable = usable
        self.checked = 0
        self.closed = 0

    def is_usable(self) -> bool:
        self.checked += 1
        return self.usable

    def close(self) -> None:
        self.closed += 1


@pytest.mark.parametrize(
    ("idle", "open_", "usable", "checked", "closed"),
    [
        (5.5, True, False, 1, 1),  # idle, and the server went away: dropped before the call
        (5.5, True, True, 1, 0),  # idle and healthy: kept
        (4.5, True, False, 0, 0),  # busy: not checked (the round trip would cost every call)
        (5.0, True, False, 0, 0),  # idle for exactly the limit: not yet "idle for longer"
        (5.5, False, False, 0, 0),  # no connection yet: nothing to check
    ],
)
def test_a_threads_connection_idle_for_five_seconds_is_checked_and_dropped_if_dead(
    monkeypatch: pytest.MonkeyPatch, idle: float, open_: bool, usable: bool, checked: int, closed: int
) -> None:
    fake = FakeConnection(open_=open_, usable=usable)
    monkeypatch.setattr(module, "connection", fake)
    clock = iter([100.0, 100.0 + idle])
    monkeypatch.setattr(module, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    monkeypatch.setattr(module, "_last_use", threading.local())
    module._drop_connection_if_dead()  # the thread's first call: never idle
    assert (fake.checked, fake.closed) == (0, 0)
    module._drop_connection_if_dead()
    assert (fake.checked, fake.closed) == (checked, closed)
    assert module._last_use.at == 100.0 + idle


class ClosingAtStop:
    """Who closed a connection at stop, and the barriers the closing tasks met. The barrier's
    timeout (10 s in the dispatcher) is scaled down 50 times so a test of a stuck thread is quick."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.closed_by: list[str] = []
        self.barriers: list[threading.Barrier] = []
        closing = self

        class Recording:
            def close(self) -> None:
                closing.closed_by.append(threading.current_thread().name)

        class QuickBarrier(threading.Barrier):
            def __init__(self, parties: int) -> None:
                super().__init__(parties)
                closing.barriers.append(self)

            def wait(self, timeout: float | None = None) -> int:
                return super().wait(None if timeout is None else timeout / 50)

        monkeypatch.setattr(module, "connection", Recording())
        monkeypatch.setattr(
            module,
            "threading",
            SimpleNamespace(Barrier=QuickBarrier, BrokenBarrierError=threading.BrokenBarrierError),
        )

    def release(self) -> None:
        for barrier in self.barriers:
            barrier.abort()


def test_at_stop_each_pool_thread_closes_its_own_connection_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Django connection can only be closed by its own thread: one closing task per thread,
    and the barrier keeps a fast thread from taking two while another takes none."""
    closing = ClosingAtStop(monkeypatch)
    with ThreadPoolExecutor(max_workers=3, thread_name_prefix="dispatch") as pool:
        # Start the three threads, as the dispatcher's calls would have.
        started = threading.Barrier(3)
        for _ in range(3):
            pool.submit(started.wait, 10)
        module._close_thread_connections(pool, 3)
    assert sorted(closing.closed_by) == ["dispatch_0", "dispatch_1", "dispatch_2"]
    assert [barrier.broken for barrier in closing.barriers] == [False], "the free threads waited out a timeout"


def test_at_stop_a_thread_stuck_in_a_call_does_not_keep_the_others_from_closing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The barrier waits a bounded time: a call that never returns must not keep the free
    threads' connections open (or the dispatcher from stopping)."""
    closing = ClosingAtStop(monkeypatch)
    stuck = threading.Event()
    stuck_in: list[str] = []

    def call_that_hangs() -> None:
        stuck_in.append(threading.current_thread().name)
        stuck.wait(10)

    try:
        with ThreadPoolExecutor(max_workers=3, thread_name_prefix="dispatch") as pool:
            started = threading.Barrier(3)
            for _ in range(3):
                pool.submit(started.wait, 10)
            pool.submit(call_that_hangs)
            module._close_thread_connections(pool, 3)
            deadline = time.monotonic() + 3
            while len(set(closing.closed_by)) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            closed_while_stuck = set(closing.closed_by)
            stuck.set()
    finally:
        stuck.set()
        closing.release()
    assert closed_while_stuck == {"dispatch_0", "dispatch_1", "dispatch_2"} - set(stuck_in)


def test_a_pool_thread_sends_and_records_its_claim_and_logs_how_long_it_took(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    token = uuid.uuid4()
    action, attempt = SimpleNamespace(action_id="refund:order-7:request-1"), SimpleNamespace(pk=3)
    sent = SimpleNamespace(action=action)
    calls: list[dict[str, Any]] = []
    recorded: list[list[Any]] = []

    def send(**kwargs: Any) -> Any:
        calls.append(kwargs)
        return sent

    def record(group: Any) -> list[str | Exception]:
        recorded.append(list(group))
        return [S.SUCCEEDED]

    monkeypatch.setattr(module, "submission_send", send)
    monkeypatch.setattr(module, "_drop_connection_if_dead", lambda: None)
    records = module.RecordGroups(record=record)
    clock = iter([10.0, 10.25])
    monkeypatch.setattr(module, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    claim = Claim(ClaimOutcome.CLAIMED, action=action, attempt=attempt, lease_token=token)  # type: ignore[arg-type]

    with caplog.at_level(logging.DEBUG, logger=module.__name__):
        assert module._send_and_record(claim, records) == S.SUCCEEDED

    assert calls == [{"action": action, "attempt": attempt, "lease_token": token}]
    assert recorded == [[sent]]
    assert [r.getMessage() for r in caplog.records] == [
        "action_id=refund:order-7:request-1 sent and recorded in 0.250 s"
    ]


def test_a_call_not_made_for_a_lease_about_to_expire_records_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(module, "submission_send", lambda **kwargs: None)
    monkeypatch.setattr(module, "_drop_connection_if_dead", lambda: None)
    recorded: list[Any] = []

    def record(group: Any) -> list[str | Exception]:
        recorded.append(group)
        return []

    records = module.RecordGroups(record=record)
    action, attempt = SimpleNamespace(action_id="refund:order-7:request-1"), SimpleNamespace(pk=3)
    claim = Claim(ClaimOutcome.CLAIMED, action=action, attempt=attempt, lease_token=uuid.uuid4())  # type: ignore[arg-type]

    assert module._send_and_record(claim, records) == "lease_too_short"
    assert recorded == []


# --- with the database --------------------------------------------------------------------------


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> FakeReceiver:
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)
    fake = FakeReceiver(guarantees=guarantees(keys=True, lookup=True, authoritative=True))
    monkeypatch.setattr("actions.kinds.refund.contract.provider_from_settings", lambda: fake)
    return fake


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_stale_claim_is_counted_and_never_sent(agent_actor: Actor, receiver: FakeReceiver) -> None:
    """The order moved after the approval: the claim goes STALE and is not handed to a thread. The
    auto-approval policy decides again on the order as it is now (approvals.policy), so the
    action comes back AUTHORIZED and the next batch sends it, once."""
    stale, fresh = authorized_refund(agent_actor), authorized_refund(agent_actor)
    Order.objects.filter(actions=stale).update(version=F("version") + 1)
    dispatcher = Dispatcher(concurrency=2, batch_size=2, idle_seconds=0.01)
    run_until_drained(dispatcher, [stale, fresh])

    assert Action.objects.get(pk=stale.pk).status == S.SUCCEEDED
    assert sorted(r.metadata["action_id"] for r in receiver.refunds) == sorted([stale.action_id, fresh.action_id])
    stats = dispatcher.stats
    assert (stats.claimed, stats.stale, stats.errors, stats.batches, list(stats.batch_sizes)) == (2, 1, 0, 2, [1, 1])
    assert stats.recorded == {S.SUCCEEDED: 2}
    assert stats.claim_transactions >= 2


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_record_that_raises_is_counted_frees_its_thread_and_leaves_the_lease_to_expire(
    agent_actor: Actor, receiver: FakeReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    action = authorized_refund(agent_actor)
    dispatcher = Dispatcher(concurrency=1, batch_size=1, idle_seconds=0.01)
    # Who closed a connection, and whether the failed record had been counted yet: the recorder
    # thread, which ran the record, drops its connection before it counts the error.
    closes: list[tuple[str, int]] = []

    class Watched:
        def __getattr__(self, name: str) -> Any:
            return getattr(connection, name)

        def close(self) -> None:
            closes.append((threading.current_thread().name.split("_")[0], dispatcher.stats.errors))
            connection.close()

    def record_fails(**kwargs: Any) -> str:
        raise RuntimeError("the database went away at the record")

    monkeypatch.setattr(module, "submission_record_group", record_fails)
    monkeypatch.setattr(module, "connection", Watched())
    thread = threading.Thread(target=dispatcher.run, kwargs={"until": lambda: dispatcher.stats.errors >= 1})
    thread.start()
    thread.join(timeout=20)
    assert not thread.is_alive()

    assert (dispatcher.stats.errors, dispatcher.stats.recorded, dispatcher._outstanding) == (1, None, 0)
    stored = Action.objects.get(pk=action.pk)
    assert stored.status == S.SUBMITTING and stored.lease_token is not None
    assert ("dispatch-recorder", 0) in closes, f"the recorder kept a connection that had just failed: {closes}"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_with_rate_limits_only_actions_whose_receiver_has_a_token_are_claimed(
    agent_actor: Actor, receiver: FakeReceiver, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """Tokens are taken before the claim, oldest approval first, for at most ``limit`` AUTHORIZED
    actions: one that must wait stays AUTHORIZED, with no lease and no attempt."""
    settings.RECEIVER_RATE_LIMITS = {"provider": "1000/second"}
    first, second, third, done = (authorized_refund(agent_actor) for _ in range(4))
    # The approval order differs from the pk order: third is the oldest, first and second were
    # approved at the same moment (the pk decides), and first's row was rewritten last. The
    # settled one is older than all of them and must not take a place.
    now = timezone.now()
    Action.objects.filter(pk=done.pk).update(status=S.SUCCEEDED, status_changed_at=now - timedelta(hours=2))
    Action.objects.filter(pk=third.pk).update(status_changed_at=now - timedelta(hours=1))
    Action.objects.filter(pk__in=[first.pk, second.pk]).update(status_changed_at=now - timedelta(minutes=1))
    Action.objects.filter(pk=first.pk).update(status_changed_at=now - timedelta(minutes=1))
    asked: list[str] = []
    tokens = iter([0.0] * 3)

    def wait_for(receiver_name: str) -> float:
        asked.append(receiver_name)
        return next(tokens, 0.0)

    monkeypatch.setattr(module, "throttle_wait", wait_for)
    dispatcher = Dispatcher(concurrency=4, batch_size=4)
    assert dispatcher._with_tokens(3) == [third.pk, first.pk, second.pk]
    assert asked == ["provider"] * 3

    # The shortest wait the bucket hands back (throttle.MIN_WAIT_SECONDS) is still a wait.
    tokens = iter([0.0, 0.05])
    assert dispatcher._with_tokens(2) == [third.pk]

    # A claim of one asks the bucket for one action's token, not one for every AUTHORIZED action.
    asked.clear()
    tokens = iter([3.0] * 3)
    assert dispatcher._claim(1) == []
    assert asked == ["provider"]

    tokens = iter([3.0, 0.0, 0.0])
    claims = dispatcher._claim(4)
    assert sorted((c.action.pk if c.action else 0, c.outcome) for c in claims) == [
        (first.pk, ClaimOutcome.CLAIMED),
        (second.pk, ClaimOutcome.CLAIMED),
    ]
    assert Action.objects.get(pk=third.pk).status == S.AUTHORIZED
    assert not Attempt.objects.filter(action=third).exists()


# --- an answer left with the recorder (RecordGroups.hand_over) -----------------------------------


def test_a_thread_that_left_its_answer_with_the_recorder_is_counted_once_when_it_is_recorded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pool thread's HANDED_OVER frees its place but counts nothing; the recorder's report
    counts the result, after its commit, and only then passes the after_record fault point."""
    passed: list[str] = []
    monkeypatch.setattr(module, "fault_point", passed.append)
    dispatcher = Dispatcher(concurrency=2, batch_size=2)
    dispatcher._outstanding = 2
    left: Future[str] = Future()
    left.set_result(module.HANDED_OVER)
    dispatcher._done(left)
    assert (dispatcher._outstanding, dispatcher.stats.recorded, dispatcher.stats.errors) == (1, None, 0)
    assert dispatcher._wake.is_set() and passed == []

    dispatcher._recorded(SimpleNamespace(), S.SUCCEEDED)  # type: ignore[arg-type]
    assert (dispatcher._outstanding, dispatcher.stats.recorded, dispatcher.stats.errors) == (1, {S.SUCCEEDED: 1}, 0)
    assert passed == ["after_record"]


def test_a_left_answer_whose_record_failed_is_logged_counted_and_its_connection_dropped(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    passed: list[str] = []
    closed: list[bool] = []
    monkeypatch.setattr(module, "fault_point", passed.append)
    monkeypatch.setattr(module, "connection", SimpleNamespace(close=lambda: closed.append(True)))
    dispatcher = Dispatcher(concurrency=2, batch_size=2)
    with caplog.at_level(logging.ERROR, logger=module.__name__):
        dispatcher._recorded(SimpleNamespace(), RuntimeError("connection lost at the record"))  # type: ignore[arg-type]
    assert (dispatcher.stats.recorded, dispatcher.stats.errors) == (None, 1)
    assert closed == [True] and passed == [], "a failed record passed the after_record fault point"
    [logged] = caplog.records
    assert logged.getMessage() == "dispatcher: a call's record failed; its lease expires to reconciliation"
    assert logged.exc_info is not None and "connection lost at the record" in str(logged.exc_info[1])


def test_a_pool_thread_that_finds_the_recorder_at_work_leaves_its_answer_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    action, attempt = SimpleNamespace(action_id="refund:order-8:request-1"), SimpleNamespace(pk=4)
    sent = SimpleNamespace(action=action)
    passed: list[str] = []
    monkeypatch.setattr(module, "submission_send", lambda **kwargs: sent)
    monkeypatch.setattr(module, "_drop_connection_if_dead", lambda: None)
    monkeypatch.setattr(module, "fault_point", passed.append)
    handed: list[Any] = []
    records = SimpleNamespace(hand_over=lambda one: handed.append(one))  # returns None: left with it
    clock = iter([20.0, 20.2])
    monkeypatch.setattr(module, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    claim = Claim(ClaimOutcome.CLAIMED, action=action, attempt=attempt, lease_token=uuid.uuid4())  # type: ignore[arg-type]

    with caplog.at_level(logging.DEBUG, logger=module.__name__):
        assert module._send_and_record(claim, records) == module.HANDED_OVER  # type: ignore[arg-type]

    assert handed == [sent] and passed == [], "the fault point after the record ran before the record"
    assert [r.getMessage() for r in caplog.records] == [
        "action_id=refund:order-8:request-1 sent in 0.200 s; its record is left with the recorder"
    ]


def test_a_dispatcher_that_stops_returns_only_once_every_answer_left_with_the_recorder_is_recorded(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing handed over is dropped at a clean stop: ``run`` stops the recorder thread only after
    the pool has ended, and the recorder records what waits before it ends."""
    settings.LEASE_SECONDS, settings.PROVIDER_TIMEOUT_SECONDS = 60, 10
    dispatcher = Dispatcher(concurrency=3, batch_size=3, idle_seconds=0.01, max_idle_seconds=0.01)
    first_group = threading.Event()
    groups: list[int] = []

    def record(group: Any) -> list[str | Exception]:
        groups.append(len(group))
        if len(groups) == 1:
            # Hold the first answer's record until the two others were left with the recorder.
            wait_for(lambda: len(dispatcher.records._waiting) == 2)
            first_group.set()
        return [S.SUCCEEDED] * len(group)

    dispatcher.records._record = record
    batch = [Claim(ClaimOutcome.CLAIMED, **claimed_parts()) for _ in range(3)]
    claims = iter([batch])
    monkeypatch.setattr(dispatcher, "_claim", lambda limit: next(claims, []))

    def send(**kwargs: Any) -> Any:
        if kwargs["action"] is not batch[0].action:
            # The two others answer once the first is being recorded, so it is recorded alone
            # whenever the recorder thread happens to wake.
            wait_for(lambda: groups)
        return SimpleNamespace(action=kwargs["action"])

    monkeypatch.setattr(module, "submission_send", send)
    monkeypatch.setattr(module, "_drop_connection_if_dead", lambda: None)
    monkeypatch.setattr(module, "_close_thread_connections", lambda pool, threads: None)

    stats = dispatcher.run(until=first_group.is_set)

    assert groups == [1, 2]
    assert stats.recorded == {S.SUCCEEDED: 3} and stats.errors == 0
    assert dispatcher._outstanding == 0 and dispatcher.records._waiting == []


def wait_for(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)
