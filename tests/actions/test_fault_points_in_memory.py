"""Where the named fault points sit, checked in memory: the crash tests (tests/faults) kill real
workers at these points; here the kill is replaced by an exception so that a fast test can see
what was committed at that instant. A fault point that moved (or whose name changed) would make
the crash tests kill the worker somewhere else, or nowhere."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.utils import timezone

from actions.engine import faults
from actions.engine.claim import submission_begin
from actions.engine.dispatch import submission_send_and_record
from actions.engine.dispatcher import RecordGroups, _send_and_record
from actions.engine.reconcile import reconcile_action
from actions.kinds.refund.contract import RefundReceiver
from actions.models import Action, ActionEvent, ActionStatus, Attempt, AttemptKind
from actions.services import Actor
from tests.actions.test_dispatcher_fence import claimed
from tests.actions.test_reconciliation import (
    NO_LOOKUP_NO_KEYS,
    FakeReceiver,
    authorized_refund,
    guarantees,
    unknown_and_due,
)

pytestmark = pytest.mark.django_db(transaction=True)
S = ActionStatus


class Killed(Exception):
    """The worker would have been killed here."""


@pytest.fixture
def kill_at(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def kill(pid: int, sig: int) -> None:
        raise Killed()

    monkeypatch.setattr(faults.os, "kill", kill)
    yield


@pytest.mark.parametrize(
    "contract", [guarantees(keys=True, lookup=True, authoritative=True), NO_LOOKUP_NO_KEYS], ids=["lookup", "no-lookup"]
)
def test_during_reconciliation_is_after_the_claim_and_before_the_record(
    agent_actor: Actor, kill_at: None, monkeypatch: pytest.MonkeyPatch, contract: object
) -> None:
    """Killed there, the reconciler leaves its lease and an unanswered lookup attempt: the next
    reconciler takes over once the lease passes; nothing was decided."""
    monkeypatch.setenv("CONSOLE_FAULT_POINTS", "during_reconciliation")
    action = unknown_and_due(agent_actor)
    fake = FakeReceiver(contract)  # type: ignore[arg-type]

    with pytest.raises(Killed):
        reconcile_action(action_pk=action.pk, receiver=RefundReceiver(fake))

    action.refresh_from_db()
    assert action.status == S.UNKNOWN and action.lease_token is not None
    lookup = Attempt.objects.get(action=action, kind=AttemptKind.LOOKUP)
    assert (lookup.outcome, lookup.finished_at) == ("", None)
    assert fake.calls == (["find_refunds"] if contract is not NO_LOOKUP_NO_KEYS else [])


def test_other_fault_points_leave_reconciliation_alone(
    agent_actor: Actor, kill_at: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the named point kills: the others switched on, a reconciliation runs to its end."""
    monkeypatch.setenv("CONSOLE_FAULT_POINTS", "before_provider_call,after_record,during_invalidation")
    action = unknown_and_due(agent_actor)

    assert reconcile_action(action_pk=action.pk, receiver=RefundReceiver(FakeReceiver(NO_LOOKUP_NO_KEYS))) == (
        S.NEEDS_REVIEW
    )


def test_without_a_receiver_the_actions_own_kind_answers(agent_actor: Actor, monkeypatch: pytest.MonkeyPatch) -> None:
    action = unknown_and_due(agent_actor)
    fake = FakeReceiver(NO_LOOKUP_NO_KEYS)
    asked_for: list[object] = []

    def receiver_for(of: Action) -> RefundReceiver:
        asked_for.append(of)
        return RefundReceiver(fake)

    monkeypatch.setattr("actions.engine.reconcile.receiver_for", receiver_for)

    assert reconcile_action(action_pk=action.pk) == S.NEEDS_REVIEW

    [of] = asked_for
    assert isinstance(of, Action) and of.pk == action.pk
    # A receiver with no lookup: straight to a person, saying why, with the pass as evidence.
    escalation = ActionEvent.objects.get(action=action, transition="escalate")
    lookup = Attempt.objects.get(action=action, kind=AttemptKind.LOOKUP)
    assert escalation.reason.startswith("The receiver has no lookup: only a person can find out what happened. ")
    assert escalation.evidence == {"attempt_id": lookup.pk, "verdict": "no_lookup", "owner": None}  # no finance here
    assert fake.calls == [], "a receiver with no lookup is not asked"


def test_a_kill_during_invalidation_comes_after_the_stale_transition_inside_its_transaction(
    agent_actor: Actor, monkeypatch: pytest.MonkeyPatch, dispatched: list[int]
) -> None:
    """The crash test (tests/faults/test_invalidation_crash.py) kills a real worker at
    ``during_invalidation``; here the kill is an exception, and the transaction it interrupts
    rolls the STALE back: the action stays AUTHORIZED for the next claim."""

    def kill(pid: int, sig: int) -> None:
        assert Action.objects.get(pk=action.pk).status == S.STALE  # inside the transaction
        raise Killed()

    monkeypatch.setattr(faults.os, "kill", kill)
    monkeypatch.setenv("CONSOLE_FAULT_POINTS", "during_invalidation")
    action = authorized_refund(agent_actor)

    with pytest.raises(Killed):
        submission_begin(action_pk=action.pk, now=timezone.now() + timedelta(days=2))

    assert Action.objects.get(pk=action.pk).status == S.AUTHORIZED
    assert not ActionEvent.objects.filter(action=action, transition="invalidate").exists()


# The dispatcher's three points: after the committed claim and before the call; after the
# receiver answered and before the record; after the record committed.
DISPATCH_POINTS = {
    "before_provider_call": ([], S.SUBMITTING, False),
    "after_provider_answer": (["create_refund"], S.SUBMITTING, False),
    "after_record": (["create_refund"], S.SUCCEEDED, True),
}


@pytest.mark.parametrize("point", sorted(DISPATCH_POINTS))
def test_a_kill_in_the_dispatch_leaves_what_was_committed_before_that_point(
    agent_actor: Actor, kill_at: None, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    """Killed before the call, nothing was sent; killed after the answer, the receiver has it but
    the console does not (the lease expires to UNKNOWN, reconciliation asks); killed after the
    record, it is all there."""
    monkeypatch.setenv("CONSOLE_FAULT_POINTS", point)
    calls, status, answered = DISPATCH_POINTS[point]
    action, attempt, token = claimed(agent_actor)
    fake = FakeReceiver(guarantees(keys=True, lookup=True, authoritative=True))

    with pytest.raises(Killed):
        submission_send_and_record(action=action, attempt=attempt, lease_token=token, receiver=RefundReceiver(fake))

    assert fake.calls == calls
    assert Action.objects.get(pk=action.pk).status == status
    assert (Attempt.objects.get(pk=attempt.pk).finished_at is not None) == answered


def test_other_fault_points_leave_a_dispatch_alone(
    agent_actor: Actor, kill_at: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONSOLE_FAULT_POINTS", "during_reconciliation,during_invalidation")
    action, attempt, token = claimed(agent_actor)
    fake = FakeReceiver(guarantees(keys=True, lookup=True, authoritative=True))

    result = submission_send_and_record(
        action=action, attempt=attempt, lease_token=token, receiver=RefundReceiver(fake)
    )

    assert result == S.SUCCEEDED


@pytest.mark.parametrize("point", sorted(DISPATCH_POINTS))
def test_the_dispatcher_process_passes_the_same_points_in_the_same_order(
    agent_actor: Actor, kill_at: None, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    """The dispatcher process (actions.engine.dispatcher) sends and records on its own path, with
    records grouped: the crash tests kill it at the same three points, which must sit where they
    sit in a Celery worker's dispatch."""
    monkeypatch.setenv("CONSOLE_FAULT_POINTS", point)
    calls, status, answered = DISPATCH_POINTS[point]
    claim = submission_begin(action_pk=authorized_refund(agent_actor).pk)
    assert claim.action is not None and claim.attempt is not None
    fake = FakeReceiver(guarantees(keys=True, lookup=True, authoritative=True))
    monkeypatch.setattr("actions.engine.send.receiver_for", lambda action: RefundReceiver(fake))

    with pytest.raises(Killed):
        _send_and_record(claim, RecordGroups())

    assert fake.calls == calls
    assert Action.objects.get(pk=claim.action.pk).status == status
    assert (Attempt.objects.get(pk=claim.attempt.pk).finished_at is not None) == answered
