"""The atomic reservation that starts a submission (docs/architecture.md section 5).

``submission_begin`` reserves the amount on the order only while the order is at the approved
version and the balance covers it, and moves the action AUTHORIZED -> SUBMITTING in the same
transaction. When the approval no longer holds, the action goes to STALE and nothing is
reserved (invariants 5 and 6).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from actions.engine.claim import Claim, ClaimOutcome, submission_begin
from actions.kinds.refund.proposal import action_propose_refund
from actions.models import Action, ActionEvent, ActionStatus, Attempt, AttemptKind, Order
from actions.services import Actor
from approvals.models import Approval, Decision
from approvals.policy import approval_record
from approvals.services import DecisionRefused, action_reopen, approval_decide
from tests.factories import make_order, make_request

pytestmark = pytest.mark.django_db

S = ActionStatus

# Spelled out here rather than imported, so that a wrong constant in the code cannot make its
# own check pass (docs/architecture.md section 4: the reservation is held through these).
HOLDING_STATUSES = ("SUBMITTING", "UNKNOWN", "SETTLING", "NEEDS_REVIEW")


def assert_order_money_adds_up(order: Order) -> None:
    """Invariant 5, from the actions rather than trusting the order's own columns:
    refunded = sum of SUCCEEDED amounts; reserved = sum over SUBMITTING, UNKNOWN, SETTLING and
    NEEDS_REVIEW; refunded + reserved <= captured."""
    order = Order.objects.get(pk=order.pk)
    statuses_and_amounts = list(Action.objects.filter(order=order).values_list("status", "amount"))
    succeeded = sum((amount for status, amount in statuses_and_amounts if status == "SUCCEEDED"), Decimal("0"))
    holding = sum((amount for status, amount in statuses_and_amounts if status in HOLDING_STATUSES), Decimal("0"))
    assert order.refunded_amount == succeeded, f"{order}: refunded {order.refunded_amount}, succeeded {succeeded}"
    assert order.reserved_amount == holding, f"{order}: reserved {order.reserved_amount}, held by actions {holding}"
    assert order.refunded_amount >= 0
    assert order.reserved_amount >= 0
    assert order.refunded_amount + order.reserved_amount <= order.captured_amount, (
        f"{order}: refunded {order.refunded_amount} + reserved {order.reserved_amount} "
        f"> captured {order.captured_amount}"
    )


@pytest.fixture(autouse=True)
def every_order_adds_up_afterwards(db: Any) -> Iterator[None]:
    """Invariant 5 holds for every order at the end of every test in this module."""
    yield
    for order in Order.objects.all():
        assert_order_money_adds_up(order)


@pytest.fixture(autouse=True)
def manual_decisions(settings: Any) -> None:
    settings.AUTO_APPROVAL_ENABLED = False


@pytest.fixture(autouse=True)
def published(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", calls.append)
    return calls


def propose(proposer: Actor, order: Order, *, amount: str) -> Action:
    request = make_request(order)
    return action_propose_refund(
        order_number=order.number,
        request_number=request.number,
        amount=amount,
        currency=order.currency,
        reason_code="damaged",
        proposer=proposer,
    ).action


def approve(action: Action, manager: Any, *, now: datetime | None = None) -> Approval:
    return approval_decide(action_pk=action.pk, user=manager, decision=Decision.APPROVE, now=now)


def fresh(action: Action) -> Action:
    return Action.objects.get(pk=action.pk)


def order_of(action: Action) -> Order:
    return Order.objects.get(actions=action)


def transitions(action: Action) -> list[str]:
    return list(ActionEvent.objects.filter(action=action).values_list("transition", flat=True))


def assert_stale_naming(claim: Claim, action: Action, binding: str) -> None:
    """The claim went STALE, the audit trail says which binding failed, and nothing was reserved."""
    assert claim.outcome == ClaimOutcome.STALE
    assert binding in [failure["binding"] for failure in claim.failures]
    assert fresh(action).status == S.STALE
    event = ActionEvent.objects.filter(action=action).last()
    assert event is not None
    assert (event.transition, event.from_state, event.to_state) == ("invalidate", S.AUTHORIZED, S.STALE)
    assert binding in [failure["binding"] for failure in event.evidence["failed_bindings"]]
    assert "begin_submission" not in transitions(action)
    assert not Attempt.objects.filter(action=action).exists()


# --- a successful claim -----------------------------------------------------------------


def test_a_claim_reserves_the_amount_and_moves_the_action_to_submitting_under_a_lease(
    manager: Any, agent_actor: Actor, settings: Any
) -> None:
    """Invariants 3 and 5: the reservation and the SUBMITTING lease are one commit."""
    settings.LEASE_SECONDS = 90
    order = make_order(captured="100.00")
    action = propose(agent_actor, order, amount="40.00")
    approve(action, manager)
    version_at_approval = order_of(action).version
    now = timezone.now()

    claim = submission_begin(action_pk=action.pk, now=now)

    assert claim.outcome == ClaimOutcome.CLAIMED
    assert claim.lease_token is not None
    claimed = fresh(action)
    assert claimed.status == S.SUBMITTING
    assert claimed.lease_token == claim.lease_token
    assert claimed.lease_expires_at == now + timedelta(seconds=90)
    assert claimed.attempt_count == 1
    assert claimed.first_attempt_at == now
    after = order_of(action)
    assert after.reserved_amount == Decimal("40.00")
    assert after.refunded_amount == Decimal("0")
    assert after.version == version_at_approval + 1
    assert_order_money_adds_up(order)


def test_a_claim_records_the_request_it_is_about_to_send_as_one_attempt(manager: Any, agent_actor: Actor) -> None:
    """Section 6: the attempt row (with the request and the stable key) exists before any call."""
    order = make_order(captured="100.00")
    action = propose(agent_actor, order, amount="40.00")
    approve(action, manager)

    claim = submission_begin(action_pk=action.pk)

    attempt = Attempt.objects.get(action=action)
    assert claim.attempt == attempt
    assert attempt.kind == AttemptKind.SUBMIT
    assert attempt.lease_token == claim.lease_token
    assert attempt.idempotency_key == action.action_id
    assert attempt.request == {
        "charge": order.charge_reference,
        "amount": "40.00",
        "currency": "EUR",
        "idempotency_key": action.action_id,
        "metadata": {"action_id": action.action_id},
    }
    assert attempt.response is None
    assert attempt.finished_at is None


def test_a_claim_writes_one_begin_submission_event_naming_the_approval(manager: Any, agent_actor: Actor) -> None:
    """Invariant 9: the move to SUBMITTING is in the audit trail, linked to the decision it acts on."""
    order = make_order(captured="100.00")
    action = propose(agent_actor, order, amount="40.00")
    approval = approve(action, manager)

    submission_begin(action_pk=action.pk)

    assert transitions(action) == ["propose", "approve", "begin_submission"]
    event = ActionEvent.objects.get(action=action, transition="begin_submission")
    assert (event.from_state, event.to_state) == (S.AUTHORIZED, S.SUBMITTING)
    assert event.evidence["approval_id"] == approval.pk


def test_an_approval_one_second_before_its_expiry_can_still_be_reserved(
    manager: Any, agent_actor: Actor, settings: Any
) -> None:
    """Invariant 6: the expiry check is exact, so the stale test below is about expiry and nothing else."""
    settings.APPROVAL_TTL_SECONDS = 60
    order = make_order(captured="100.00")
    action = propose(agent_actor, order, amount="40.00")
    approved_at = timezone.now()
    approve(action, manager, now=approved_at)

    claim = submission_begin(action_pk=action.pk, now=approved_at + timedelta(seconds=59))

    assert claim.outcome == ClaimOutcome.CLAIMED
    assert order_of(action).reserved_amount == Decimal("40.00")


# --- the approval no longer holds -------------------------------------------------------


def test_a_change_to_the_order_since_the_approval_makes_the_action_stale_and_reserves_nothing(
    manager: Any, agent_actor: Actor
) -> None:
    """Invariant 6: nothing is submitted under an approval bound to an older order version."""
    order = make_order(captured="100.00")
    action = propose(agent_actor, order, amount="40.00")
    approve(action, manager)
    # A correction to the order (anything that touches its money bumps the version).
    Order.objects.filter(pk=order.pk).update(version=F("version") + 1)
    version_before_claim = order_of(action).version

    claim = submission_begin(action_pk=action.pk)

    assert_stale_naming(claim, action, "order_version")
    after = order_of(action)
    assert after.reserved_amount == Decimal("0")
    assert after.version == version_before_claim


@pytest.mark.parametrize("seconds_after_approval", [60, 61, 25 * 3600])
def test_an_expired_approval_makes_the_action_stale_and_reserves_nothing(
    seconds_after_approval: int, manager: Any, agent_actor: Actor, settings: Any
) -> None:
    """Invariant 6: nothing is submitted after the approval's expiry (expiry itself included)."""
    settings.APPROVAL_TTL_SECONDS = 60
    order = make_order(captured="100.00")
    action = propose(agent_actor, order, amount="40.00")
    approved_at = timezone.now()
    approve(action, manager, now=approved_at)
    version_before_claim = order_of(action).version

    claim = submission_begin(action_pk=action.pk, now=approved_at + timedelta(seconds=seconds_after_approval))

    assert_stale_naming(claim, action, "expiry")
    after = order_of(action)
    assert after.reserved_amount == Decimal("0")
    assert after.version == version_before_claim


def test_a_partial_refund_reserved_by_someone_else_makes_the_full_refund_approval_stale(
    manager: Any, agent_actor: Actor
) -> None:
    """Invariants 5 and 6: the full refund was approved against an order that has since changed."""
    order = make_order(captured="100.00")
    full = propose(agent_actor, order, amount="100.00")
    partial = propose(agent_actor, order, amount="30.00")
    approve(full, manager)
    approve(partial, manager)
    assert submission_begin(action_pk=partial.pk).outcome == ClaimOutcome.CLAIMED

    claim = submission_begin(action_pk=full.pk)

    assert_stale_naming(claim, full, "order_version")
    assert order_of(full).reserved_amount == Decimal("30.00")
    assert fresh(partial).status == S.SUBMITTING
    assert_order_money_adds_up(order)


def test_a_manager_cannot_approve_more_than_the_balance_left_after_another_reservation(
    manager: Any, agent_actor: Actor
) -> None:
    """Invariant 5: once a partial refund is reserved, approving the full amount is refused up front."""
    order = make_order(captured="100.00")
    full = propose(agent_actor, order, amount="100.00")
    partial = propose(agent_actor, order, amount="30.00")
    approve(partial, manager)
    submission_begin(action_pk=partial.pk)

    with pytest.raises(DecisionRefused) as refused:
        approval_decide(action_pk=full.pk, user=manager, decision="approve")

    assert refused.value.code == "over_refundable_balance"
    assert fresh(full).status == ActionStatus.PROPOSED
    assert not Approval.objects.filter(action=full).exists()


def test_an_approval_at_the_current_version_whose_balance_no_longer_covers_it_is_stale_naming_the_balance(
    manager: Any, agent_actor: Actor
) -> None:
    """Invariant 5: the reservation re-checks the balance itself, whatever approved the action.

    The decision service refuses such an approval now; this approval is written directly to
    prove the reservation does not rely on that.
    """
    order = make_order(captured="100.00")
    full = propose(agent_actor, order, amount="100.00")
    partial = propose(agent_actor, order, amount="30.00")
    approve(partial, manager)
    submission_begin(action_pk=partial.pk)
    with transaction.atomic():
        locked = Action.objects.select_for_update().get(pk=full.pk)
        approval_record(
            action=locked,
            approver=manager,
            label=manager.username,
            policy="manager",
            policy_detail={},
            note="written directly",
            now=timezone.now(),
            actor=Actor.for_user(manager),
        )

    claim = submission_begin(action_pk=full.pk)

    assert_stale_naming(claim, full, "balance")
    assert order_of(full).reserved_amount == Decimal("30.00")


# --- nothing to claim -------------------------------------------------------------------


def claim_changes_nothing(action: Action) -> None:
    before_action = fresh(action)
    before_order = order_of(action)
    events_before = transitions(action)
    attempts_before = Attempt.objects.filter(action=action).count()

    claim = submission_begin(action_pk=action.pk)

    assert claim.outcome == ClaimOutcome.TAKEN
    after_action = fresh(action)
    assert after_action.status == before_action.status
    assert after_action.lease_token == before_action.lease_token
    assert after_action.attempt_count == before_action.attempt_count
    after_order = order_of(action)
    assert (after_order.version, after_order.reserved_amount) == (before_order.version, before_order.reserved_amount)
    assert transitions(action) == events_before
    assert Attempt.objects.filter(action=action).count() == attempts_before


def test_claiming_a_proposal_that_nobody_approved_changes_nothing(agent_actor: Actor) -> None:
    """Invariant 3: no SUBMITTING row, and so no receiver call, without an approval."""
    action = propose(agent_actor, make_order(captured="100.00"), amount="40.00")

    claim_changes_nothing(action)

    assert fresh(action).status == S.PROPOSED


def test_claiming_an_action_that_is_already_submitting_does_not_reserve_twice(manager: Any, agent_actor: Actor) -> None:
    """Invariants 1 and 5: a second claim (a redelivered task) neither reserves again nor takes the lease."""
    order = make_order(captured="100.00")
    action = propose(agent_actor, order, amount="40.00")
    approve(action, manager)
    submission_begin(action_pk=action.pk)

    claim_changes_nothing(action)

    assert order_of(action).reserved_amount == Decimal("40.00")


def test_claiming_a_stale_action_changes_nothing(manager: Any, agent_actor: Actor) -> None:
    """Invariant 6: a stale action stays stale until a manager decides again."""
    order = make_order(captured="100.00")
    action = propose(agent_actor, order, amount="40.00")
    approve(action, manager)
    Order.objects.filter(pk=order.pk).update(version=F("version") + 1)
    submission_begin(action_pk=action.pk)

    claim_changes_nothing(action)

    assert fresh(action).status == S.STALE


# --- a new decision ---------------------------------------------------------------------


def test_a_stale_action_reopened_and_approved_again_is_reserved_under_the_new_approval(
    manager: Any, agent_actor: Actor
) -> None:
    """Invariant 6: the reservation acts on the new decision, bound to the order as it is now."""
    order = make_order(captured="200.00")
    full = propose(agent_actor, order, amount="100.00")
    partial = propose(agent_actor, order, amount="30.00")
    approve(full, manager)
    approve(partial, manager)
    submission_begin(action_pk=partial.pk)
    assert submission_begin(action_pk=full.pk).outcome == ClaimOutcome.STALE

    action_reopen(action_pk=full.pk, user=manager)
    new_approval = approve(full, manager)
    claim = submission_begin(action_pk=full.pk)

    assert claim.outcome == ClaimOutcome.CLAIMED
    assert fresh(full).status == S.SUBMITTING
    assert transitions(full) == ["propose", "approve", "invalidate", "reopen", "approve", "begin_submission"]
    event = ActionEvent.objects.get(action=full, transition="begin_submission")
    assert event.evidence["approval_id"] == new_approval.pk
    after = order_of(full)
    assert after.reserved_amount == Decimal("130.00")
    assert new_approval.order_version is not None
    assert after.version == new_approval.order_version + 1
    assert_order_money_adds_up(order)


def test_a_stale_action_after_expiry_reopened_and_approved_again_is_reserved(
    manager: Any, agent_actor: Actor, settings: Any
) -> None:
    """Invariant 6: an expired approval is replaced by a new one, never extended."""
    settings.APPROVAL_TTL_SECONDS = 60
    order = make_order(captured="100.00")
    action = propose(agent_actor, order, amount="40.00")
    first_approved_at = timezone.now() - timedelta(hours=2)
    approve(action, manager, now=first_approved_at)
    assert submission_begin(action_pk=action.pk).outcome == ClaimOutcome.STALE

    action_reopen(action_pk=action.pk, user=manager)
    new_approval = approve(action, manager)
    claim = submission_begin(action_pk=action.pk)

    assert claim.outcome == ClaimOutcome.CLAIMED
    event = ActionEvent.objects.get(action=action, transition="begin_submission")
    assert event.evidence["approval_id"] == new_approval.pk
    assert order_of(action).reserved_amount == Decimal("40.00")
