"""A STALE action approved by the auto-approval policy gets a new decision by the policy."""

from __future__ import annotations

from typing import Any

import pytest
from django.db.models import F

from actions.engine.claim import ClaimOutcome, submission_begin
from actions.kinds.refund.proposal import action_propose_refund
from actions.models import Action, ActionStatus, Order
from actions.services import Actor
from approvals.models import Approval, ApprovalPolicy, Decision
from approvals.services import approval_decide
from tests.factories import make_order, make_request

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_publish(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    published: list[int] = []
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", published.append)
    return published


def propose(actor: Actor, order: Order, amount: str) -> Action:
    request = make_request(order)
    return action_propose_refund(
        order_number=order.number,
        request_number=request.number,
        amount=amount,
        currency="EUR",
        reason_code="damaged",
        proposer=actor,
    ).action


def test_a_policy_approval_made_stale_by_another_refund_is_decided_again_by_the_policy(agent_actor: Actor) -> None:
    """Invariant 6: the old approval is never reused; a new one is bound to the new version."""
    order = make_order(captured="100.00")
    first = propose(agent_actor, order, "20.00")
    second = propose(agent_actor, order, "10.00")
    assert submission_begin(action_pk=first.pk).outcome == ClaimOutcome.CLAIMED

    claim = submission_begin(action_pk=second.pk)

    assert claim.outcome == ClaimOutcome.STALE
    second.refresh_from_db()
    assert second.status == ActionStatus.AUTHORIZED
    transitions = list(second.events.values_list("transition", "to_state"))
    assert transitions[-3:] == [("invalidate", "STALE"), ("reopen", "PROPOSED"), ("approve", "AUTHORIZED")]
    approvals = list(Approval.objects.filter(action=second, decision=Decision.APPROVE).order_by("pk"))
    assert len(approvals) == 2
    assert approvals[1].policy == ApprovalPolicy.AUTO
    assert approvals[1].order_version == Order.objects.get(pk=order.pk).version != approvals[0].order_version
    assert submission_begin(action_pk=second.pk).outcome == ClaimOutcome.CLAIMED


def test_a_policy_approval_the_order_no_longer_covers_waits_for_a_manager(agent_actor: Actor) -> None:
    order = make_order(captured="30.00")
    first = propose(agent_actor, order, "20.00")
    second = propose(agent_actor, order, "10.00")
    # Someone else refunded part of the order in the meantime (a correction), bumping its version.
    Order.objects.filter(pk=order.pk).update(refunded_amount=F("refunded_amount") + 5, version=F("version") + 1)
    assert submission_begin(action_pk=first.pk).outcome == ClaimOutcome.STALE

    first.refresh_from_db()
    second.refresh_from_db()
    assert first.status == ActionStatus.AUTHORIZED  # 20 <= 25 left: the policy approves again
    assert submission_begin(action_pk=first.pk).outcome == ClaimOutcome.CLAIMED
    assert submission_begin(action_pk=second.pk).outcome == ClaimOutcome.STALE
    second.refresh_from_db()
    assert second.status == ActionStatus.PROPOSED  # 10 > 5 left: a person must decide


def test_a_manager_approval_made_stale_stays_stale_until_a_manager_asks_again(agent_actor: Actor, manager: Any) -> None:
    order = make_order(captured="200.00")
    big = propose(agent_actor, order, "100.00")
    approval_decide(action_pk=big.pk, user=manager, decision=Decision.APPROVE)
    Order.objects.filter(pk=order.pk).update(version=F("version") + 1)

    assert submission_begin(action_pk=big.pk).outcome == ClaimOutcome.STALE
    big.refresh_from_db()
    assert big.status == ActionStatus.STALE


@pytest.mark.django_db(transaction=True)
def test_a_crash_during_the_policys_new_decision_leaves_no_stale_action_behind(
    agent_actor: Actor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant 8 (nothing waits for a decision nobody was asked to make): the invalidation and
    the policy's new decision are one transaction. A failure inside the re-decision rolls the
    invalidation back too, so the action stays AUTHORIZED and the next claim decides again;
    it can never be left STALE with a policy approval and no sweep looking at it."""
    order = make_order(captured="100.00")
    first = propose(agent_actor, order, "20.00")
    second = propose(agent_actor, order, "10.00")
    assert submission_begin(action_pk=first.pk).outcome == ClaimOutcome.CLAIMED

    def crash(**kwargs: Any) -> Any:
        raise RuntimeError("worker lost in the middle of the policy's decision")

    monkeypatch.setattr("approvals.policy.approval_apply_auto_policy", crash)
    with pytest.raises(RuntimeError):
        submission_begin(action_pk=second.pk)

    second.refresh_from_db()
    assert second.status == ActionStatus.AUTHORIZED
    assert "invalidate" not in list(second.events.values_list("transition", flat=True))
    monkeypatch.undo()
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)

    assert submission_begin(action_pk=second.pk).outcome == ClaimOutcome.STALE
    second.refresh_from_db()
    assert second.status == ActionStatus.AUTHORIZED, "decided again by the policy, in the same commit"


# --- pinned for mutation testing (tests/MUTATION.md, approvals.policy) -------------------------


def test_the_policys_new_decision_is_recorded_as_the_policys_with_its_reason(agent_actor: Actor) -> None:
    """The 'reopen' event of a re-decision names the policy as its actor and says why."""
    order = make_order(captured="100.00")
    first = propose(agent_actor, order, "20.00")
    second = propose(agent_actor, order, "10.00")
    assert submission_begin(action_pk=first.pk).outcome == ClaimOutcome.CLAIMED
    assert submission_begin(action_pk=second.pk).outcome == ClaimOutcome.STALE

    reopen = second.events.get(transition="reopen")
    assert reopen.actor_label == "system:auto-approval"
    assert reopen.reason == "The target changed since the policy approved this action: the policy decides again."


def test_only_a_stale_action_the_policy_approved_is_decided_again(agent_actor: Actor, manager: Any) -> None:
    """Not an AUTHORIZED one, not one a manager approved: those stay as they are, untouched."""
    from django.utils import timezone

    from approvals.policy import approval_redecide_by_policy

    order = make_order(captured="100.00")
    authorized = propose(agent_actor, order, "20.00")
    assert authorized.status == ActionStatus.AUTHORIZED
    events = authorized.events.count()
    assert approval_redecide_by_policy(action=authorized, now=timezone.now()) is None
    authorized.refresh_from_db()
    assert authorized.status == ActionStatus.AUTHORIZED and authorized.events.count() == events


def test_the_approval_in_force_is_the_actions_own_newest_approval(agent_actor: Actor, manager: Any) -> None:
    """Not another action's newer approval, and not a newer rejection row."""
    from approvals.policy import latest_approval

    order = make_order(captured="500.00")
    mine = propose(agent_actor, order, "20.00")
    theirs = propose(agent_actor, order, "10.00")
    in_force = Approval.objects.filter(action=mine, decision=Decision.APPROVE).latest("pk")
    assert Approval.objects.filter(action=theirs).latest("pk").pk > in_force.pk
    assert latest_approval(mine) == in_force
    Approval.objects.create(
        action=mine,
        approver=manager,
        decided_by_label=manager.get_username(),
        policy=ApprovalPolicy.MANAGER,
        decision=Decision.REJECT,
        note="a later rejection row",
        decided_at=in_force.decided_at,
        amount=in_force.amount,
        currency=in_force.currency,
    )
    assert latest_approval(mine) == in_force
