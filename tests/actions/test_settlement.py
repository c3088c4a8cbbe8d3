"""Settlement: a refund the receiver accepted as pending is polled until its status is final.

docs/architecture.md sections 4 and 7: SETTLING holds the reservation; the receiver's final status moves the
action to SUCCEEDED (the reservation becomes refunded money) or to FAILED_FINAL (the reservation is
released and a remedy is opened, because the customer still expects their money). The sandbox
settles a pending refund by its own clock, which the tests move forward.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest

from actions.engine.reconcile import reconcile_action
from actions.kinds.refund.contract import RefundReceiver, provider_from_settings
from actions.models import Action, ActionStatus, Remedy, RemedyKind
from actions.services import Actor
from tests.actions.test_reconciliation import (
    AMOUNT,
    PROVIDER_TIMEOUT_SECONDS,
    align_receiver_clock,
    dispatch_with_fault,
    order_money,
    refunds_at_receiver,
    submit_attempts,
    transitions,
)
from tests.providers.sandbox_client import SandboxClient

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

S = ActionStatus
SETTLES_AFTER = timedelta(minutes=10)


@pytest.fixture(autouse=True)
def no_broker(dispatched: list[int]) -> list[int]:
    return dispatched


@pytest.fixture
def sandbox(live_sandbox: SandboxClient, settings: Any) -> SandboxClient:
    settings.PROVIDER_TIMEOUT_SECONDS = PROVIDER_TIMEOUT_SECONDS
    provider_from_settings.cache_clear()
    return live_sandbox


def settling(sandbox: SandboxClient, proposer: Actor, *, outcome: str) -> Action:
    """A refund the receiver accepted as pending and will settle as ``outcome`` after SETTLES_AFTER."""
    action = dispatch_with_fault(
        sandbox, proposer, mode="pending", outcome=outcome, settle_after_seconds=SETTLES_AFTER.total_seconds()
    )
    assert action.status == S.SETTLING
    [refund] = refunds_at_receiver(sandbox, action)
    assert refund["status"] == "pending"
    assert action.provider_reference == refund["id"]
    assert order_money(action) == (Decimal("0.00"), AMOUNT), "SETTLING holds the reservation"
    return action


def poll_until_the_receiver_settled(sandbox: SandboxClient, action: Action) -> str:
    """One poll while still pending (nothing changes), then one after the receiver settled."""
    assert action.next_reconcile_at is not None and action.first_attempt_at is not None
    early = action.next_reconcile_at
    align_receiver_clock(sandbox, early)

    assert (
        reconcile_action(action_pk=action.pk, receiver=RefundReceiver(provider_from_settings()), now=early)
        == "still_pending"
    )
    action.refresh_from_db()
    assert action.status == S.SETTLING
    assert action.lease_token is None
    assert action.next_reconcile_at is not None, "polling goes on while the refund is pending"
    assert order_money(action) == (Decimal("0.00"), AMOUNT)

    later = max(action.next_reconcile_at, action.first_attempt_at + SETTLES_AFTER + timedelta(seconds=1))
    align_receiver_clock(sandbox, later)
    return reconcile_action(action_pk=action.pk, receiver=RefundReceiver(provider_from_settings()), now=later)


def test_a_pending_refund_that_the_receiver_fails_releases_the_reservation_and_opens_a_remedy(
    sandbox: SandboxClient, agent_actor: Actor, finance: Any
) -> None:
    """Invariants 5 and 8: FAILED_FINAL releases the reservation in the same transaction and leaves a
    remedy for a named person; nothing is sent again."""
    action = settling(sandbox, agent_actor, outcome="failed")

    result = poll_until_the_receiver_settled(sandbox, action)

    assert result == S.FAILED_FINAL
    action.refresh_from_db()
    [refund] = refunds_at_receiver(sandbox, action)
    assert refund["status"] == "failed"
    assert action.status == S.FAILED_FINAL
    assert action.next_reconcile_at is None
    assert order_money(action) == (Decimal("0.00"), Decimal("0.00"))
    [remedy] = Remedy.objects.filter(action=action)
    assert (remedy.amount, remedy.currency, remedy.kind) == (AMOUNT, "EUR", RemedyKind.UNDECIDED)
    assert remedy.owner == finance
    assert transitions(action)[-2:] == ["record_pending", "settle"]
    assert len(submit_attempts(action)) == 1


def test_a_pending_refund_that_the_receiver_completes_becomes_refunded_money(
    sandbox: SandboxClient, agent_actor: Actor
) -> None:
    """Invariants 2 and 5: SUCCEEDED keeps the receiver's reference and turns the reservation into
    refunded money; no remedy is opened."""
    action = settling(sandbox, agent_actor, outcome="succeeded")
    reference = action.provider_reference

    result = poll_until_the_receiver_settled(sandbox, action)

    assert result == S.SUCCEEDED
    action.refresh_from_db()
    assert action.status == S.SUCCEEDED
    assert action.provider_reference == reference
    assert [r["status"] for r in refunds_at_receiver(sandbox, action)] == ["succeeded"]
    assert order_money(action) == (AMOUNT, Decimal("0.00"))
    assert not Remedy.objects.filter(action=action).exists()
    assert transitions(action)[-2:] == ["record_pending", "settle"]
