"""The dispatcher process's loop (``actions.engine.dispatcher``), in this process.

Many calls in flight from one process: each call still under its own committed lease, recorded
through the same service. The receiver here is an in-memory provider that can hold its answers
until a number of calls have arrived together, which is how concurrency is proven rather than
assumed. The real-process crash matrix with the dispatcher is tests/faults/test_dispatcher_crashes.py.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.management import CommandError, call_command
from django.db import connection

from actions.engine import dispatcher as module
from actions.engine.dispatcher import Dispatcher
from actions.models import Action, ActionStatus, Attempt, Order
from actions.providers.base import CreateRefund, ProviderRefund
from actions.services import Actor
from tests.actions.test_reconciliation import AMOUNT, FakeReceiver, authorized_refund, guarantees
from tests.processes import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
S = ActionStatus


@pytest.fixture(autouse=True)
def no_publish(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)


class GatedReceiver(FakeReceiver):
    """Holds every refund until ``gate`` calls are inside it at once (or the deadline passes),
    and records the most calls it ever had in flight."""

    def __init__(self, gate: int) -> None:
        super().__init__(guarantees=guarantees(keys=True, lookup=True, authoritative=True))
        self.gate = gate
        self.inside = 0
        self.peak = 0
        self.lock = threading.Lock()
        self.all_in = threading.Event()
        self.committed_before_call: list[bool] = []

    def create_refund(self, req: CreateRefund) -> ProviderRefund:
        # The claim committed before the call (invariant 3): another connection sees the lease.
        self.committed_before_call.append(
            Action.objects.filter(action_id=req.metadata["action_id"], status=S.SUBMITTING).exists()
        )
        with self.lock:
            self.inside += 1
            self.peak = max(self.peak, self.inside)
            if self.inside >= self.gate:
                self.all_in.set()
        self.all_in.wait(timeout=10)
        try:
            with self.lock:
                return super().create_refund(req)
        finally:
            with self.lock:
                self.inside -= 1


def in_a_thread(dispatcher: Dispatcher, *, until: Any = None) -> threading.Thread:
    """Run the dispatcher's claim loop in a thread of its own, as its process's main thread."""

    def loop() -> None:
        try:
            dispatcher.run(until=until)
        finally:
            connection.close()

    thread = threading.Thread(target=loop)
    thread.start()
    return thread


def run_until_drained(dispatcher: Dispatcher, actions: list[Action], *, deadline: float = 30.0) -> threading.Thread:
    def drained() -> bool:
        pks = [a.pk for a in actions]
        return not Action.objects.filter(pk__in=pks, status__in=[S.AUTHORIZED, S.SUBMITTING]).exists()

    thread = in_a_thread(dispatcher, until=drained)
    thread.join(timeout=deadline)
    dispatcher.stop.set()
    thread.join(timeout=10)
    assert not thread.is_alive(), "the dispatcher did not stop"
    return thread


def test_the_dispatcher_holds_many_calls_in_flight_each_under_its_own_committed_lease(
    agent_actor: Actor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariants 1, 2, 3 and 5 with calls in flight together: four calls are inside the
    receiver at the same time, each action ends SUCCEEDED with exactly one refund, and each
    order's money moved once."""
    receiver = GatedReceiver(gate=4)
    monkeypatch.setattr("actions.kinds.refund.contract.provider_from_settings", lambda: receiver)
    actions = [authorized_refund(agent_actor) for _ in range(8)]

    dispatcher = Dispatcher(concurrency=4, batch_size=4, idle_seconds=0.01)
    run_until_drained(dispatcher, actions)

    assert receiver.peak == 4, f"at most {receiver.peak} calls were in flight together"
    assert all(receiver.committed_before_call) and len(receiver.committed_before_call) == 8
    assert {a.status for a in Action.objects.filter(pk__in=[a.pk for a in actions])} == {S.SUCCEEDED}
    refunded = [r.metadata["action_id"] for r in receiver.refunds]
    assert sorted(refunded) == sorted(a.action_id for a in actions)
    for action in Action.objects.filter(pk__in=[a.pk for a in actions]):
        order = Order.objects.get(pk=action.order_id)
        assert (order.refunded_amount, order.reserved_amount) == (AMOUNT, 0)
        attempt = Attempt.objects.get(action=action)
        assert attempt.held_lease is True and attempt.outcome == "succeeded"
    assert dispatcher.stats.claimed == 8
    assert dispatcher.stats.batch_sizes[0] == 4, "the first four were not claimed in one transaction"
    assert dispatcher.stats.recorded == {S.SUCCEEDED: 8}


@pytest.mark.parametrize(
    ("lease_seconds", "claimed_at_most"),
    [
        # A 60 s lease outlasts a wait for one call and its own call (10 s each) with room to
        # spare: one batch (at most one action per thread) waits claimed for a free thread.
        (60, 4),
        # A 20 s lease does not: no action is claimed before a thread is free to send it.
        (20, 2),
    ],
)
def test_the_dispatcher_claims_at_most_one_batch_ahead_of_its_threads_and_only_while_the_lease_allows(
    agent_actor: Actor, monkeypatch: pytest.MonkeyPatch, settings: Any, lease_seconds: int, claimed_at_most: int
) -> None:
    """A claimed action's lease runs while it waits for a thread: with both threads busy, at most
    one batch of two waits claimed (or none, with a lease too short for the wait), and the other
    actions stay AUTHORIZED with no lease and no attempt until a thread is free."""
    settings.LEASE_SECONDS, settings.PROVIDER_TIMEOUT_SECONDS = lease_seconds, 10
    release = threading.Event()
    seen: list[str] = []

    class Slow(FakeReceiver):
        def create_refund(self, req: CreateRefund) -> ProviderRefund:
            seen.append(req.metadata["action_id"])
            release.wait(timeout=10)
            return super().create_refund(req)

    receiver = Slow(guarantees=guarantees(keys=True, lookup=True, authoritative=True))
    monkeypatch.setattr("actions.kinds.refund.contract.provider_from_settings", lambda: receiver)
    actions = [authorized_refund(agent_actor) for _ in range(6)]
    dispatcher = Dispatcher(concurrency=2, batch_size=16, idle_seconds=0.01)
    thread = in_a_thread(dispatcher)
    try:
        wait_until(lambda: len(seen) == 2, timeout=10, what="two calls in flight")
        time.sleep(0.3)  # give a wrongly eager claim loop the chance to claim more
        statuses = sorted(Action.objects.filter(pk__in=[a.pk for a in actions]).values_list("status", flat=True))
        assert statuses == sorted([S.SUBMITTING] * claimed_at_most + [S.AUTHORIZED] * (6 - claimed_at_most))
        assert Attempt.objects.filter(action__in=actions).count() == claimed_at_most
        assert len(seen) == 2, "a call started without a free thread"
    finally:
        release.set()
        wait_until(
            lambda: not Action.objects.filter(pk__in=[a.pk for a in actions]).exclude(status=S.SUCCEEDED).exists(),
            timeout=20,
            what="every action to succeed",
        )
        dispatcher.stop.set()
        thread.join(timeout=10)
    assert receiver.calls.count("create_refund") == 6
    assert dispatcher.peak_outstanding == claimed_at_most


def test_a_dispatcher_whose_claim_fails_claims_nothing_and_carries_on(
    agent_actor: Actor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim that fails (a deadlock with another batch, a restart of the database) rolls back
    whole; the dispatcher logs it and claims the same actions again later (invariant 8)."""
    receiver = FakeReceiver(guarantees=guarantees(keys=True, lookup=True, authoritative=True))
    monkeypatch.setattr("actions.kinds.refund.contract.provider_from_settings", lambda: receiver)
    actions = [authorized_refund(agent_actor) for _ in range(2)]
    real = module.submission_begin_batch
    failures = iter([RuntimeError("deadlock detected")])

    def flaky(**kwargs: Any) -> Any:
        for error in failures:
            raise error
        return real(**kwargs)

    monkeypatch.setattr(module, "submission_begin_batch", flaky)
    dispatcher = Dispatcher(concurrency=2, batch_size=2, idle_seconds=0.01, max_idle_seconds=0.05)
    run_until_drained(dispatcher, actions)

    assert dispatcher.stats.errors == 1
    assert {a.status for a in Action.objects.filter(pk__in=[a.pk for a in actions])} == {S.SUCCEEDED}
    assert len(receiver.refunds) == 2


def test_the_dispatcher_refuses_settings_that_would_cap_it_silently_and_says_why() -> None:
    for concurrency, batch_size in ((0, 4), (4, 0)):
        with pytest.raises(ValueError, match=r"^concurrency and batch_size must be at least 1$"):
            Dispatcher(concurrency=concurrency, batch_size=batch_size)
    Dispatcher(concurrency=1, batch_size=1)



def test_the_dispatcher_command_refuses_a_pool_too_small_for_its_threads_loop_and_recorder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """C calling threads, the claim loop and the recorder thread each hold a connection: a pool of
    C + 1 would silently cap the calls in flight, so the command says so and starts nothing."""
    database = django_settings.DATABASES["default"]
    options = {**database.get("OPTIONS", {}), "pool": {"min_size": 1, "max_size": 9}}
    monkeypatch.setitem(database, "OPTIONS", options)  # read by the command, no query made
    # Were the pool let through, the test fails here instead of dispatching for ever.
    monkeypatch.setattr(Dispatcher, "run", lambda self, **kwargs: pytest.fail("the command started a dispatcher"))
    with pytest.raises(CommandError) as refused:
        call_command("dispatcher", concurrency=8, batch=4)
    assert str(refused.value) == (
        "DATABASE_POOL_MAX is 9: it must be at least --concurrency + 2 (10: a connection for each "
        "calling thread, the claim loop and the recorder), or the pool would silently cap the calls in flight."
    )
