"""What the lease holder's record does with each answer (docs/architecture.md sections 4 to 7).

The counterpart of test_dispatcher_fence.py: here the dispatcher still holds its lease, so the
receiver's answer moves the action, books or releases the order's money, opens the remedy, and
schedules reconciliation, each exactly as the outcome table says. Written to kill the mutants
of ``actions/execution.py`` that the scenario tests left alive (tests/MUTATION.md).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.contrib.auth.models import Group
from django.db import connection
from django.utils import timezone

from actions.engine.reconcile import reconcile_claim
from actions.engine.record import submission_record
from actions.engine.sweeps import sweep_expired_leases
from actions.kinds.base import Answer, Outcome
from actions.kinds.refund.contract import answer_from_refund, refund_contract
from actions.models import Action, ActionEvent, ActionStatus, Attempt, Order, OwnerGroup, Remedy
from actions.providers.base import AmbiguousError, DefinitiveError, IdempotencyMismatchError, RefundStatus
from actions.services import Actor
from tests.actions.test_dispatcher_fence import claimed, receiver_refund
from tests.actions.test_reconciliation import AMOUNT, guarantees
from tests.approvals.test_policy_pins import other_session  # noqa: F401 -- a fixture
from tests.factories import make_user

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

S = ActionStatus


@pytest.fixture(autouse=True)
def no_broker(dispatched: list[int]) -> list[int]:
    return dispatched


def money(action: Action) -> tuple[Decimal, Decimal]:
    order = Order.objects.get(actions=action)
    return order.refunded_amount, order.reserved_amount


def record(action: Action, attempt: Attempt, token: uuid.UUID, answer: Answer, **kwargs: Any) -> tuple[str, datetime]:
    """Record as the lease holder; returns the result and the moment just before recording."""
    before = timezone.now()
    return submission_record(
        action_pk=action.pk, attempt_pk=attempt.pk, lease_token=token, answer=answer, **kwargs
    ), before


def timed_out() -> Answer:
    return Answer(Outcome.UNKNOWN, error=AmbiguousError("read timed out", code="timeout"))


# --- money booking ---------------------------------------------------------------------------


def test_a_confirmed_refund_turns_the_reservation_into_refunded_money(agent_actor: Actor) -> None:
    """Invariants 2 and 5: SUCCEEDED records the receiver's reference and moves exactly the action's
    amount from reserved to refunded, in the same transaction, with no remedy."""
    action, attempt, token = claimed(agent_actor)
    answer = answer_from_refund(receiver_refund(action, RefundStatus.SUCCEEDED, "re_ok"))

    result, _ = record(action, attempt, token, answer)

    assert result == S.SUCCEEDED
    action.refresh_from_db()
    assert (action.status, action.provider_reference) == (S.SUCCEEDED, "re_ok")
    assert money(action) == (AMOUNT, Decimal("0.00"))
    assert not Remedy.objects.filter(action=action).exists()
    attempt.refresh_from_db()
    assert (attempt.held_lease, attempt.outcome) == (True, "succeeded")
    assert attempt.response == answer.response_json() and attempt.error is None


def test_a_final_failure_releases_the_reservation_and_opens_a_remedy_for_a_named_owner(
    agent_actor: Actor, finance: Any
) -> None:
    """Invariant 5 and docs/architecture.md section 4: FAILED_FINAL releases the reservation (nothing refunded)
    and opens a remedy for the same amount and currency, owned by a person: the customer still
    expects their money."""
    action, attempt, token = claimed(agent_actor)
    answer = Answer(Outcome.FAILED_FINAL, error=DefinitiveError("amount exceeds the charge", code="amount_too_large"))

    result, _ = record(action, attempt, token, answer)

    assert result == S.FAILED_FINAL
    assert money(action) == (Decimal("0.00"), Decimal("0.00"))
    remedy = Remedy.objects.get(action=action)
    assert (remedy.amount, remedy.currency, remedy.owner) == (AMOUNT, "EUR", finance)
    assert remedy.note.startswith("Opened automatically: the refund failed for good."), "finance sees why it is open"
    attempt.refresh_from_db()
    assert attempt.error == answer.error_json() and attempt.response is None


def test_the_remedy_goes_to_the_owner_group_of_the_actions_kind(agent_actor: Actor, finance: Any) -> None:
    """Invariant 8: an admin's OwnerGroup mapping for refunds decides who follows up a failed refund,
    as it decides who reviews one."""
    desk = Group.objects.create(name="refund-desk")
    rita = make_user("rita.refunds")
    rita.groups.add(desk)
    OwnerGroup.objects.create(kind="refund", group=desk)
    action, attempt, token = claimed(agent_actor)

    record(action, attempt, token, Answer(Outcome.FAILED_FINAL, error=DefinitiveError("bad", code="amount_too_large")))

    assert Remedy.objects.get(action=action).owner == rita


def test_a_pending_refund_keeps_its_reservation_and_is_polled_after_the_base_backoff(agent_actor: Actor) -> None:
    """Invariant 5: SETTLING still holds the reservation; the settlement poller asks again after
    the base backoff."""
    action, attempt, token = claimed(agent_actor)
    answer = answer_from_refund(receiver_refund(action, RefundStatus.PENDING, "re_wait"))

    result, before = record(action, attempt, token, answer)

    assert result == S.SETTLING
    action.refresh_from_db()
    assert action.provider_reference == "re_wait"
    assert money(action) == (Decimal("0.00"), AMOUNT)
    backoff = timedelta(seconds=settings.RECONCILE_BASE_BACKOFF_SECONDS)
    assert action.next_reconcile_at is not None
    assert before + backoff <= action.next_reconcile_at <= timezone.now() + backoff


def test_an_ambiguous_answer_waits_for_the_receivers_visibility_delay_and_a_backoff(agent_actor: Actor) -> None:
    """Invariant 7: UNKNOWN keeps the reservation and is reconciled no earlier than the receiver's
    lookup visibility delay plus the base backoff, with at most a quarter of the backoff as jitter."""
    action, attempt, token = claimed(agent_actor)

    result, before = record(action, attempt, token, timed_out())

    assert result == S.UNKNOWN
    action.refresh_from_db()
    assert money(action) == (Decimal("0.00"), AMOUNT)
    base = timedelta(seconds=settings.RECONCILE_BASE_BACKOFF_SECONDS)
    earliest = before + timedelta(seconds=settings.PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS) + base
    assert action.next_reconcile_at is not None
    assert earliest <= action.next_reconcile_at <= timezone.now() + (earliest - before) + base * 0.25


# --- escalation --------------------------------------------------------------------------------


def test_a_reused_key_with_other_parameters_goes_to_a_named_person_at_once(agent_actor: Actor, finance: Any) -> None:
    """Invariant 8 (docs/architecture.md section 6: NEEDS_REVIEW at once): the owner is a finance member, the
    review is due after the configured hours, and the reservation is held through the review."""
    action, attempt, token = claimed(agent_actor)
    answer = Answer(Outcome.NEEDS_REVIEW, error=IdempotencyMismatchError("key reused", code="idempotency_error"))

    result, before = record(action, attempt, token, answer)

    assert result == S.NEEDS_REVIEW
    action.refresh_from_db()
    assert action.owner == finance
    due = timedelta(hours=settings.REVIEW_DUE_HOURS)
    assert action.due_at is not None and before + due <= action.due_at <= timezone.now() + due
    assert money(action) == (Decimal("0.00"), AMOUNT)
    event = ActionEvent.objects.get(action=action, transition="escalate")
    assert event.evidence["owner"] == finance.get_username()


@pytest.mark.parametrize(
    ("keys", "lookup", "expected"),
    [
        (False, False, S.NEEDS_REVIEW),
        (True, False, S.UNKNOWN),
        (False, True, S.UNKNOWN),
        (True, True, S.UNKNOWN),
    ],
)
def test_only_a_receiver_with_neither_lookup_nor_keys_sends_a_lost_answer_straight_to_a_person(
    agent_actor: Actor, finance: Any, keys: bool, lookup: bool, expected: str
) -> None:
    """Invariants 7 and 16: with a lookup or with keys, reconciliation can still find out what
    happened, so an ambiguous answer waits in UNKNOWN; with neither, a person decides at once."""
    action, attempt, token = claimed(agent_actor)

    result, _ = record(
        action,
        attempt,
        token,
        timed_out(),
        contract=refund_contract(guarantees(keys=keys, lookup=lookup, authoritative=lookup)),
    )

    assert result == expected
    action.refresh_from_db()
    assert action.status == expected
    assert (action.owner == finance) is (expected == S.NEEDS_REVIEW)
    assert money(action) == (Decimal("0.00"), AMOUNT)


@pytest.mark.parametrize(
    "answer",
    [
        lambda action: answer_from_refund(receiver_refund(action, RefundStatus.SUCCEEDED)),
        lambda action: Answer(Outcome.FAILED_FINAL, error=DefinitiveError("bad amount", code="amount_too_large")),
    ],
    ids=["succeeded", "failed"],
)
def test_a_conclusive_answer_from_a_receiver_without_lookup_or_keys_is_recorded_as_it_is(
    agent_actor: Actor, finance: Any, answer: Callable[[Action], Answer]
) -> None:
    """Invariant 2: escalating at once is for a lost answer only; a receiver that did answer is
    believed, whatever its guarantees."""
    action, attempt, token = claimed(agent_actor)
    given = answer(action)

    result, _ = record(
        action,
        attempt,
        token,
        given,
        contract=refund_contract(guarantees(keys=False, lookup=False, authoritative=False)),
    )

    assert result == {Outcome.SUCCEEDED: S.SUCCEEDED, Outcome.FAILED_FINAL: S.FAILED_FINAL}[given.outcome]


def test_a_lost_answer_without_known_guarantees_is_left_to_reconciliation(agent_actor: Actor) -> None:
    """Invariant 7: a caller that does not say what the receiver guarantees gets the default path,
    UNKNOWN and reconciliation, never an escalation on a guess."""
    action, attempt, token = claimed(agent_actor)

    result, _ = record(action, attempt, token, timed_out(), contract=None)

    assert result == S.UNKNOWN


# --- lease expiry --------------------------------------------------------------------------------


def test_the_lease_sweep_hands_an_expired_lease_to_reconciliation_after_the_visibility_delay(
    agent_actor: Actor,
) -> None:
    """Invariants 7 and 8: an expired SUBMITTING lease goes to UNKNOWN (never back to a retry), its
    reservation held, to be reconciled once the receiver's lookup can see the request; a lease
    that has not expired yet is left alone."""
    action, _, token = claimed(agent_actor)
    assert action.lease_expires_at is not None

    assert sweep_expired_leases(now=action.lease_expires_at - timedelta(seconds=1)) == 0
    action.refresh_from_db()
    assert action.status == S.SUBMITTING

    lease_expires_at = action.lease_expires_at
    swept_at = lease_expires_at + timedelta(seconds=1)
    assert sweep_expired_leases(now=swept_at) == 1

    action.refresh_from_db()
    assert (action.status, action.status_changed_at) == (S.UNKNOWN, swept_at)
    assert action.next_reconcile_at == swept_at + timedelta(seconds=settings.PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS)
    assert money(action) == (Decimal("0.00"), AMOUNT)
    event = ActionEvent.objects.filter(action=action).order_by("pk").last()
    assert event is not None and event.transition == "mark_unknown"
    # The trail tells a person which lease ran out, when, and what happens next.
    assert event.actor_label == "system:lease-sweeper"
    assert event.evidence == {"lease_token": str(token), "lease_expires_at": str(lease_expires_at)}
    assert event.reason == (
        f"The lease expired at {lease_expires_at:%H:%M:%S} with no recorded outcome; "
        "reconciliation will ask the receiver before anything else."
    )


def test_the_lease_sweep_skips_a_row_a_worker_is_recording_instead_of_waiting_for_it(
    agent_actor: Actor,
    other_session: psycopg.Connection[Any],  # noqa: F811 -- the imported fixture
) -> None:
    """SKIP LOCKED: a worker recording its answer holds the row; the sweep takes the other expired
    lease and leaves that one (``lock_timeout`` turns a wait into an error here), so a slow record
    never holds up every other expiry."""
    recording, _, _ = claimed(agent_actor)
    other, _, _ = claimed(agent_actor)
    assert recording.lease_expires_at is not None and other.lease_expires_at is not None
    other_session.execute("SELECT id FROM actions_action WHERE id = %s FOR UPDATE", [recording.pk])
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '2s'")

    assert sweep_expired_leases(now=max(recording.lease_expires_at, other.lease_expires_at) + timedelta(seconds=1)) == 1

    assert Action.objects.get(pk=recording.pk).status == S.SUBMITTING
    assert Action.objects.get(pk=other.pk).status == S.UNKNOWN


def test_the_lease_sweep_leaves_a_reconcilers_expired_lease_to_reconciliation(agent_actor: Actor) -> None:
    """Invariant 8: a reconciler that died mid-pass leaves an UNKNOWN action with an expired lease;
    the next reconciliation replaces it (next_reconcile_at), the SUBMITTING sweep does not touch it."""
    action, _, _ = claimed(agent_actor)
    assert action.lease_expires_at is not None
    swept_at = action.lease_expires_at + timedelta(seconds=1)
    sweep_expired_leases(now=swept_at)
    action.refresh_from_db()
    assert action.next_reconcile_at is not None
    assert reconcile_claim(action_pk=action.pk, now=action.next_reconcile_at) is not None
    action.refresh_from_db()
    assert action.lease_expires_at is not None

    assert sweep_expired_leases(now=action.lease_expires_at + timedelta(minutes=5)) == 0

    action.refresh_from_db()
    assert action.status == S.UNKNOWN
