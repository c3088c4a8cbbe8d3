"""The same proposal delivered several times at once, on PostgreSQL with one connection per thread.

docs/architecture.md section 3: a UNIQUE constraint on the action id makes concurrent proposals produce one
row. An agent that times out and retries, or two copies of one webhook, must not create two
refunds, and a concurrent proposal with another amount must be refused as a conflict rather than
overwrite or join the first.

Threads line up on a barrier. Left alone, whichever thread commits first may let the others find
its row with the plain existence check, so the modes marked "hold" also stop every thread between
that check and its INSERT: then all of them race on the constraint itself, which is the case it
exists for. Two of those modes also choose which thread inserts first, so both outcomes of the
conflict race (the odd proposal wins, or loses) are exercised every run, not by luck.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection

import actions.services
from actions.kinds.refund.proposal import action_propose_refund
from actions.models import Action, ActionEvent, Agent, Order
from actions.services import Actor, ProposalConflict, ProposalResult
from approvals.models import Approval
from tests.factories import make_agent, make_order, make_request, make_user

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

PROPOSERS = 8  # with the test's own connection, inside the connection pool's default of 10
ROUNDS = 3  # a fresh refund request each round, so that more than one interleaving is likely
TIMEOUT = 30


@pytest.fixture
def dispatched(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Action pks whose dispatch was published on commit, from whichever thread committed."""
    calls: list[int] = []
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", calls.append)
    return calls


@pytest.fixture
def order(db: Any) -> Order:
    order = make_order(number="4821", currency="EUR", captured="500.00")
    for number in range(1, ROUNDS + 1):
        make_request(order, number)
    return order


@pytest.fixture
def agent(db: Any) -> Agent:
    agent = make_agent(make_user("otto.owner", "agent"))
    # Loaded here so that the threads share a fully loaded object and never lazy-load it.
    assert agent.owner.pk is not None
    return agent


@contextmanager
def insert_race(*, hold: bool, first: str | None = None) -> Iterator[None]:
    """Hold every proposer between the existence check and the INSERT (when ``hold``).

    ``Order.refundable_amount`` is read after the existence check and before the INSERT, so a
    thread waiting inside it has already found no row. With ``first`` set, that thread goes on
    alone and the others only follow once it has written its row (not yet committed): their
    INSERTs then wait on its lock and fail on the constraint when it commits.

    Its own MonkeyPatch, so that leaving the block undoes these patches and no others.
    """
    if not hold:
        yield
        return
    barrier = threading.Barrier(PROPOSERS)
    first_wrote = threading.Event()
    real_balance = Order.refundable_amount.fget  # type: ignore[attr-defined]
    real_event_record = actions.services.event_record

    held = threading.local()

    def held_balance(order: Order) -> Decimal:
        # Only a thread's first read is the proposal's balance check; later reads (the
        # auto-approval policy checks the balance too) pass straight through.
        if getattr(held, "done", False):
            return real_balance(order)
        held.done = True
        barrier.wait(timeout=TIMEOUT)
        if first is not None and threading.current_thread().name != first:
            assert first_wrote.wait(timeout=TIMEOUT), f"{first} never wrote its row"
        return real_balance(order)

    def signalling_event_record(**kwargs: Any) -> ActionEvent:
        event = real_event_record(**kwargs)
        if threading.current_thread().name == first:
            first_wrote.set()
        return event

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Order, "refundable_amount", property(held_balance))
        patch.setattr(actions.services, "event_record", signalling_event_record)
        yield


def propose_at_once(calls: list[Callable[[], ProposalResult]]) -> list[ProposalResult | BaseException]:
    """Run each call in its own thread and database connection, released together."""
    barrier = threading.Barrier(len(calls))
    outcomes: list[ProposalResult | BaseException | None] = [None] * len(calls)

    def run(index: int, call: Callable[[], ProposalResult]) -> None:
        try:
            # Connected before the barrier, so the calls start together rather than staggered
            # by connection set-up.
            connection.ensure_connection()
            barrier.wait(timeout=TIMEOUT)
            outcomes[index] = call()
        except BaseException as exc:
            outcomes[index] = exc
        finally:
            connection.close()

    threads = [
        threading.Thread(target=run, args=(index, call), name=f"proposer-{index}") for index, call in enumerate(calls)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=TIMEOUT)
    assert not any(thread.is_alive() for thread in threads), "a proposer is stuck (a lock never released?)"
    assert all(outcome is not None for outcome in outcomes)
    return [outcome for outcome in outcomes if outcome is not None]


def proposal(*, agent: Agent, request_number: int, amount: str) -> Callable[[], ProposalResult]:
    def call() -> ProposalResult:
        return action_propose_refund(
            order_number="4821",
            request_number=request_number,
            amount=amount,
            currency="EUR",
            reason_code="damaged",
            evidence="Delivered twice by a retrying agent.",
            proposer=Actor.for_agent(agent),
        )

    return call


@pytest.mark.parametrize("hold", [False, True], ids=["free", "hold"])
@pytest.mark.parametrize(
    ("amount", "auto_approved"), [("40.00", False), ("10.00", True)], ids=["manual", "auto-approved"]
)
def test_concurrent_identical_proposals_make_one_action(
    order: Order,
    agent: Agent,
    dispatched: list[int],
    hold: bool,
    amount: str,
    auto_approved: bool,
    settings: Any,
) -> None:
    """Invariant 1 starts here: one business action is one row, whoever delivers it how often.
    Invariant 9: it has exactly one proposal event, and one approval event when auto-approved."""
    # Every round auto-approves on the same order: raise the caps on autonomy, which
    # would otherwise rightly hold the third one for a manager. tests/security covers the caps.
    settings.AUTO_APPROVAL_TARGET_MAX_COUNT = ROUNDS
    settings.AUTO_APPROVAL_TARGET_MAX_AMOUNTS = {"EUR": Decimal("1000")}
    for request_number in range(1, ROUNDS + 1):
        with insert_race(hold=hold):
            outcomes = propose_at_once(
                [proposal(agent=agent, request_number=request_number, amount=amount) for _ in range(PROPOSERS)]
            )

        errors = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
        assert not errors, f"a duplicate delivery raised instead of returning the action: {errors!r}"
        results = [outcome for outcome in outcomes if isinstance(outcome, ProposalResult)]
        action_id = f"refund:order-4821:request-{request_number}"
        row = Action.objects.get(action_id=action_id)
        assert {result.action.pk for result in results} == {row.pk}
        assert [result.created for result in results].count(True) == 1
        assert row.status == ("AUTHORIZED" if auto_approved else "PROPOSED")
        transitions = sorted(ActionEvent.objects.filter(action=row).values_list("transition", flat=True))
        assert transitions == (["approve", "propose"] if auto_approved else ["propose"])
        assert Approval.objects.filter(action=row).count() == (1 if auto_approved else 0)
        assert dispatched.count(row.pk) == (1 if auto_approved else 0)

    assert Action.objects.count() == ROUNDS


@pytest.mark.parametrize(
    ("hold", "first"),
    [(False, None), (True, None), (True, "proposer-0"), (True, f"proposer-{PROPOSERS - 1}")],
    ids=["free", "hold", "same-amount-inserts-first", "other-amount-inserts-first"],
)
def test_a_concurrent_proposal_with_another_amount_is_a_conflict(
    order: Order, agent: Agent, dispatched: list[int], hold: bool, first: str | None
) -> None:
    """Invariant 4: a different amount is a different business action. Whichever proposal is
    recorded first, the other is refused as a conflict naming the amount, and there is one row."""
    amounts = ["40.00"] * (PROPOSERS - 1) + ["41.00"]
    for request_number in range(1, ROUNDS + 1):
        with insert_race(hold=hold, first=first):
            outcomes = propose_at_once(
                [proposal(agent=agent, request_number=request_number, amount=amount) for amount in amounts]
            )

        row = Action.objects.get(action_id=f"refund:order-4821:request-{request_number}")
        if first is not None:
            assert row.amount == Decimal(amounts[int(first.removeprefix("proposer-"))])
        for amount, outcome in zip(amounts, outcomes, strict=True):
            if Decimal(amount) == row.amount:
                assert isinstance(outcome, ProposalResult), f"{amount}: {outcome!r}"
                assert outcome.action.pk == row.pk
            else:
                assert isinstance(outcome, ProposalConflict), f"{amount}: {outcome!r}"
                assert outcome.action.pk == row.pk
                assert set(outcome.differing) == {"amount"}
                assert outcome.differing["amount"]["proposed"] == amount
        created = [outcome.created for outcome in outcomes if isinstance(outcome, ProposalResult)]
        assert created.count(True) == 1
        assert list(ActionEvent.objects.filter(action=row).values_list("transition", flat=True)) == ["propose"]

    assert Action.objects.count() == ROUNDS
    assert ActionEvent.objects.count() == ROUNDS
