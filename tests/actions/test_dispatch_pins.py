"""Pins for edges of ``actions.engine.dispatch`` that the scenario tests pass through without
looking: written against the survivors of ``make mutate MODULE=actions.engine.dispatch``
(tests/MUTATION.md, sixth batch)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from actions.engine import outcomes, send
from actions.engine.dispatch import execution_dispatch, submission_send_and_record
from actions.engine.outcomes import next_reconcile_time
from actions.engine.record import submission_record
from actions.engine.send import receiver_send
from actions.kinds.base import Answer, Outcome
from actions.kinds.refund.contract import RefundReceiver, refund_contract
from actions.models import Action, ActionEvent, ActionStatus
from actions.providers.base import AmbiguousError, IdempotencyMismatchError
from actions.services import Actor
from tests.actions.test_dispatcher_fence import claimed
from tests.actions.test_reconciliation import FakeReceiver, authorized_refund, guarantees
from tests.approvals.test_policy_pins import other_session  # noqa: F401 -- a fixture
from tests.factories import make_user

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


class Answering:
    def __init__(self) -> None:
        self.sent: list[Action] = []

    def send(self, action: Action) -> Answer:
        self.sent.append(action)
        return Answer(Outcome.UNKNOWN, error=TimeoutError("read timed out"))


def test_a_receiver_call_inside_a_transaction_is_refused_before_it_is_made(
    agent_actor: Actor, dispatched: list[int]
) -> None:
    """Intent before effect: a call made with a transaction open would hold its row locks for as
    long as the receiver takes, and commit the intent only after the effect."""
    action = authorized_refund(agent_actor)
    receiver = Answering()

    with transaction.atomic(), pytest.raises(AssertionError) as refused:
        receiver_send(action=action, receiver=receiver)  # type: ignore[arg-type]

    assert str(refused.value) == "a network call must not run inside a transaction"
    assert receiver.sent == []


def test_without_a_receiver_the_actions_own_kind_sends_it(
    agent_actor: Actor, dispatched: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    action = authorized_refund(agent_actor)
    receiver = Answering()
    asked_for: list[Any] = []

    def receiver_for(of: Action) -> Answering:
        asked_for.append(of)
        return receiver

    monkeypatch.setattr(send, "receiver_for", receiver_for)

    answer = receiver_send(action=action)

    assert answer.outcome == Outcome.UNKNOWN
    assert asked_for == [action] and receiver.sent == [action]


@pytest.mark.parametrize(
    ("lookup", "timed_out", "status"),
    [(True, False, ActionStatus.SUCCEEDED), (False, False, ActionStatus.SUCCEEDED), (True, True, ActionStatus.UNKNOWN)],
    ids=["answered", "answered-by-a-receiver-nobody-can-ask", "timed-out-reconcilable"],
)
def test_the_lease_holders_record_reads_nothing_back_when_it_has_its_claims_copy(
    agent_actor: Actor, dispatched: list[int], lookup: bool, timed_out: bool, status: str
) -> None:
    """The record's UPDATE is fenced on the status and the lease token, so the action it
    was claimed with is enough; reading the row again under a lock would cost one more statement
    and one more lock per action. Only an answer a person must see reads the row first (below,
    and tests/actions/test_dispatcher_fence.py): not a success, even from a receiver that cannot
    be asked, and not a timeout that reconciliation can still resolve."""
    action, attempt, token = claimed(agent_actor)
    fake = FakeReceiver(guarantees(keys=lookup, lookup=lookup, authoritative=lookup))
    if timed_out:
        fake.create_error = AmbiguousError("read timed out", code="timeout")

    with CaptureQueriesContext(connection) as queries:
        result = submission_send_and_record(
            action=action, attempt=attempt, lease_token=token, receiver=RefundReceiver(fake)
        )

    assert result == status
    action_reads = [q["sql"] for q in queries if q["sql"].startswith("SELECT") and '"actions_action"' in q["sql"]]
    assert action_reads == []
    assert not [q["sql"] for q in queries if "FOR UPDATE" in q["sql"]]


def test_a_record_without_a_lease_token_holds_no_lease_and_changes_nothing(
    agent_actor: Actor, dispatched: list[int]
) -> None:
    """Invariant 3: the fence is the token the claim committed. A record that lost it (a caller's
    bug, as mutation testing showed: the dispatcher's record with ``lease_token=None``) must be
    fenced off like a late worker, not recorded unfenced over whoever holds the lease now."""
    action, attempt, token = claimed(agent_actor)
    fake = FakeReceiver(guarantees(keys=True, lookup=True, authoritative=True))

    result = submission_send_and_record(action=action, attempt=attempt, lease_token=None, receiver=RefundReceiver(fake))  # type: ignore[arg-type]

    assert result == "lease_lost"
    stored = Action.objects.get(pk=action.pk)
    assert (stored.status, stored.lease_token) == (ActionStatus.SUBMITTING, token)
    attempt.refresh_from_db()
    assert (attempt.held_lease, attempt.outcome) == (False, "succeeded")
    assert not ActionEvent.objects.filter(action=action, transition="record_success").exists()


@pytest.mark.parametrize(("failures", "doublings"), [(0, 0), (1, 1), (3, 3), (6, 6), (7, 6), (20, 6)])
def test_reconciliation_backs_off_by_doubling_up_to_64_times_with_a_quarter_of_jitter(
    monkeypatch: pytest.MonkeyPatch, settings: Any, failures: int, doublings: int
) -> None:
    """After the receiver's visibility delay: the base backoff doubled per failed pass, at most six
    times, plus up to a quarter of it at random (so that a crowd of UNKNOWN actions spreads out)."""
    settings.RECONCILE_BASE_BACKOFF_SECONDS = 10
    drawn: list[tuple[float, float]] = []

    def uniform(low: float, high: float) -> float:
        drawn.append((low, high))
        return high

    monkeypatch.setattr(outcomes, "random", SimpleNamespace(uniform=uniform))
    now = timezone.now()
    contract = refund_contract(guarantees(keys=True, lookup=True, authoritative=True, visibility=timedelta(seconds=5)))
    action = SimpleNamespace(reconcile_failures=failures, kind="refund")

    due = next_reconcile_time(action=action, now=now, contract=contract)  # type: ignore[arg-type]

    base = 10 * 2**doublings
    assert drawn == [(0, base * 0.25)]
    assert due == now + timedelta(seconds=5 + base + base * 0.25)


def test_a_negative_visibility_delay_counts_as_none(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    settings.RECONCILE_BASE_BACKOFF_SECONDS = 10
    monkeypatch.setattr(outcomes, "random", SimpleNamespace(uniform=lambda low, high: low))
    now = timezone.now()
    early = guarantees(keys=True, lookup=True, authoritative=True, visibility=timedelta(seconds=-30))
    action = SimpleNamespace(reconcile_failures=0)

    due = next_reconcile_time(action=action, now=now, contract=refund_contract(early))  # type: ignore[arg-type]

    assert due == now + timedelta(seconds=10)


def test_a_dispatch_message_waits_for_a_row_lock_rather_than_dropping_the_action(
    agent_actor: Actor,
    dispatched: list[int],
    monkeypatch: pytest.MonkeyPatch,
    other_session: psycopg.Connection[Any],  # noqa: F811 -- the imported fixture
) -> None:
    """The task's dispatch (``skip_locked=False``, the default) waits for a transaction that holds
    the action's row and then claims it if it is still AUTHORIZED: a message that skipped the row
    instead would leave the action to the next sweep. (The sweeps do skip: another sweep or
    worker is already on it.)"""
    action = authorized_refund(agent_actor)
    fake = FakeReceiver(guarantees(keys=True, lookup=True, authoritative=True))
    monkeypatch.setattr(send, "receiver_for", lambda of: RefundReceiver(fake))
    other_session.execute("SELECT id FROM actions_action WHERE id = %s FOR UPDATE", [action.pk])
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (claimer,) = cursor.fetchone()
    released: list[bool] = []

    def release_once_the_claim_waits() -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            row = other_session.execute(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [claimer]
            ).fetchone()
            if row is not None and row[0] == "Lock":
                other_session.rollback()
                released.append(True)
                return
            time.sleep(0.01)
        other_session.rollback()

    releaser = threading.Thread(target=release_once_the_claim_waits)
    releaser.start()
    try:
        result = execution_dispatch(action_pk=action.pk)
    finally:
        releaser.join()

    assert released == [True], "the claim never waited for the lock"
    assert result == ActionStatus.SUCCEEDED
    assert fake.calls == ["create_refund"]


def test_an_unknown_answer_from_a_receiver_nobody_can_ask_goes_to_a_person_at_once_saying_why(
    agent_actor: Actor, dispatched: list[int], finance: Any
) -> None:
    """docs/architecture.md section 4, SUBMITTING -> NEEDS_REVIEW: no lookup and no keys, so no reconciliation
    pass could ever tell; the event says so, with the answer and the attempt as evidence."""
    action, attempt, token = claimed(agent_actor)
    fake = FakeReceiver(guarantees(keys=False, lookup=False, authoritative=False))
    fake.create_error = AmbiguousError("read timed out", code="timeout")

    result = submission_send_and_record(
        action=action, attempt=attempt, lease_token=token, receiver=RefundReceiver(fake)
    )

    assert result == ActionStatus.NEEDS_REVIEW
    event = ActionEvent.objects.get(action=action, transition="escalate")
    assert event.actor_label == "system:dispatcher"
    assert event.reason == (
        "The outcome is unknown (AmbiguousError: read timed out (code=timeout)) and the receiver has no lookup and "
        "no idempotency keys: only a person can find out what happened. Assigned to fiona.finance "
        "(the owner group's member with the fewest open items)."
    )
    assert event.evidence == {
        "answer": "AmbiguousError: read timed out (code=timeout)",
        "source": "submission",
        "attempt_id": attempt.pk,
        "owner": "fiona.finance",
    }


@pytest.mark.parametrize("answer_kind", ["key-mismatch", "timeout-nobody-can-ask"])
def test_an_answer_that_needs_a_person_reads_the_row_first_and_keeps_the_owner_finance_set_meanwhile(
    agent_actor: Actor, dispatched: list[int], finance: Any, answer_kind: str
) -> None:
    """The record's fast path trusts the claim's copy of the action; an escalation does not, because
    it picks the person from the row as it is now: an owner finance assigned during the call stays
    the owner, rather than the group's least busy member."""
    action, attempt, token = claimed(agent_actor)
    assigned = make_user("gus.finance", "finance")
    Action.objects.filter(pk=action.pk).update(owner=assigned)
    if answer_kind == "key-mismatch":
        answer = Answer(Outcome.NEEDS_REVIEW, error=IdempotencyMismatchError("key reused", code="idempotency_error"))
    else:
        answer = Answer(Outcome.UNKNOWN, error=AmbiguousError("read timed out", code="timeout"))
    contract = RefundReceiver(FakeReceiver(guarantees(keys=False, lookup=False, authoritative=False))).contract

    result = submission_record(
        action_pk=action.pk,
        attempt_pk=attempt.pk,
        lease_token=token,
        answer=answer,
        contract=contract,
        action=action,
    )

    assert result == ActionStatus.NEEDS_REVIEW
    assert Action.objects.get(pk=action.pk).owner == assigned
    assert ActionEvent.objects.get(action=action, transition="escalate").reason.endswith(
        "Assigned to gus.finance (already its owner)."
    )
