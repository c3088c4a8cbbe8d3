"""Races on the atomic reservation, on PostgreSQL with one connection per thread.

Each test lines its threads up on a barrier and repeats the race for several rounds (a fresh
order each time) so that more than one interleaving is likely. Whatever the interleaving, the
order's money adds up (invariant 5) and nothing is reserved under an approval whose bound order
version differs from the order's version at that moment (invariant 6). The database's CHECK
constraint is a last net: the code must stop the loser itself, as STALE, before the constraint
would have to.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest

from actions.engine.claim import Claim, ClaimOutcome, submission_begin
from actions.kinds import kind_for
from actions.kinds.refund.proposal import action_propose_refund
from actions.models import Action, ActionEvent, ActionStatus, Attempt, Order
from actions.services import Actor
from approvals.models import Approval, Decision
from approvals.services import approval_decide
from tests.approvals.test_reservation import assert_order_money_adds_up
from tests.factories import make_order, make_request
from tests.threads import THREAD_TIMEOUT, run_at_once

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

S = ActionStatus
ROUNDS = 5
CLAIMERS = 6  # below the connection pool's default size of 10, with the test's own connection


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


def approve(action: Action, manager: Any) -> Approval:
    return approval_decide(action_pk=action.pk, user=manager, decision=Decision.APPROVE)


def claim(action: Action) -> Callable[[], Claim]:
    return lambda: submission_begin(action_pk=action.pk)


def outcomes(claims: list[Claim]) -> list[ClaimOutcome]:
    return sorted((c.outcome for c in claims), key=lambda outcome: outcome.value)


def assert_reservations_follow_the_order_versions(order: Order, first_version: int) -> None:
    """Invariant 6, read back from the audit trail.

    Every reservation bumps the order's version by one while it holds the order's row lock,
    and writes its begin_submission event before it commits. So, in the order of those
    events, the n-th reservation on the order happened at version ``first_version + n`` and
    must have acted on an approval bound to exactly that version.
    """
    events = ActionEvent.objects.filter(action__order=order, transition="begin_submission").order_by("pk")
    bound_versions = [Approval.objects.get(pk=event.evidence["approval_id"]).order_version for event in events]
    expected = list(range(first_version, first_version + len(bound_versions)))
    assert bound_versions == expected, (
        f"{order}: reservations acted on approvals bound to versions {bound_versions}, "
        f"but the order was at versions {expected} when they were made"
    )
    assert Order.objects.get(pk=order.pk).version == first_version + len(bound_versions)


# --- (a) many workers, one action ---------------------------------------------------------


def test_workers_racing_to_claim_one_action_reserve_it_exactly_once(manager: Any, agent_actor: Actor) -> None:
    """Invariants 1 and 5: one claim wins, the others see it taken; the amount is reserved once."""
    for _ in range(ROUNDS):
        order = make_order(captured="100.00")
        action = propose(agent_actor, order, amount="40.00")
        approve(action, manager)
        version_at_approval = Order.objects.get(pk=order.pk).version

        claims = run_at_once(*[claim(action) for _ in range(CLAIMERS)])

        assert outcomes(claims) == [ClaimOutcome.CLAIMED] + [ClaimOutcome.TAKEN] * (CLAIMERS - 1)
        winner = next(c for c in claims if c.outcome == ClaimOutcome.CLAIMED)
        claimed = Action.objects.get(pk=action.pk)
        assert claimed.status == S.SUBMITTING
        assert claimed.lease_token == winner.lease_token
        assert claimed.attempt_count == 1
        after = Order.objects.get(pk=order.pk)
        assert after.reserved_amount == Decimal("40.00")
        assert after.version == version_at_approval + 1
        assert Attempt.objects.filter(action=action).count() == 1
        assert ActionEvent.objects.filter(action=action, transition="begin_submission").count() == 1
        assert not ActionEvent.objects.filter(action=action, transition="invalidate").exists()
        assert_order_money_adds_up(order)
        assert_reservations_follow_the_order_versions(order, version_at_approval)


# --- (b) two actions, one order version -----------------------------------------------------


def test_two_actions_approved_against_the_same_order_version_cannot_both_be_reserved(
    manager: Any, agent_actor: Actor
) -> None:
    """Invariant 6: the first reservation changes the order, so the other approval is outdated."""
    for _ in range(ROUNDS):
        order = make_order(captured="100.00")
        first = propose(agent_actor, order, amount="30.00")
        second = propose(agent_actor, order, amount="40.00")
        approve(first, manager)
        approve(second, manager)
        version_at_approval = Order.objects.get(pk=order.pk).version

        claims = run_at_once(claim(first), claim(second))

        assert outcomes(claims) == [ClaimOutcome.CLAIMED, ClaimOutcome.STALE]
        loser = next(c for c in claims if c.outcome == ClaimOutcome.STALE)
        assert [failure["binding"] for failure in loser.failures] == ["order_version"]
        assert loser.action is not None
        statuses = sorted(Action.objects.filter(order=order).values_list("status", flat=True))
        assert statuses == [S.STALE, S.SUBMITTING]
        assert not Attempt.objects.filter(action=loser.action).exists()
        assert_order_money_adds_up(order)
        assert_reservations_follow_the_order_versions(order, version_at_approval)


# --- (c) two actions that together exceed the captured amount -------------------------------


def test_two_refunds_that_together_exceed_the_captured_amount_are_never_both_reserved(
    manager: Any, agent_actor: Actor
) -> None:
    """Invariant 5: the loser goes STALE; the CHECK constraint never has to stop it."""
    for _ in range(ROUNDS):
        order = make_order(captured="100.00")
        first = propose(agent_actor, order, amount="60.00")
        second = propose(agent_actor, order, amount="70.00")
        approve(first, manager)
        approve(second, manager)
        version_at_approval = Order.objects.get(pk=order.pk).version

        # run_at_once fails on any exception, an IntegrityError from the constraint included.
        claims = run_at_once(claim(first), claim(second))

        assert outcomes(claims) == [ClaimOutcome.CLAIMED, ClaimOutcome.STALE]
        winner = next(c for c in claims if c.outcome == ClaimOutcome.CLAIMED)
        loser = next(c for c in claims if c.outcome == ClaimOutcome.STALE)
        assert winner.action is not None and loser.action is not None
        assert loser.failures, "a stale claim names the binding that failed"
        assert Action.objects.get(pk=loser.action.pk).status == S.STALE
        after = Order.objects.get(pk=order.pk)
        assert after.reserved_amount == winner.action.amount
        assert after.reserved_amount + after.refunded_amount <= after.captured_amount
        assert_order_money_adds_up(order)
        assert_reservations_follow_the_order_versions(order, version_at_approval)


# --- (d) a manager approving while the order changes ----------------------------------------


def test_a_manager_approving_while_the_order_changes_never_gets_a_reservation_on_an_old_version(
    manager: Any, agent_actor: Actor
) -> None:
    """Invariant 6: one thread approves an action and claims it while another reserves a second
    refund on the same order. Whichever way they interleave, every reservation acts on an
    approval bound to the version the order is at when it is made; a claim whose approval the
    other reservation outdated goes STALE."""
    for _ in range(ROUNDS):
        order = make_order(captured="100.00")
        other = propose(agent_actor, order, amount="30.00")
        approve(other, manager)
        action = propose(agent_actor, order, amount="40.00")
        first_version = Order.objects.get(pk=order.pk).version

        def approve_then_claim(action: Action = action) -> Claim:
            approve(action, manager)
            return submission_begin(action_pk=action.pk)

        claims = run_at_once(approve_then_claim, claim(other))

        # Both may go through (the approval saw the order after the other reservation), or
        # the one whose approval was outdated first goes STALE; never both STALE.
        assert ClaimOutcome.CLAIMED in outcomes(claims)
        for stale in (c for c in claims if c.outcome != ClaimOutcome.CLAIMED):
            assert stale.outcome == ClaimOutcome.STALE
            assert [failure["binding"] for failure in stale.failures] == ["order_version"]
            assert stale.action is not None
            assert Action.objects.get(pk=stale.action.pk).status == S.STALE
            assert not Attempt.objects.filter(action=stale.action).exists()
        assert_order_money_adds_up(order)
        assert_reservations_follow_the_order_versions(order, first_version)


def test_an_approval_made_while_another_reservation_is_uncommitted_is_bound_to_the_committed_version(
    manager: Any, agent_actor: Actor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant 6, one interleaving forced: the approval reads the order while another
    reservation has changed it but not committed yet. The approval is bound to the version it
    could see, which that commit then outdates, so the approved action goes STALE."""
    order = make_order(captured="100.00")
    other = propose(agent_actor, order, amount="30.00")
    approve(other, manager)
    action = propose(agent_actor, order, amount="40.00")
    first_version = Order.objects.get(pk=order.pk).version

    reserved_not_committed = threading.Event()
    approval_made = threading.Event()
    refund_kind = kind_for("refund")
    request_body = refund_kind.request_body

    def pause_inside_the_reservation(being_submitted: Action) -> dict[str, Any]:
        # Called inside submission_begin's transaction, after the order's UPDATE (the lease's attempt).
        if being_submitted.pk == other.pk:
            reserved_not_committed.set()
            assert approval_made.wait(THREAD_TIMEOUT), "the approval never finished"
        return request_body(being_submitted)

    monkeypatch.setattr(refund_kind, "request_body", pause_inside_the_reservation)

    def approve_in_between() -> Approval:
        assert reserved_not_committed.wait(THREAD_TIMEOUT), "the reservation never started"
        try:
            return approve(action, manager)
        finally:
            approval_made.set()

    other_claim, approval = run_at_once(claim(other), approve_in_between)

    assert other_claim.outcome == ClaimOutcome.CLAIMED
    assert approval.order_version == first_version
    assert Order.objects.get(pk=order.pk).version == first_version + 1

    late_claim = submission_begin(action_pk=action.pk)

    assert late_claim.outcome == ClaimOutcome.STALE
    assert [failure["binding"] for failure in late_claim.failures] == ["order_version"]
    assert Action.objects.get(pk=action.pk).status == S.STALE
    assert_order_money_adds_up(order)
    assert_reservations_follow_the_order_versions(order, first_version)
