"""What each answer does to an action in each state it can arrive in (``apply_outcome``), row by
row: the transition, its audit event (reason, evidence, actor, time), the reference, when the
receiver is asked next, and the money. docs/architecture.md sections 4 and 5.

The scenario tests reach every row through the dispatcher and the reconciler; these call the
function itself, so that each sentence a person reads in the trail and each field it sets is
pinned (written against the survivors of ``make mutate MODULE=actions.engine.dispatch``,
tests/MUTATION.md, sixth batch).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from actions.engine import outcomes
from actions.engine.outcomes import apply_outcome
from actions.engine.record import submission_record
from actions.kinds import kind_for
from actions.kinds.base import Answer, Outcome
from actions.kinds.refund.contract import answer_from_refund
from actions.models import Action, ActionEvent, ActionStatus, Remedy
from actions.providers.base import AmbiguousError, DefinitiveError, IdempotencyMismatchError, RefundStatus
from actions.review import services as finance_services
from actions.services import Actor
from tests.actions.test_dispatcher_fence import claimed, expire_lease, receiver_refund
from tests.actions.test_dispatcher_records import money
from tests.actions.test_reconciliation import AMOUNT

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
S = ActionStatus
ACTOR = Actor.system("test-recorder")
WORDS = kind_for("refund").explanations


@pytest.fixture(autouse=True)
def no_broker(dispatched: list[int]) -> list[int]:
    return dispatched


def submitting(agent_actor: Actor) -> Action:
    action, _, _ = claimed(agent_actor)
    return Action.objects.get(pk=action.pk)


def unknown(agent_actor: Actor) -> Action:
    action, _, _ = claimed(agent_actor)
    expire_lease(action)
    return Action.objects.get(pk=action.pk)


def settling(agent_actor: Actor) -> Action:
    action = submitting(agent_actor)
    apply(action, pending(action), now=timezone.now())
    return Action.objects.get(pk=action.pk)


def apply(action: Action, answer: Answer, *, now: datetime) -> str:
    with transaction.atomic():
        return apply_outcome(
            action=action, answer=answer, actor=ACTOR, now=now, source="the test", evidence={"attempt_id": 7}
        )


def succeeded(action: Action) -> Answer:
    return answer_from_refund(receiver_refund(action, RefundStatus.SUCCEEDED, "re_ok"))


def pending(action: Action) -> Answer:
    return answer_from_refund(receiver_refund(action, RefundStatus.PENDING, "re_pending"))


def failed(action: Action) -> Answer:
    return Answer(Outcome.FAILED_FINAL, error=DefinitiveError("charge already refunded", code="charge_refunded"))


def last_event(action: Action) -> ActionEvent:
    event = ActionEvent.objects.filter(action=action).order_by("pk").last()
    assert event is not None
    return event


def assert_event(action: Action, *, transition: str, reason: str, answer: Answer, now: datetime) -> None:
    event = last_event(action)
    assert (event.transition, event.actor_label, event.reason) == (transition, "system:test-recorder", reason)
    assert event.evidence == {"answer": answer.summary(), "source": "the test", "attempt_id": 7}
    assert event.created_at == now == Action.objects.get(pk=action.pk).status_changed_at


# --- from SUBMITTING: the send's own answer ----------------------------------------------------


def test_submitting_and_succeeded_books_the_refund(agent_actor: Actor) -> None:
    action = submitting(agent_actor)
    answer, now = succeeded(action), timezone.now()

    assert apply(action, answer, now=now) == S.SUCCEEDED

    stored = Action.objects.get(pk=action.pk)
    assert (stored.provider_reference, stored.lease_token) == ("re_ok", None)
    assert_event(action, transition="record_success", reason=WORDS.succeeded, answer=answer, now=now)
    assert money(action) == (AMOUNT, Decimal("0.00"))


def test_submitting_and_pending_settles_later_and_asks_again_after_the_base_backoff(
    agent_actor: Actor, settings: Any
) -> None:
    action = submitting(agent_actor)
    answer, now = pending(action), timezone.now()

    assert apply(action, answer, now=now) == S.SETTLING

    stored = Action.objects.get(pk=action.pk)
    assert stored.provider_reference == "re_pending"
    assert stored.next_reconcile_at == now + timedelta(seconds=settings.RECONCILE_BASE_BACKOFF_SECONDS)
    assert_event(action, transition="record_pending", reason=WORDS.pending, answer=answer, now=now)
    assert money(action) == (Decimal("0.00"), AMOUNT), "still reserved until it settles"


def test_submitting_and_failed_releases_the_money_and_opens_the_remedy(agent_actor: Actor) -> None:
    action = submitting(agent_actor)
    answer, now = failed(action), timezone.now()

    assert apply(action, answer, now=now) == S.FAILED_FINAL

    reason = f"{WORDS.failed}: DefinitiveError: charge already refunded (code=charge_refunded)."
    assert_event(action, transition="record_failure", reason=reason, answer=answer, now=now)
    assert money(action) == (Decimal("0.00"), Decimal("0.00"))
    assert Remedy.objects.filter(action=action).count() == 1


def test_a_refund_the_receiver_created_and_then_failed_keeps_its_reference(agent_actor: Actor) -> None:
    """A failure the receiver has a record of (a refund it created and then failed) names that
    record on the action, as a success does: finance and the reconciler look it up by it."""
    action = submitting(agent_actor)
    answer = answer_from_refund(receiver_refund(action, RefundStatus.FAILED, "re_failed"))
    assert (answer.outcome, answer.reference) == (Outcome.FAILED_FINAL, "re_failed")

    assert apply(action, answer, now=timezone.now()) == S.FAILED_FINAL

    assert Action.objects.get(pk=action.pk).provider_reference == "re_failed"
    assert money(action) == (Decimal("0.00"), Decimal("0.00"))


@pytest.mark.parametrize("make_answer", [succeeded, pending, failed], ids=["succeeded", "pending", "failed"])
def test_an_answer_recorded_from_the_claims_copy_keeps_the_owner_finance_gave_it_meanwhile(
    agent_actor: Actor, finance: Any, make_answer: Any
) -> None:
    """The review queue lists SUBMITTING actions, and finance may take one while its send is
    out. The dispatcher records the answer from its own copy of the action, made before that:
    the record writes only the columns it changes, so the owner finance set is kept."""
    action, attempt, token = claimed(agent_actor)
    assert action.owner is None
    finance_services.action_assign(action_pk=action.pk, user=finance)

    status = submission_record(
        action_pk=action.pk, attempt_pk=attempt.pk, lease_token=token, answer=make_answer(action), action=action
    )

    stored = Action.objects.get(pk=action.pk)
    assert stored.status == status != S.SUBMITTING
    assert stored.owner == finance


def test_submitting_and_inconclusive_is_unknown_and_reconciled_after_the_backoff(
    agent_actor: Actor, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(outcomes, "random", SimpleNamespace(uniform=lambda low, high: 0.0))
    action = submitting(agent_actor)
    answer, now = Answer(Outcome.UNKNOWN, error=AmbiguousError("read timed out", code="timeout")), timezone.now()

    assert apply(action, answer, now=now) == S.UNKNOWN

    stored = Action.objects.get(pk=action.pk)
    delay = settings.PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS + settings.RECONCILE_BASE_BACKOFF_SECONDS
    assert stored.next_reconcile_at == now + timedelta(seconds=delay)
    reason = (
        "The outcome is unknown (AmbiguousError: read timed out (code=timeout)); reconciliation will ask the receiver."
    )
    assert_event(action, transition="mark_unknown", reason=reason, answer=answer, now=now)
    assert money(action) == (Decimal("0.00"), AMOUNT)


def test_an_inconclusive_answer_without_a_retry_after_is_reconciled_after_the_usual_backoff(
    agent_actor: Actor, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kind seam lets a receiver answer with any exception (``Answer.error``): only the
    providers' errors carry a Retry-After. Any other inconclusive answer is reconciled after
    the usual backoff, rather than failing the record (the action would then wait for its lease
    to run out before anyone asked the receiver)."""
    monkeypatch.setattr(outcomes, "random", SimpleNamespace(uniform=lambda low, high: 0.0))
    action = submitting(agent_actor)
    now = timezone.now()

    assert apply(action, Answer(Outcome.UNKNOWN, error=TimeoutError("read timed out")), now=now) == S.UNKNOWN

    delay = settings.PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS + settings.RECONCILE_BASE_BACKOFF_SECONDS
    assert Action.objects.get(pk=action.pk).next_reconcile_at == now + timedelta(seconds=delay)


def test_an_answer_that_needs_a_person_escalates_with_the_answer_in_the_reason(agent_actor: Actor) -> None:
    action = submitting(agent_actor)
    answer = Answer(Outcome.NEEDS_REVIEW, error=IdempotencyMismatchError("key reused", code="idempotency_error"))

    assert apply(action, answer, now=timezone.now()) == S.NEEDS_REVIEW

    assert last_event(action).reason.startswith(
        "Needs a person: IdempotencyMismatchError: key reused (code=idempotency_error). Assigned to "
    )
    assert money(action) == (Decimal("0.00"), AMOUNT), "a person decides; nothing is booked or released"


# --- from UNKNOWN: what reconciliation found -----------------------------------------------------


@pytest.mark.parametrize(
    ("make_answer", "status", "money_after"),
    [
        (succeeded, S.SUCCEEDED, (AMOUNT, Decimal("0.00"))),
        (pending, S.SETTLING, (Decimal("0.00"), AMOUNT)),
        (failed, S.FAILED_FINAL, (Decimal("0.00"), Decimal("0.00"))),
    ],
    ids=["succeeded", "pending", "failed"],
)
def test_unknown_takes_the_status_of_the_record_reconciliation_found(
    agent_actor: Actor, settings: Any, make_answer: Any, status: str, money_after: tuple[Decimal, Decimal]
) -> None:
    action = unknown(agent_actor)
    answer, now = make_answer(action), timezone.now()

    assert apply(action, answer, now=now) == status

    stored = Action.objects.get(pk=action.pk)
    assert stored.provider_reference == answer.reference
    settle_poll = now + timedelta(seconds=settings.RECONCILE_BASE_BACKOFF_SECONDS)
    assert stored.next_reconcile_at == (settle_poll if status == S.SETTLING else None)
    reason = f"Reconciliation found the receiver's record: {answer.summary()}."
    assert_event(action, transition="reconcile_found", reason=reason, answer=answer, now=now)
    assert money(action) == money_after


# --- from SETTLING: the settlement poller --------------------------------------------------------


def test_settling_and_still_pending_changes_nothing(agent_actor: Actor) -> None:
    action = settling(agent_actor)
    events = ActionEvent.objects.filter(action=action).count()

    assert apply(action, pending(action), now=timezone.now()) == S.SETTLING

    assert ActionEvent.objects.filter(action=action).count() == events
    assert money(action) == (Decimal("0.00"), AMOUNT)


@pytest.mark.parametrize(
    ("make_answer", "status", "money_after"),
    [(succeeded, S.SUCCEEDED, (AMOUNT, Decimal("0.00"))), (failed, S.FAILED_FINAL, (Decimal("0.00"), Decimal("0.00")))],
    ids=["succeeded", "failed"],
)
def test_settling_settles_on_the_receivers_final_word(
    agent_actor: Actor, make_answer: Any, status: str, money_after: tuple[Decimal, Decimal]
) -> None:
    action = settling(agent_actor)
    answer, now = make_answer(action), timezone.now()

    assert apply(action, answer, now=now) == status

    assert Action.objects.get(pk=action.pk).next_reconcile_at is None
    assert_event(
        action, transition="settle", reason=f"The receiver settled it: {answer.summary()}.", answer=answer, now=now
    )
    assert money(action) == money_after


# --- answers that cannot apply -------------------------------------------------------------------


def test_an_inconclusive_answer_outside_a_send_is_the_reconcilers_to_handle(agent_actor: Actor) -> None:
    action = unknown(agent_actor)
    answer = Answer(Outcome.UNKNOWN, error=AmbiguousError("read timed out", code="timeout"))

    with pytest.raises(ValueError) as refused:
        apply(action, answer, now=timezone.now())

    assert str(refused.value) == (
        "an inconclusive answer for an action that is not submitting belongs to the reconciler"
    )
    assert Action.objects.get(pk=action.pk).status == S.UNKNOWN


def test_only_a_send_can_prove_that_nothing_was_sent(agent_actor: Actor) -> None:
    action = unknown(agent_actor)

    with pytest.raises(ValueError) as refused:
        apply(action, Answer(Outcome.NOT_SENT, error=ConnectionRefusedError("451")), now=timezone.now())

    assert str(refused.value) == "only a send can prove that nothing was sent"
    assert Action.objects.get(pk=action.pk).status == S.UNKNOWN


def test_an_answer_for_an_action_in_no_receiving_state_is_refused(agent_actor: Actor) -> None:
    action = submitting(agent_actor)
    apply(action, succeeded(action), now=timezone.now())
    done = Action.objects.get(pk=action.pk)

    with pytest.raises(ValueError) as refused:
        apply(done, succeeded(done), now=timezone.now())

    assert str(refused.value) == "cannot apply a receiver's answer to an action in SUCCEEDED"
    assert money(action) == (AMOUNT, Decimal("0.00")), "booked once"
