"""Guards around the receiver call in actions.engine.send."""

from __future__ import annotations

import uuid
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from actions.engine import send
from actions.engine.claim import ClaimOutcome, submission_begin
from actions.engine.dispatch import submission_send_and_record
from actions.engine.sweeps import sweep_expired_leases
from actions.kinds.base import Answer, Effect, Outcome
from actions.kinds.refund.proposal import action_propose_refund
from actions.models import Action, ActionStatus, Attempt
from actions.services import Actor
from tests.actions.test_reconciliation import authorized_refund
from tests.factories import make_order, make_request

pytestmark = pytest.mark.django_db(transaction=True)


class RecordingReceiver:
    """Fails the test if it is called at all."""

    contract: Any = None

    def __init__(self) -> None:
        self.calls = 0

    def send(self, action: Any) -> Any:
        self.calls += 1
        raise AssertionError("the provider must not be called")


def test_a_worker_whose_lease_is_nearly_over_does_not_call_the_provider(
    agent_actor: Actor, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant 3: no receiver call without a lease the caller still holds (with a margin for
    the call itself): a worker that stalled after its claim leaves the action to the sweeper."""
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)
    order = make_order(captured="100.00")
    request = make_request(order)
    action = action_propose_refund(
        order_number=order.number,
        request_number=request.number,
        amount="20.00",
        currency="EUR",
        reason_code="damaged",
        proposer=agent_actor,
    ).action
    # Claimed long ago: the lease (60 s) ends within one provider timeout (10 s) from now.
    claim = submission_begin(action_pk=action.pk, now=timezone.now() - timedelta(seconds=55))
    assert claim.outcome == ClaimOutcome.CLAIMED
    assert claim.action is not None and claim.attempt is not None and claim.lease_token is not None
    provider = RecordingReceiver()

    result = submission_send_and_record(
        action=claim.action,
        attempt=claim.attempt,
        lease_token=claim.lease_token,
        receiver=provider,  # type: ignore[arg-type]
    )

    assert result == "lease_too_short"
    assert provider.calls == 0
    assert Action.objects.get(pk=action.pk).status == ActionStatus.SUBMITTING  # the sweeper's to move


class AnsweringReceiver:
    """Answers SUCCEEDED, after ``meanwhile`` ran (what happened to the action during the call)."""

    contract: Any = None

    def __init__(self, meanwhile: Any) -> None:
        self.meanwhile = meanwhile

    def send(self, action: Action) -> Answer:
        self.meanwhile(action)
        effect = Effect(
            reference="re_late",
            status="succeeded",
            outcome=Outcome.SUCCEEDED,
            amount_minor=2000,
            currency="EUR",
            action_id=action.action_id,
            raw={"id": "re_late", "status": "succeeded"},
        )
        return Answer(outcome=Outcome.SUCCEEDED, effect=effect)


def _lease_swept(action: Action) -> None:
    sweep_expired_leases(now=timezone.now() + timedelta(hours=1))


def _lease_swept_and_taken_again(action: Action) -> None:
    # Same status as the claim left it, another holder's token: only the token tells them apart.
    _lease_swept(action)
    Action.objects.filter(pk=action.pk).update(status=ActionStatus.SUBMITTING, lease_token=uuid.uuid4())


@pytest.mark.parametrize("meanwhile", [_lease_swept, _lease_swept_and_taken_again])
def test_a_worker_that_lost_its_lease_during_the_call_keeps_the_answer_on_its_attempt_only(
    agent_actor: Actor, monkeypatch: pytest.MonkeyPatch, meanwhile: Any
) -> None:
    """Invariant 3: only the lease holder records an outcome. The record reads nothing first: its
    UPDATE is fenced on the status and the lease token, so a worker whose lease was swept (or
    then handed to another holder) changes neither the action nor the order, and its answer is
    kept on its attempt as evidence for reconciliation."""
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)
    order = make_order(captured="100.00")
    action = action_propose_refund(
        order_number=order.number,
        request_number=make_request(order).number,
        amount="20.00",
        currency="EUR",
        reason_code="damaged",
        proposer=agent_actor,
    ).action
    claim = submission_begin(action_pk=action.pk)
    assert claim.action is not None and claim.attempt is not None and claim.lease_token is not None
    before = Action.objects.get(pk=action.pk)

    result = submission_send_and_record(
        action=claim.action,
        attempt=claim.attempt,
        lease_token=claim.lease_token,
        receiver=AnsweringReceiver(meanwhile),  # type: ignore[arg-type]
    )

    assert result == "lease_lost"
    after = Action.objects.get(pk=action.pk)
    assert after.status != ActionStatus.SUCCEEDED and after.provider_reference == ""
    assert after.lease_token != claim.lease_token
    assert not after.events.filter(transition="record_success").exists()
    order.refresh_from_db()
    assert (order.refunded_amount, order.reserved_amount) == (Decimal("0"), Decimal("20.00"))
    attempt = Attempt.objects.get(pk=claim.attempt.pk)
    assert (attempt.held_lease, attempt.outcome, attempt.response) == (False, "succeeded", effect_raw())
    assert before.status == ActionStatus.SUBMITTING


def effect_raw() -> dict[str, Any]:
    return {"id": "re_late", "status": "succeeded"}


def test_a_call_is_made_when_the_lease_outlasts_it_by_exactly_the_provider_timeout(
    agent_actor: Actor, settings: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The margin is the provider timeout: a lease that ends exactly one timeout from now still
    covers the call; a microsecond less does not, and the operator's log says which action."""
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)
    claims: list[Any] = []
    for _ in range(2):
        claim = submission_begin(action_pk=authorized_refund(agent_actor).pk)
        assert claim.action is not None and claim.attempt is not None and claim.lease_token is not None
        assert claim.action.lease_expires_at is not None
        claims.append(claim)
    margin = timedelta(seconds=settings.PROVIDER_TIMEOUT_SECONDS)

    def send_at(claim: Any, now: Any) -> str:
        monkeypatch.setattr(send, "database_clock_now", lambda: now)
        return submission_send_and_record(
            action=claim.action,
            attempt=claim.attempt,
            lease_token=claim.lease_token,
            receiver=AnsweringReceiver(lambda action: None),  # type: ignore[arg-type]
        )

    exactly, short = claims
    assert send_at(exactly, exactly.action.lease_expires_at - margin) == ActionStatus.SUCCEEDED
    assert send_at(short, short.action.lease_expires_at - margin + timedelta(microseconds=1)) == "lease_too_short"
    assert Action.objects.get(pk=short.action.pk).status == ActionStatus.SUBMITTING
    assert (
        f"action_id={short.action.action_id} lease nearly expired before the receiver call; not sending"
        in caplog.messages
    )
