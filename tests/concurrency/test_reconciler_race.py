"""Reconcilers racing on one UNKNOWN action, on PostgreSQL with one connection per thread.

A reconciliation pass claims a lease on the action (SKIP LOCKED), asks the receiver outside any
transaction, and records only while it still holds that lease. Whatever the interleaving, one
pass decides: one outcome, one audit event per transition, one refund at the receiver, and the
order's money booked once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.conf import settings

from actions.engine.reconcile import reconcile_action
from actions.kinds.refund.contract import RefundReceiver, provider_from_settings
from actions.models import Action, ActionStatus, Order
from actions.providers.base import CreateRefund, ProviderRefund
from actions.services import Actor
from tests.actions.test_reconciliation import (
    AMOUNT,
    PROVIDER_TIMEOUT_SECONDS,
    dispatch_with_fault,
    lookup_attempts,
    refunds_at_receiver,
    submit_attempts,
    transitions,
)
from tests.approvals.test_reservation import assert_order_money_adds_up
from tests.providers.sandbox_client import SandboxClient
from tests.threads import run_at_once

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

S = ActionStatus
ROUNDS = 3
RECONCILERS = 4  # below the connection pool's default size of 10, with the test's own connection


@pytest.fixture(autouse=True)
def published(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Dispatch runs in this process; nothing is published to a broker."""
    calls: list[int] = []
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", calls.append)
    return calls


@pytest.fixture
def sandbox(live_sandbox: SandboxClient, settings: Any) -> Iterator[SandboxClient]:
    settings.PROVIDER_TIMEOUT_SECONDS = PROVIDER_TIMEOUT_SECONDS
    provider_from_settings.cache_clear()
    yield live_sandbox


def reconcile_at(action: Action, now: datetime) -> Callable[[], str]:
    return lambda: reconcile_action(action_pk=action.pk, receiver=RefundReceiver(provider_from_settings()), now=now)


def assert_decided_once(sandbox: SandboxClient, action: Action) -> None:
    action.refresh_from_db()
    assert action.status == S.SUCCEEDED
    [refund] = refunds_at_receiver(sandbox, action)
    assert action.provider_reference == refund["id"]
    assert transitions(action) == ["propose", "approve", "begin_submission", "mark_unknown", "reconcile_found"]
    assert len(submit_attempts(action)) == 1
    order = Order.objects.get(actions=action)
    assert (order.refunded_amount, order.reserved_amount) == (AMOUNT, Decimal("0.00"))
    assert_order_money_adds_up(order)


def test_reconcilers_racing_on_one_action_record_one_outcome(sandbox: SandboxClient, agent_actor: Actor) -> None:
    """Invariants 1, 5 and 9: of several reconcilers released together on one UNKNOWN action, one
    claims it and records SUCCEEDED; the others find it taken or no longer due. One reconcile_found
    event, one lookup, one refund, the money booked once."""
    for _ in range(ROUNDS):
        action = dispatch_with_fault(sandbox, agent_actor, mode="commit_then_500")
        assert action.status == S.UNKNOWN and action.next_reconcile_at is not None

        results = run_at_once(*[reconcile_at(action, action.next_reconcile_at) for _ in range(RECONCILERS)])

        assert sorted(results) == sorted([S.SUCCEEDED] + ["not_due"] * (RECONCILERS - 1))
        assert len(lookup_attempts(action)) == 1
        assert_decided_once(sandbox, action)


class TakenOverMidLookup:
    """The receiver, as seen by a reconciler that stalls inside its lookup.

    While the first reconciler waits for its answer, its lease expires and a second reconciler
    takes the action over and finishes it. Only then does the first one get its answer.
    """

    def __init__(self, takeover: Callable[[], str]) -> None:
        self.real = provider_from_settings()
        self.name = self.real.name
        self.guarantees = self.real.guarantees
        self.takeover = takeover
        self.takeover_result: str | None = None

    def find_refunds(self, *, charge: str, action_id: str | None = None) -> list[ProviderRefund]:
        answer = self.real.find_refunds(charge=charge, action_id=action_id)
        self.takeover_result = self.takeover()
        return answer

    def get_refund(self, refund_id: str) -> ProviderRefund:
        return self.real.get_refund(refund_id)

    def create_refund(self, req: CreateRefund) -> ProviderRefund:
        raise AssertionError("a reconciler that found the refund must not create one")

    def iter_ledger(
        self, *, created_from: int | None = None, created_before: int | None = None
    ) -> Iterator[ProviderRefund]:
        return self.real.iter_ledger(created_from=created_from, created_before=created_before)


def test_a_reconciler_whose_lease_was_taken_over_records_nothing(sandbox: SandboxClient, agent_actor: Actor) -> None:
    """Invariants 1 and 9: the stalled reconciler's answer is kept on its attempt as evidence, but
    only the lease holder records the outcome, so there is one reconcile_found event."""
    action = dispatch_with_fault(sandbox, agent_actor, mode="commit_then_500")
    assert action.next_reconcile_at is not None
    first_now = action.next_reconcile_at
    after_its_lease = first_now + timedelta(seconds=settings.LEASE_SECONDS + 1)
    stalled = TakenOverMidLookup(takeover=reconcile_at(action, after_its_lease))

    result = reconcile_action(action_pk=action.pk, receiver=RefundReceiver(stalled), now=first_now)

    assert stalled.takeover_result == S.SUCCEEDED
    assert result == "lease_lost"
    stalled_lookup, winning_lookup = lookup_attempts(action)
    assert stalled_lookup.held_lease is False and stalled_lookup.outcome == "found"
    assert winning_lookup.held_lease is True
    assert_decided_once(sandbox, action)
