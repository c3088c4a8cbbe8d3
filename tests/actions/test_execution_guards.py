"""Guards around the receiver call in actions.engine.dispatch."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from actions.engine.claim import ClaimOutcome, submission_begin
from actions.engine.dispatch import submission_send_and_record
from actions.models import Action, ActionStatus
from actions.services import Actor, action_propose_refund
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
    monkeypatch.setattr("actions.publish.dispatch_enqueue", lambda pk: None)
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
