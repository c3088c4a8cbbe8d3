"""Leases and approval expiry are decided on the database's clock, not a worker's own
(actions.foundation.clock): a worker whose clock is skewed by two minutes neither sends under an
expired approval nor takes over a lease that still holds, and a web process whose clock is
skewed stamps an approval's expiry on the database's clock all the same."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from actions.engine.claim import ClaimOutcome, submission_begin
from actions.engine.sweeps import sweep_expired_leases
from actions.foundation.clock import clock_offset_forget, database_clock_now
from actions.foundation.sql import database_now
from actions.foundation.trail import Actor
from actions.kinds.refund.proposal import action_propose_refund
from actions.models import Action, ActionStatus, Attempt
from approvals.models import Approval, Decision
from approvals.services import approval_decide
from tests.actions.test_reconciliation import authorized_refund
from tests.factories import make_order, make_request

pytestmark = pytest.mark.django_db(transaction=True)

SKEW = 120  # seconds


@pytest.fixture
def skewed_host(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Skew this process's clock (the time source every service reads) by ``skew`` seconds."""
    real_now = timezone.now

    def skew(seconds: int) -> None:
        monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(seconds=seconds))
        clock_offset_forget()  # the host's clock has been off all along: measured under the skew

    yield skew
    monkeypatch.setattr(timezone, "now", real_now)
    clock_offset_forget()


@pytest.mark.parametrize("skew", [-SKEW, SKEW])
def test_the_engines_now_is_the_databases_whatever_the_hosts_clock(skewed_host: Any, skew: int) -> None:
    skewed_host(skew)
    assert abs((timezone.now() - database_now()).total_seconds() - skew) < 5
    assert abs((database_clock_now() - database_now()).total_seconds()) < 2


def test_a_worker_whose_clock_runs_behind_does_not_send_under_an_expired_approval(
    skewed_host: Any, agent_actor: Actor
) -> None:
    action = authorized_refund(agent_actor)
    # The approval expired a second ago, on the database's clock.
    Approval.objects.filter(action=action).update(expires_at=database_now() - timedelta(seconds=1))
    skewed_host(-SKEW)  # to this worker's own clock, the approval has two more minutes to run

    claim = submission_begin(action_pk=action.pk)

    assert claim.outcome == ClaimOutcome.STALE
    assert not Attempt.objects.filter(action=action).exists(), "nothing was about to be sent"
    # The auto-approval policy decides the stale action again (as for any expired approval it
    # gave): a new approval, whose expiry is counted on the database's clock too.
    newest = Approval.objects.filter(action=action).order_by("-decided_at", "-pk").first()
    assert newest is not None and newest.expires_at is not None
    assert newest.expires_at > database_now() + timedelta(seconds=60)


def test_a_sweeper_whose_clock_runs_ahead_does_not_take_over_a_lease_that_still_holds(
    skewed_host: Any, agent_actor: Actor
) -> None:
    action = authorized_refund(agent_actor)
    claim = submission_begin(action_pk=action.pk)
    assert claim.outcome == ClaimOutcome.CLAIMED
    action.refresh_from_db()
    assert action.lease_expires_at is not None
    assert action.lease_expires_at > database_now() + timedelta(seconds=10), "a lease with time to run"

    skewed_host(SKEW)  # to this sweeper's own clock, the lease expired long ago

    assert sweep_expired_leases() == 0
    action.refresh_from_db()
    assert action.status == ActionStatus.SUBMITTING

    # Once the lease has really expired (on the database's clock), the same sweeper takes it.
    Action.objects.filter(pk=action.pk).update(lease_expires_at=database_now() - timedelta(seconds=1))
    assert sweep_expired_leases() == 1
    action.refresh_from_db()
    assert action.status == ActionStatus.UNKNOWN


def proposed_refund(proposer: Actor) -> Action:
    """A refund waiting for a manager's decision."""
    order = make_order(captured="100.00")
    action = action_propose_refund(
        order_number=order.number,
        request_number=make_request(order).number,
        amount="40.00",
        currency="EUR",
        reason_code="damaged",
        proposer=proposer,
    ).action
    assert action.status == ActionStatus.PROPOSED, action.rejection_reasons
    return action


@pytest.mark.parametrize("skew", [-SKEW, SKEW])
def test_a_managers_approval_expires_on_the_databases_clock_whatever_the_web_hosts_clock(
    skewed_host: Any, agent_actor: Actor, manager: Any, settings: Any, skew: int
) -> None:
    settings.AUTO_APPROVAL_ENABLED = False
    settings.APPROVAL_TTL_SECONDS = 3600
    action = proposed_refund(agent_actor)
    skewed_host(skew)  # the web process that records the decision has its clock two minutes off

    before = database_now()
    approval = approval_decide(action_pk=action.pk, user=manager, decision=Decision.APPROVE)
    after = database_now()

    approval.refresh_from_db()
    assert approval.expires_at is not None
    # An hour on the database's clock, the clock the claim compares it with: not an hour on the
    # web host's, which would be two minutes off.
    assert before + timedelta(seconds=3600) - timedelta(seconds=1) <= approval.expires_at
    assert approval.expires_at <= after + timedelta(seconds=3600) + timedelta(seconds=1)


@pytest.mark.parametrize("skew", [-SKEW, SKEW])
def test_an_approval_by_policy_at_the_proposal_expires_on_the_databases_clock(
    skewed_host: Any, agent_actor: Actor, settings: Any, skew: int
) -> None:
    settings.APPROVAL_TTL_SECONDS = 3600
    skewed_host(skew)  # the web process that records the proposal has its clock two minutes off

    before = database_now()
    action = authorized_refund(agent_actor)
    after = database_now()

    approval = Approval.objects.get(action=action)
    assert approval.expires_at is not None
    hour = timedelta(seconds=3600)
    assert before + hour - timedelta(seconds=1) <= approval.expires_at <= after + hour + timedelta(seconds=1)
