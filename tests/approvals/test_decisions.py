"""Decisions on proposals: who may approve or reject what, and what a decision records.

docs/architecture.md section 4 (PROPOSED -> AUTHORIZED / REJECTED, STALE -> PROPOSED) and section 5 (the
approval's binding). A refused decision must leave no trace: no approval, no audit event, no
change of status and no dispatch published (invariant 10).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.db.models import F
from django.utils import timezone

from actions.engine.claim import ClaimOutcome, submission_begin
from actions.kinds.refund.proposal import action_propose_refund
from actions.models import Action, ActionEvent, ActionStatus, ActorKind, Order
from actions.services import Actor
from approvals.models import Approval, ApprovalLimit, ApprovalPolicy, Decision
from approvals.services import DecisionRefused, action_reopen, approval_decide
from tests.factories import make_order, make_request

pytestmark = pytest.mark.django_db

S = ActionStatus


@pytest.fixture(autouse=True)
def manual_decisions(settings: Any) -> None:
    # Proposals wait for a manager unless a test switches the policy back on.
    settings.AUTO_APPROVAL_ENABLED = False


@pytest.fixture(autouse=True)
def published(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The dispatches published to the broker, by action pk, instead of publishing them."""
    calls: list[int] = []
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", calls.append)
    return calls


def propose(proposer: Actor, *, amount: str, currency: str = "EUR", captured: str = "500.00") -> Action:
    order = make_order(currency=currency, captured=captured)
    request = make_request(order)
    result = action_propose_refund(
        order_number=order.number,
        request_number=request.number,
        amount=amount,
        currency=currency,
        reason_code="damaged",
        evidence="The parcel arrived crushed; photos attached to the ticket.",
        proposer=proposer,
    )
    return result.action


def order_of(action: Action) -> Order:
    return Order.objects.get(actions=action)


def trail(action: Action) -> dict[str, Any]:
    """Everything a decision could write about an action, read fresh from the database."""
    fresh = Action.objects.get(pk=action.pk)
    order = order_of(action)
    return {
        "status": fresh.status,
        "events": list(ActionEvent.objects.filter(action=action).values_list("pk", "transition")),
        "approvals": list(Approval.objects.filter(action=action).values_list("pk", "decision")),
        "order": (order.version, order.reserved_amount, order.refunded_amount),
    }


def refused(
    *,
    action: Action,
    user: Any,
    published: list[int],
    capture: Callable[..., Any],
    decision: str = Decision.APPROVE,
) -> DecisionRefused:
    """Run a decision that must be refused and check that it wrote nothing and published nothing."""
    before = trail(action)
    published_before = list(published)
    with capture(execute=True) as callbacks, pytest.raises(DecisionRefused) as refusal:
        approval_decide(action_pk=action.pk, user=user, decision=decision)
    assert callbacks == []
    assert published == published_before
    assert trail(action) == before
    return refusal.value


def make_manager(user: Any, **limits: str) -> Any:
    user.groups.add(Group.objects.get(name="manager"))
    for currency, amount in limits.items():
        ApprovalLimit.objects.create(user=user, currency=currency, max_amount=Decimal(amount))
    # A fresh instance: permissions cached while the user was only an agent would hide the new role.
    return type(user).objects.get(pk=user.pk)


# --- refusals ---------------------------------------------------------------------------


def test_the_agents_owner_cannot_approve_what_the_agent_proposed_even_as_a_manager(
    agent_owner: Any, agent_actor: Actor, published: list[int], django_capture_on_commit_callbacks: Any
) -> None:
    """Invariant 10: approver != proposer; an agent's proposal counts as its owner's."""
    owner_as_manager = make_manager(agent_owner, EUR="500")
    action = propose(agent_actor, amount="150.00")

    refusal = refused(
        action=action, user=owner_as_manager, published=published, capture=django_capture_on_commit_callbacks
    )

    assert refusal.code == "four_eyes"
    assert refusal.status == 403


def test_a_manager_cannot_approve_a_refund_they_proposed_themselves(
    manager: Any, published: list[int], django_capture_on_commit_callbacks: Any
) -> None:
    """Invariant 10: approver != proposer."""
    action = propose(Actor.for_user(manager), amount="150.00")

    refusal = refused(action=action, user=manager, published=published, capture=django_capture_on_commit_callbacks)

    assert refusal.code == "four_eyes"


def test_a_manager_cannot_approve_above_their_limit(
    second_manager: Any, agent_actor: Actor, published: list[int], django_capture_on_commit_callbacks: Any
) -> None:
    """Invariant 10: amount <= approver's limit (mark.manager may approve up to 100 EUR)."""
    action = propose(agent_actor, amount="150.00")

    refusal = refused(
        action=action, user=second_manager, published=published, capture=django_capture_on_commit_callbacks
    )

    assert refusal.code == "over_limit"
    assert "100.00 EUR" in str(refusal)


def test_a_manager_may_approve_exactly_their_limit(second_manager: Any, agent_actor: Actor) -> None:
    """Invariant 10: the limit is inclusive, so the refusal above is the limit and not something else."""
    action = propose(agent_actor, amount="100.00")

    approval_decide(action_pk=action.pk, user=second_manager, decision=Decision.APPROVE)

    assert Action.objects.get(pk=action.pk).status == S.AUTHORIZED


def test_a_manager_cannot_approve_in_a_currency_they_have_no_limit_for(
    second_manager: Any, agent_actor: Actor, published: list[int], django_capture_on_commit_callbacks: Any
) -> None:
    """Invariant 10: no limit in a currency means no approvals in it, however small the amount."""
    action = propose(agent_actor, amount="30.00", currency="USD")

    refusal = refused(
        action=action, user=second_manager, published=published, capture=django_capture_on_commit_callbacks
    )

    assert refusal.code == "no_limit"
    assert "USD" in str(refusal)


@pytest.mark.parametrize("decision", [Decision.APPROVE, Decision.REJECT])
def test_finance_cannot_decide_proposals(
    decision: str, finance: Any, agent_actor: Actor, published: list[int], django_capture_on_commit_callbacks: Any
) -> None:
    """Invariant 10: only managers decide."""
    action = propose(agent_actor, amount="30.00")

    refusal = refused(
        action=action,
        user=finance,
        decision=decision,
        published=published,
        capture=django_capture_on_commit_callbacks,
    )

    assert refusal.code == "not_a_manager"
    assert refusal.status == 403


@pytest.mark.parametrize("decision", [Decision.APPROVE, Decision.REJECT])
def test_deciding_an_action_that_was_already_approved_is_refused_as_a_conflict(
    decision: str,
    manager: Any,
    second_manager: Any,
    agent_actor: Actor,
    published: list[int],
    django_capture_on_commit_callbacks: Any,
) -> None:
    """Invariant 10: a decision applies to a PROPOSED action only; a late second decision changes nothing."""
    action = propose(agent_actor, amount="30.00")
    with django_capture_on_commit_callbacks(execute=True):
        approval_decide(action_pk=action.pk, user=manager, decision=Decision.APPROVE)
    assert published == [action.pk]

    refusal = refused(
        action=action,
        user=second_manager,
        decision=decision,
        published=published,
        capture=django_capture_on_commit_callbacks,
    )

    assert refusal.code == "not_waiting"
    assert refusal.status == 409
    assert "authorized" in str(refusal)


def test_approving_a_rejected_action_is_refused_as_a_conflict(
    manager: Any, second_manager: Any, agent_actor: Actor, published: list[int], django_capture_on_commit_callbacks: Any
) -> None:
    """Invariant 10: a rejection is final; nobody can approve the action afterwards."""
    action = propose(agent_actor, amount="30.00")
    approval_decide(action_pk=action.pk, user=manager, decision=Decision.REJECT, note="No photos.")

    refusal = refused(
        action=action, user=second_manager, published=published, capture=django_capture_on_commit_callbacks
    )

    assert refusal.code == "not_waiting"
    assert refusal.status == 409


def test_an_unknown_decision_is_refused_and_writes_nothing(
    manager: Any, agent_actor: Actor, published: list[int], django_capture_on_commit_callbacks: Any
) -> None:
    action = propose(agent_actor, amount="30.00")

    refusal = refused(
        action=action,
        user=manager,
        decision="maybe",
        published=published,
        capture=django_capture_on_commit_callbacks,
    )

    assert refusal.code == "invalid_decision"
    assert refusal.status == 400


# --- valid decisions --------------------------------------------------------------------


def test_an_approval_is_bound_to_the_order_version_amount_currency_payload_and_an_expiry(
    manager: Any, agent_actor: Actor, settings: Any
) -> None:
    """Invariant 6: the approval records exactly what the manager approved, so the reservation can check it."""
    settings.APPROVAL_TTL_SECONDS = 3600
    action = propose(agent_actor, amount="150.00")
    # A version other than the initial one, so the binding cannot be right by coincidence.
    Order.objects.filter(actions=action).update(version=F("version") + 6)
    now = timezone.now()

    approval = approval_decide(
        action_pk=action.pk, user=manager, decision=Decision.APPROVE, note="Photos match.", now=now
    )

    approval = Approval.objects.get(pk=approval.pk)
    assert approval.action_id == action.pk
    assert approval.decision == Decision.APPROVE
    assert approval.approver == manager
    assert approval.decided_by_label == "maria.manager"
    assert approval.policy == ApprovalPolicy.MANAGER
    assert approval.order_version == 7
    assert approval.amount == Decimal("150.00")
    assert approval.currency == "EUR"
    assert approval.payload_hash == action.payload_hash
    assert approval.payload_hash.startswith("sha256:")
    assert approval.decided_at == now
    assert approval.expires_at == now + timedelta(seconds=3600)
    assert approval.note == "Photos match."


def test_an_approval_authorizes_the_action_and_writes_an_approve_event(manager: Any, agent_actor: Actor) -> None:
    """Invariant 9: the state change and its audit event are written together."""
    action = propose(agent_actor, amount="150.00")

    approval = approval_decide(action_pk=action.pk, user=manager, decision=Decision.APPROVE)

    assert Action.objects.get(pk=action.pk).status == S.AUTHORIZED
    event = ActionEvent.objects.get(action=action, transition="approve")
    assert (event.from_state, event.to_state) == (S.PROPOSED, S.AUTHORIZED)
    assert event.actor_kind == ActorKind.USER
    assert event.actor_user == manager
    assert event.evidence["approval_id"] == approval.pk
    assert event.evidence["binding"]["order_version"] == approval.order_version
    assert event.evidence["binding"]["payload_hash"] == action.payload_hash


def test_an_approval_publishes_one_dispatch_and_only_after_it_commits(
    manager: Any, agent_actor: Actor, published: list[int], django_capture_on_commit_callbacks: Any
) -> None:
    action = propose(agent_actor, amount="150.00")

    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        approval_decide(action_pk=action.pk, user=manager, decision=Decision.APPROVE)
        # Still inside the test's transaction: nothing may reach the broker before the commit.
        assert published == []

    assert len(callbacks) == 1
    assert published == [action.pk]


def test_a_rejection_records_a_reject_decision_and_publishes_nothing(
    manager: Any, agent_actor: Actor, published: list[int], django_capture_on_commit_callbacks: Any
) -> None:
    action = propose(agent_actor, amount="150.00")

    with django_capture_on_commit_callbacks(execute=True):
        approval = approval_decide(
            action_pk=action.pk, user=manager, decision=Decision.REJECT, note="The ticket has no photos."
        )

    approval = Approval.objects.get(pk=approval.pk)
    assert approval.decision == Decision.REJECT
    assert approval.approver == manager
    assert approval.expires_at is None
    assert approval.note == "The ticket has no photos."
    rejected = Action.objects.get(pk=action.pk)
    assert rejected.status == S.REJECTED
    assert rejected.rejection_reasons == [{"code": "rejected_by_manager", "message": "The ticket has no photos."}]
    event = ActionEvent.objects.get(action=action, transition="reject")
    assert (event.from_state, event.to_state) == (S.PROPOSED, S.REJECTED)
    assert event.actor_user == manager
    assert published == []


def test_a_rejected_action_cannot_be_reserved(manager: Any, agent_actor: Actor) -> None:
    action = propose(agent_actor, amount="150.00")
    approval_decide(action_pk=action.pk, user=manager, decision=Decision.REJECT)

    claim = submission_begin(action_pk=action.pk)

    assert claim.outcome == ClaimOutcome.TAKEN
    assert Action.objects.get(pk=action.pk).status == S.REJECTED
    assert order_of(action).reserved_amount == 0


# --- reopening a stale action -----------------------------------------------------------


def make_stale(action: Action, manager: Any) -> Action:
    """Approve, then change the order, so that the reservation finds the approval outdated."""
    approval_decide(action_pk=action.pk, user=manager, decision=Decision.APPROVE)
    Order.objects.filter(actions=action).update(version=F("version") + 1)
    assert submission_begin(action_pk=action.pk).outcome == ClaimOutcome.STALE
    return Action.objects.get(pk=action.pk)


def test_reopening_a_stale_action_asks_for_a_new_decision_on_the_same_action(manager: Any, agent_actor: Actor) -> None:
    """Invariant 4: a new decision is asked for the same action: same row, id, key and payload."""
    action = propose(agent_actor, amount="150.00")
    stale = make_stale(action, manager)

    reopened = action_reopen(action_pk=action.pk, user=manager, note="The order changed; please look again.")

    fresh = Action.objects.get(pk=action.pk)
    assert reopened.pk == stale.pk == action.pk
    assert fresh.status == S.PROPOSED
    assert fresh.action_id == action.action_id
    assert fresh.idempotency_key == action.idempotency_key
    assert fresh.payload_hash == action.payload_hash
    assert Action.objects.filter(action_id=action.action_id).count() == 1
    event = ActionEvent.objects.filter(action=action).last()
    assert event is not None
    assert (event.transition, event.from_state, event.to_state) == ("reopen", S.STALE, S.PROPOSED)
    assert event.actor_user == manager


def test_a_reopened_action_needs_a_fresh_approval_bound_to_the_current_order(manager: Any, agent_actor: Actor) -> None:
    """Invariant 6: the old approval is not reused; the new one binds the order as it is now."""
    action = propose(agent_actor, amount="150.00")
    make_stale(action, manager)
    action_reopen(action_pk=action.pk, user=manager)

    approval = approval_decide(action_pk=action.pk, user=manager, decision=Decision.APPROVE)

    assert Approval.objects.filter(action=action, decision=Decision.APPROVE).count() == 2
    assert approval.order_version == order_of(action).version
    assert Action.objects.get(pk=action.pk).status == S.AUTHORIZED


def test_only_a_manager_can_reopen_a_stale_action(manager: Any, finance: Any, agent_actor: Actor) -> None:
    """Invariant 10: reopening asks for a manager's decision, so only a manager may do it."""
    action = propose(agent_actor, amount="150.00")
    make_stale(action, manager)
    events_before = ActionEvent.objects.filter(action=action).count()

    with pytest.raises(DecisionRefused) as refusal:
        action_reopen(action_pk=action.pk, user=finance)

    assert refusal.value.code == "not_a_manager"
    assert Action.objects.get(pk=action.pk).status == S.STALE
    assert ActionEvent.objects.filter(action=action).count() == events_before


def test_reopening_an_action_that_is_not_stale_is_refused_as_a_conflict(manager: Any, agent_actor: Actor) -> None:
    action = propose(agent_actor, amount="150.00")
    approval_decide(action_pk=action.pk, user=manager, decision=Decision.APPROVE)

    with pytest.raises(DecisionRefused) as refusal:
        action_reopen(action_pk=action.pk, user=manager)

    assert refusal.value.code == "not_stale"
    assert refusal.value.status == 409
    assert Action.objects.get(pk=action.pk).status == S.AUTHORIZED


# --- the auto-approval policy -----------------------------------------------------------


@pytest.fixture
def auto_approval(settings: Any) -> Decimal:
    settings.AUTO_APPROVAL_ENABLED = True
    settings.AUTO_APPROVAL_THRESHOLDS = {"EUR": Decimal("25")}
    return Decimal("25")


def test_the_auto_approval_policy_records_itself_as_the_approver(
    auto_approval: Decimal,
    agent_actor: Actor,
    settings: Any,
    published: list[int],
    django_capture_on_commit_callbacks: Any,
) -> None:
    """Invariant 10: a policy approval names the policy, never a person who did not decide."""
    with django_capture_on_commit_callbacks(execute=True):
        action = propose(agent_actor, amount="25.00")
        assert published == []

    assert Action.objects.get(pk=action.pk).status == S.AUTHORIZED
    approval = Approval.objects.get(action=action)
    assert approval.approver is None
    assert approval.policy == ApprovalPolicy.AUTO
    assert approval.decision == Decision.APPROVE
    assert "auto-approval" in approval.decided_by_label
    assert "25" in approval.decided_by_label
    assert approval.policy_detail == {"threshold": "25", "currency": "EUR"}
    assert approval.order_version == order_of(action).version
    assert approval.payload_hash == action.payload_hash
    assert approval.expires_at == approval.decided_at + timedelta(seconds=settings.APPROVAL_TTL_SECONDS)
    event = ActionEvent.objects.get(action=action, transition="approve")
    assert event.actor_kind == ActorKind.SYSTEM
    assert event.actor_user is None
    assert event.actor_label == "system:auto-approval"
    assert published == [action.pk]


def test_the_auto_approval_policy_leaves_amounts_above_its_threshold_to_a_manager(
    auto_approval: Decimal, agent_actor: Actor, published: list[int], django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        action = propose(agent_actor, amount="25.01")

    assert Action.objects.get(pk=action.pk).status == S.PROPOSED
    assert not Approval.objects.filter(action=action).exists()
    assert published == []
