"""The dispatcher's lease fence (docs/architecture.md section 6, invariant 3).

SUBMITTING is a lease, not a marker: only the worker holding the current lease token may record
the receiver's answer on the action. A worker whose lease expired mid-call still stores what the
receiver said, on its own attempt, as evidence; the action's state and the order's money are then
decided by whoever holds the lease now (the reconciler, or the worker sending the retry).

These tests drive the expiry by hand: claim, let the lease sweep mark the action UNKNOWN, let a
reconciler or a retry take a new lease, then deliver the first worker's late answer through
``submission_record`` exactly as the dispatcher does.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.conf import settings

from actions.engine.claim import ClaimOutcome, submission_begin
from actions.engine.reconcile import reconcile_action, reconcile_claim
from actions.engine.record import submission_record
from actions.engine.sweeps import sweep_expired_leases
from actions.kinds.base import Answer, Outcome
from actions.kinds.refund.contract import RefundReceiver, answer_from_refund
from actions.models import Action, ActionEvent, ActionStatus, Attempt, AttemptKind, Order, Remedy
from actions.providers.base import (
    AmbiguousError,
    CreateRefund,
    DefinitiveError,
    IdempotencyMismatchError,
    ProviderRefund,
    RefundStatus,
)
from actions.services import Actor
from tests.actions.test_reconciliation import AMOUNT, FakeReceiver, authorized_refund, guarantees

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

S = ActionStatus


@pytest.fixture(autouse=True)
def no_broker(dispatched: list[int]) -> list[int]:
    """Approval publishes its dispatch on commit; these tests dispatch by hand instead."""
    return dispatched


# --- the late worker's answers ---------------------------------------------------------------


def receiver_refund(action: Action, status: RefundStatus, refund_id: str = "re_late_1") -> ProviderRefund:
    raw = {
        "id": refund_id,
        "object": "refund",
        "charge": action.payload["charge"],
        "amount": int(AMOUNT * 100),
        "currency": action.currency.lower(),
        "status": str(status),
        "metadata": {"action_id": action.action_id},
    }
    return ProviderRefund(
        id=refund_id,
        charge=action.payload["charge"],
        amount_minor=int(AMOUNT * 100),
        currency=action.currency.lower(),
        status=status,
        metadata={"action_id": action.action_id},
        created=int(time.time()),
        raw=raw,
    )


# Every kind of answer a late worker can bring back: each one, recorded on the action by a worker
# that no longer holds the lease, would move the state, the money, or open a remedy.
LATE_ANSWERS: dict[str, Callable[[Action], Answer]] = {
    "succeeded": lambda action: answer_from_refund(receiver_refund(action, RefundStatus.SUCCEEDED)),
    "pending": lambda action: answer_from_refund(receiver_refund(action, RefundStatus.PENDING)),
    "failed": lambda action: Answer(
        Outcome.FAILED_FINAL, error=DefinitiveError("amount exceeds the charge", code="amount_too_large")
    ),
    "timed_out": lambda action: Answer(Outcome.UNKNOWN, error=AmbiguousError("read timed out", code="timeout")),
    "key_mismatch": lambda action: Answer(
        Outcome.NEEDS_REVIEW, error=IdempotencyMismatchError("key reused", code="idempotency_error")
    ),
}


# --- what must not change ---------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """Everything a late answer must leave alone: the action's state and lease, the order's money,
    the audit trail and the follow-ups."""

    status: str
    lease_token: uuid.UUID | None
    provider_reference: str
    owner_id: int | None
    refunded: Decimal
    reserved: Decimal
    version: int
    events: int
    remedies: int

    @classmethod
    def of(cls, action_pk: int) -> Snapshot:
        action = Action.objects.get(pk=action_pk)
        order = Order.objects.get(pk=action.order_id)
        return cls(
            status=action.status,
            lease_token=action.lease_token,
            provider_reference=action.provider_reference,
            owner_id=action.owner_id,
            refunded=order.refunded_amount,
            reserved=order.reserved_amount,
            version=order.version,
            events=ActionEvent.objects.filter(action_id=action_pk).count(),
            remedies=Remedy.objects.filter(action_id=action_pk).count(),
        )


def claimed(proposer: Actor) -> tuple[Action, Attempt, uuid.UUID]:
    """An authorised refund, claimed by the first dispatcher: SUBMITTING, amount reserved."""
    action = authorized_refund(proposer)
    claim = submission_begin(action_pk=action.pk)
    assert claim.outcome == ClaimOutcome.CLAIMED
    assert claim.action is not None and claim.attempt is not None and claim.lease_token is not None
    return claim.action, claim.attempt, claim.lease_token


def expire_lease(action: Action) -> datetime:
    """Run the lease sweep just after the first worker's lease ran out; returns the sweep's time."""
    assert action.lease_expires_at is not None
    swept_at = action.lease_expires_at + timedelta(seconds=1)
    assert sweep_expired_leases(now=swept_at) >= 1
    action.refresh_from_db()
    assert action.status == S.UNKNOWN
    return swept_at


# --- (a) the late answer arrives while a reconciler holds the lease on the UNKNOWN action ----------


# How the late worker records: from the row read under a lock (``action`` not given), or, as the
# dispatcher does, from its own copy of the action as its claim committed it, where the UPDATE
# itself is fenced on the status and the token and nothing is read first. Both must hold.
RECORD_FROM = ["locked_row", "workers_copy"]


def workers_copy(action: Action, record_from: str) -> Action | None:
    """The late worker's copy of the action, taken when its claim committed (before any sweep)."""
    return Action.objects.get(pk=action.pk) if record_from == "workers_copy" else None


@pytest.mark.parametrize("record_from", RECORD_FROM)
@pytest.mark.parametrize("late", sorted(LATE_ANSWERS))
def test_a_late_dispatchers_answer_during_reconciliation_is_kept_on_its_attempt_only(
    agent_actor: Actor, late: str, record_from: str
) -> None:
    """Invariant 3: the dispatcher's lease expired mid-call, the sweep marked the action UNKNOWN and
    a reconciler took a new lease. The first worker's answer, arriving now, is stored on its own
    attempt with held_lease = false; the action stays UNKNOWN under the reconciler's lease and the
    order's money is untouched, whatever the answer said."""
    action, attempt, first_token = claimed(agent_actor)
    as_claimed = workers_copy(action, record_from)
    swept_at = expire_lease(action)
    visible_at = swept_at + timedelta(seconds=settings.PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS + 1)
    reconciler = reconcile_claim(action_pk=action.pk, now=visible_at)
    assert reconciler is not None, "the reconciler must be able to take the swept action"
    _, lookup_attempt, reconciler_token = reconciler
    assert reconciler_token != first_token
    before = Snapshot.of(action.pk)
    assert (before.status, before.refunded, before.reserved) == (S.UNKNOWN, Decimal("0.00"), AMOUNT)

    result = submission_record(
        action_pk=action.pk,
        attempt_pk=attempt.pk,
        lease_token=first_token,
        answer=LATE_ANSWERS[late](action),
        action=as_claimed,
    )

    assert result == "lease_lost"
    assert Snapshot.of(action.pk) == before
    attempt.refresh_from_db()
    assert attempt.held_lease is False
    assert attempt.finished_at is not None
    answer = LATE_ANSWERS[late](action)
    assert attempt.outcome == answer.outcome.value, "the answer is kept as evidence"
    assert (attempt.response, attempt.error) == (answer.response_json(), answer.error_json())
    lookup_attempt.refresh_from_db()
    assert lookup_attempt.finished_at is None, "the reconciler's own attempt is its own to complete"


def test_a_late_dispatchers_answer_after_the_sweep_is_kept_on_its_attempt_only(
    agent_actor: Actor, caplog: pytest.LogCaptureFixture
) -> None:
    """Invariant 3: between the sweep and the reconciler's pass no one holds a lease (the sweep
    dropped the late worker's). Its SUCCEEDED answer is evidence for the reconciler, not a record:
    the action stays UNKNOWN with its money reserved."""
    action, attempt, first_token = claimed(agent_actor)
    expire_lease(action)
    before = Snapshot.of(action.pk)

    result = submission_record(
        action_pk=action.pk, attempt_pk=attempt.pk, lease_token=first_token, answer=LATE_ANSWERS["succeeded"](action)
    )

    assert result == "lease_lost"
    assert Snapshot.of(action.pk) == before
    attempt.refresh_from_db()
    assert attempt.held_lease is False
    assert attempt.response is not None and attempt.response["id"] == "re_late_1"
    # The operator's log names the action, what the receiver said and where it was kept.
    assert (
        f"action_id={action.action_id} lease lost before recording (re_late_1 succeeded); "
        f"the answer is kept on attempt {attempt.pk}"
    ) in caplog.messages


# --- (b) the late answer arrives while a retry holds a new SUBMITTING lease ---------------------


@dataclass
class SlowRetryReceiver(FakeReceiver):
    """A receiver whose create_refund runs ``while_sending`` before it answers: the moment the
    retry's call is in flight and the action is SUBMITTING under the retry's lease."""

    while_sending: Callable[[CreateRefund], None] | None = None

    def create_refund(self, req: CreateRefund) -> ProviderRefund:
        if self.while_sending is not None:
            self.while_sending(req)
        return super().create_refund(req)


@pytest.mark.parametrize("record_from", RECORD_FROM)
@pytest.mark.parametrize("late", sorted(LATE_ANSWERS))
def test_a_late_dispatchers_answer_during_a_retry_is_kept_on_its_attempt_only(
    agent_actor: Actor, late: str, record_from: str
) -> None:
    """Invariant 3: the first dispatcher's lease expired mid-call, the sweep marked the action
    UNKNOWN, the reconciler's authoritative not-found allowed a retry, and the action is back in
    SUBMITTING under the retry's token. The first worker's late answer now arrives: the status is
    SUBMITTING again, but the token is not its own. The answer goes on its attempt with
    held_lease = false; the state, the lease and the money stay the retry's to decide, and the
    retry's answer is the one recorded."""
    action, first_attempt, first_token = claimed(agent_actor)
    as_claimed = workers_copy(action, record_from)
    swept_at = expire_lease(action)
    receiver = SlowRetryReceiver(
        guarantees=guarantees(keys=True, lookup=True, authoritative=True, key_retention=timedelta(hours=24))
    )
    seen: dict[str, Any] = {}

    def late_answer_arrives(req: CreateRefund) -> None:
        before = Snapshot.of(action.pk)
        assert before.status == S.SUBMITTING and before.lease_token not in (None, first_token)
        seen["result"] = submission_record(
            action_pk=action.pk,
            attempt_pk=first_attempt.pk,
            lease_token=first_token,
            answer=LATE_ANSWERS[late](action),
            action=as_claimed,
        )
        seen["before"], seen["after"] = before, Snapshot.of(action.pk)

    receiver.while_sending = late_answer_arrives
    visible_at = swept_at + timedelta(seconds=settings.PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS + 1)

    result = reconcile_action(action_pk=action.pk, receiver=RefundReceiver(receiver), now=visible_at)

    assert receiver.calls == ["find_refunds", "create_refund"], "the retry was sent once"
    assert seen["result"] == "lease_lost"
    assert seen["after"] == seen["before"], "the late answer changed the action or the money"
    assert (seen["before"].refunded, seen["before"].reserved) == (Decimal("0.00"), AMOUNT)
    first_attempt.refresh_from_db()
    assert first_attempt.held_lease is False
    assert first_attempt.outcome == LATE_ANSWERS[late](action).outcome.value

    # The retry, which held the lease throughout, records its own answer: one refund, booked once.
    assert result == S.SUCCEEDED
    [_, retry_attempt] = Attempt.objects.filter(action=action, kind=AttemptKind.SUBMIT).order_by("pk")
    assert retry_attempt.held_lease is True
    action.refresh_from_db()
    order = Order.objects.get(actions=action)
    assert (action.status, action.provider_reference) == (S.SUCCEEDED, "re_fake_1")
    assert (order.refunded_amount, order.reserved_amount) == (AMOUNT, Decimal("0.00"))
    assert not Remedy.objects.filter(action=action).exists()
    success = ActionEvent.objects.filter(action=action, transition="record_success").get()
    assert success.evidence["attempt_id"] == retry_attempt.pk, "the success was recorded by the retry"
