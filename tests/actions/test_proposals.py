"""Proposing a refund: identity, idempotency, conflicts, the auto-approval policy and the
refund window, through ``actions.kinds.refund.proposal.action_propose_refund``."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from actions.kinds.refund.proposal import action_propose_refund
from actions.models import Action, ActionEvent, ActionStatus, ActorKind, Order
from actions.services import Actor, ProposalConflict, ProposalResult, payload_hash
from approvals.models import Approval, ApprovalPolicy, Decision
from tests.factories import make_order, make_request

pytestmark = pytest.mark.django_db

Propose = Callable[..., ProposalResult]


def event_trail(action: Action) -> list[tuple[str, str, str, str]]:
    return list(
        ActionEvent.objects.filter(action=action)
        .order_by("created_at", "id")
        .values_list("transition", "from_state", "to_state", "actor_kind")
    )


# --- identity ----------------------------------------------------------------------------------


def test_it_composes_the_action_id_from_the_order_and_the_request(propose: Propose, order: Order) -> None:
    """docs/architecture.md section 3: the id names the business action and is composed by the service."""
    make_request(order, 3)

    action = propose(request_number="3").action

    assert action.action_id == "refund:order-4821:request-3"
    assert action.idempotency_key == action.action_id
    assert action.payload == {
        "kind": "refund",
        "order": "4821",
        "request": 3,
        "charge": "ch_4821",
        "amount": "40.00",
        "currency": "EUR",
        "reason_code": "damaged",
        "schema_version": 1,
    }
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", action.payload_hash)
    assert action.payload_hash == payload_hash(action.payload)
    assert (action.amount, action.currency, action.reason_code) == (Decimal("40.00"), "EUR", "damaged")
    assert action.order == order
    assert action.refund_request is not None and action.refund_request.number == 3


def test_it_records_who_is_accountable_for_an_agents_proposal(propose: Propose, agent: Any) -> None:
    """Four eyes compare the approver with the agent's owner."""
    action = propose().action

    assert action.proposed_by_agent == agent
    assert action.proposed_by_user == agent.owner
    event = ActionEvent.objects.get(action=action)
    assert (event.actor_kind, event.actor_agent, event.actor_label) == (ActorKind.AGENT, agent, "agent:support-bot")


def test_two_requests_on_one_order_are_two_actions(propose: Propose, order: Order) -> None:
    make_request(order, 2)

    first = propose(request_number=1)
    second = propose(request_number=2, amount="30.00")

    assert first.created and second.created
    assert first.action.pk != second.action.pk
    assert second.action.action_id == "refund:order-4821:request-2"


# --- idempotency -------------------------------------------------------------------------------


def test_the_same_proposal_twice_gives_one_action(propose: Propose, row_counts: Callable[[], dict[str, int]]) -> None:
    first = propose()
    after_first = row_counts()

    second = propose()

    assert first.created is True
    assert second.created is False
    assert second.action.pk == first.action.pk
    assert second.action.status == ActionStatus.PROPOSED
    assert row_counts() == after_first == {"actions": 1, "events": 1, "approvals": 0}


@pytest.mark.parametrize("again", ["40", "40.0", "40.000", " 40.00 ", Decimal("40"), 40])
def test_an_amount_written_differently_is_the_same_proposal(propose: Propose, again: object) -> None:
    first = propose(amount="40.00")

    second = propose(amount=again, currency="eur")

    assert second.created is False
    assert second.action.pk == first.action.pk
    assert Action.objects.count() == 1


def test_a_retry_of_a_proposal_whose_money_is_already_reserved_returns_it(propose: Propose, order: Order) -> None:
    """The agent's retry must not be refused as over-balance because of its own reservation."""
    first = propose(amount="40.00")
    Order.objects.filter(pk=order.pk).update(reserved_amount=Decimal("100.00"))

    second = propose(amount="40.00")

    assert second.created is False
    assert second.action.pk == first.action.pk


def test_a_different_amount_for_the_same_request_is_a_conflict(
    propose: Propose, row_counts: Callable[[], dict[str, int]]
) -> None:
    first = propose(amount="40.00")
    before = row_counts()

    with pytest.raises(ProposalConflict) as raised:
        propose(amount="41.00")

    assert set(raised.value.differing) == {"amount"}
    assert raised.value.differing["amount"] == {"existing": "40.00", "proposed": "41.00"}
    assert "amount" in str(raised.value)
    assert "refund:order-4821:request-1" in str(raised.value)
    assert raised.value.action.pk == first.action.pk
    assert row_counts() == before
    assert Action.objects.get().amount == Decimal("40.00")


def test_a_different_reason_for_the_same_request_is_a_conflict(
    propose: Propose, row_counts: Callable[[], dict[str, int]]
) -> None:
    propose(reason_code="damaged")
    before = row_counts()

    with pytest.raises(ProposalConflict) as raised:
        propose(reason_code="goodwill")

    assert set(raised.value.differing) == {"reason_code"}
    assert raised.value.differing["reason_code"] == {"existing": "damaged", "proposed": "goodwill"}
    assert "reason_code" in str(raised.value)
    assert row_counts() == before


def test_different_evidence_is_not_a_different_business_action(propose: Propose) -> None:
    """The evidence explains the proposal to the manager; it is not part of the payload."""
    first = propose(evidence="Ticket 991.")

    second = propose(evidence="Ticket 991, with a photo this time.")

    assert second.created is False
    assert second.action.evidence == "Ticket 991."
    assert second.action.pk == first.action.pk


# --- auto-approval -----------------------------------------------------------------------------


def test_a_small_refund_is_approved_by_policy_in_the_same_commit(
    propose: Propose, order: Order, dispatched: list[int], django_capture_on_commit_callbacks: Any
) -> None:
    """Invariant 9: the proposal and the policy's approval each write their event."""
    with django_capture_on_commit_callbacks(execute=True):
        result = propose(amount="25.00")

    action = Action.objects.get(pk=result.action.pk)
    assert result.created
    assert action.status == ActionStatus.AUTHORIZED
    approval = Approval.objects.get(action=action)
    assert approval.approver is None
    assert approval.policy == ApprovalPolicy.AUTO
    assert approval.decision == Decision.APPROVE
    assert approval.decided_by_label.startswith("policy:auto-approval")
    assert (approval.amount, approval.currency, approval.payload_hash, approval.order_version) == (
        Decimal("25.00"),
        "EUR",
        action.payload_hash,
        order.version,
    )
    assert approval.expires_at is not None and approval.expires_at > timezone.now()
    assert event_trail(action) == [
        ("propose", "", "PROPOSED", ActorKind.AGENT),
        ("approve", "PROPOSED", "AUTHORIZED", ActorKind.SYSTEM),
    ]
    assert ActionEvent.objects.get(action=action, transition="approve").actor_label == "system:auto-approval"
    assert dispatched == [action.pk]


def test_a_refund_above_the_threshold_waits_for_a_manager(
    propose: Propose, dispatched: list[int], django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        action = propose(amount="25.01").action

    assert Action.objects.get(pk=action.pk).status == ActionStatus.PROPOSED
    assert not Approval.objects.exists()
    assert event_trail(action) == [("propose", "", "PROPOSED", ActorKind.AGENT)]
    assert dispatched == []


def test_the_threshold_comes_from_the_settings(propose: Propose, settings: Any) -> None:
    settings.AUTO_APPROVAL_THRESHOLDS = {"EUR": Decimal("50")}

    action = propose(amount="40.00").action

    assert action.status == ActionStatus.AUTHORIZED
    assert Approval.objects.get(action=action).policy_detail == {"threshold": "50", "currency": "EUR"}


def test_a_currency_without_a_threshold_is_never_approved_by_policy(propose: Propose, settings: Any) -> None:
    settings.AUTO_APPROVAL_THRESHOLDS = {"USD": Decimal("25")}

    action = propose(amount="1.00").action

    assert action.status == ActionStatus.PROPOSED
    assert not Approval.objects.exists()


def test_auto_approval_can_be_switched_off(propose: Propose, settings: Any, dispatched: list[int]) -> None:
    settings.AUTO_APPROVAL_ENABLED = False

    action = propose(amount="1.00").action

    assert Action.objects.get(pk=action.pk).status == ActionStatus.PROPOSED
    assert not Approval.objects.exists()
    assert event_trail(action) == [("propose", "", "PROPOSED", ActorKind.AGENT)]
    assert dispatched == []


def test_a_failing_auto_approval_leaves_no_proposal_behind(
    propose: Propose, monkeypatch: pytest.MonkeyPatch, row_counts: Callable[[], dict[str, int]]
) -> None:
    """Intent and authorization are one commit: a small refund is never left half-done,
    recorded as PROPOSED without the policy's decision."""
    import actions.services

    real = actions.services.auto_policy_apply

    def approve_then_crash(**kwargs: Any) -> Any:
        real(**kwargs)
        raise RuntimeError("crash after the approval was written")

    monkeypatch.setattr(actions.services, "auto_policy_apply", approve_then_crash)

    with pytest.raises(RuntimeError, match="crash after the approval"):
        propose(amount="10.00")

    assert row_counts() == {"actions": 0, "events": 0, "approvals": 0}


# --- policy rejections -------------------------------------------------------------------------


def test_a_proposal_past_the_refund_window_is_recorded_as_rejected(
    agent_actor: Actor, dispatched: list[int], settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    """The proposal is still recorded, with its reason, and a small amount is not auto-approved."""
    settings.REFUND_WINDOW_DAYS = 30
    old = make_order(number="1999", paid_at=timezone.now() - timedelta(days=31))
    make_request(old, 1)

    with django_capture_on_commit_callbacks(execute=True):
        result = action_propose_refund(
            order_number="1999",
            request_number=1,
            amount="10.00",
            currency="EUR",
            reason_code="late_delivery",
            proposer=agent_actor,
        )

    action = Action.objects.get(pk=result.action.pk)
    assert result.created
    assert action.status == ActionStatus.REJECTED
    assert [reason["code"] for reason in action.rejection_reasons] == ["refund_window_past"]
    assert "30 days" in action.rejection_reasons[0]["message"]
    assert event_trail(action) == [("reject_proposal", "", "REJECTED", ActorKind.AGENT)]
    assert "30 days" in ActionEvent.objects.get(action=action).reason
    assert not Approval.objects.exists()
    assert dispatched == []


def test_a_proposal_inside_the_refund_window_is_accepted(
    agent_actor: Actor, settings: Any, dispatched: list[int]
) -> None:
    settings.REFUND_WINDOW_DAYS = 30
    recent = make_order(number="2000", paid_at=timezone.now() - timedelta(days=29))
    make_request(recent, 1)

    action = action_propose_refund(
        order_number="2000",
        request_number=1,
        amount="40.00",
        currency="EUR",
        reason_code="damaged",
        proposer=agent_actor,
    ).action

    assert action.status == ActionStatus.PROPOSED


def test_the_same_late_proposal_twice_returns_the_rejected_action(
    agent_actor: Actor, dispatched: list[int], row_counts: Callable[[], dict[str, int]]
) -> None:
    old = make_order(number="1998", paid_at=timezone.now() - timedelta(days=365))
    make_request(old, 1)
    arguments: dict[str, Any] = {
        "order_number": "1998",
        "request_number": 1,
        "amount": "40.00",
        "currency": "EUR",
        "reason_code": "damaged",
        "proposer": agent_actor,
    }
    first = action_propose_refund(**arguments)

    second = action_propose_refund(**arguments)

    assert second.created is False
    assert second.action.pk == first.action.pk
    assert second.action.status == ActionStatus.REJECTED
    assert row_counts() == {"actions": 1, "events": 1, "approvals": 0}


# --- the audit trail ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("amount", "days_since_payment", "expected"),
    [
        ("40.00", 2, [("propose", "PROPOSED")]),
        ("10.00", 2, [("propose", "PROPOSED"), ("approve", "AUTHORIZED")]),
        ("40.00", 400, [("reject_proposal", "REJECTED")]),
    ],
    ids=["manual", "auto-approved", "past-the-window"],
)
def test_every_proposal_writes_exactly_its_events(
    agent_actor: Actor, dispatched: list[int], amount: str, days_since_payment: int, expected: list[tuple[str, str]]
) -> None:
    """Invariant 9: every state change writes one audit event in the same transaction, and the
    event carries the payload and its hash."""
    order = make_order(number="3000", paid_at=timezone.now() - timedelta(days=days_since_payment))
    make_request(order, 1)

    action = action_propose_refund(
        order_number="3000",
        request_number=1,
        amount=amount,
        currency="EUR",
        reason_code="damaged",
        proposer=agent_actor,
    ).action

    events = list(ActionEvent.objects.filter(action=action).order_by("created_at", "id"))
    assert [(event.transition, event.to_state) for event in events] == expected
    assert ActionEvent.objects.count() == len(expected)
    assert action.status == expected[-1][1]
    assert events[0].evidence["payload_hash"] == action.payload_hash
    assert events[0].evidence["payload"] == action.payload
