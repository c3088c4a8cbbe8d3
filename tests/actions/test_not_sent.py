"""NOT_SENT: the receiver proved it was never handed the request (docs/architecture.md section 4).

The lease holder's record sends the action back to AUTHORIZED under the same approval and releases
what its claim reserved (the next claim reserves it anew); after ``NOT_SENT_MAX_ATTEMPTS`` refusals
it goes to a named person instead of being asked for ever (invariant 8). The supplier email's
tests (tests/kinds) reach this through a real SMTP relay; these drive the record directly with a
refund, in memory, so the mutation subset reaches ``actions.engine.outcomes._not_sent`` (its 31
mutants had no test in that subset: tests/MUTATION.md, sixth batch).
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from actions.engine.claim import ClaimOutcome, submission_begin
from actions.engine.record import submission_record
from actions.kinds import kind_for
from actions.kinds.base import Answer, Outcome
from actions.models import Action, ActionEvent, ActionStatus, Attempt, Order
from actions.services import Actor
from tests.actions.test_dispatcher_fence import claimed
from tests.actions.test_reconciliation import AMOUNT
from tests.kinds.test_supplier_email import approved_email
from tests.mail import supplier  # noqa: F401 -- a fixture

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

S = ActionStatus


@pytest.fixture(autouse=True)
def no_broker(dispatched: list[int]) -> list[int]:
    return dispatched


def refused() -> Answer:
    return Answer(Outcome.NOT_SENT, error=ConnectionRefusedError("451 try again later"))


def reserved(action: Action) -> Decimal:
    return Order.objects.get(actions=action).reserved_amount


def test_a_refusal_before_the_handover_sends_it_back_to_authorized_and_releases_the_reservation(
    agent_actor: Actor,
) -> None:
    """A refund's receiver never answers NOT_SENT (only the supplier email's relay does, below), but
    the record is the same for every kind, and a refund's reservation shows the release."""
    action, attempt, token = claimed(agent_actor)
    assert reserved(action) == AMOUNT
    before = timezone.now()

    result = submission_record(action_pk=action.pk, attempt_pk=attempt.pk, lease_token=token, answer=refused())

    assert result == S.AUTHORIZED
    stored = Action.objects.get(pk=action.pk)
    assert (stored.status, stored.lease_token, stored.owner) == (S.AUTHORIZED, None, None)
    assert reserved(action) == Decimal("0.00"), "the next claim reserves it anew"
    event = ActionEvent.objects.get(action=action, transition="record_not_sent")
    assert (event.from_state, event.to_state, event.actor_label) == (S.SUBMITTING, S.AUTHORIZED, "system:dispatcher")
    assert event.reason == (
        "Nothing was sent (ConnectionRefusedError: 451 try again later): the receiver refused before taking it. "
        "It will be sent again under the same approval."
    )
    assert event.evidence == {
        "answer": "ConnectionRefusedError: 451 try again later",
        "source": "submission",
        "attempt_id": attempt.pk,
    }
    attempt.refresh_from_db()
    assert (attempt.outcome, attempt.held_lease) == ("not_sent", True)
    # One moment for the record: the attempt's end, the event and the state change.
    assert before <= event.created_at == stored.status_changed_at == attempt.finished_at


def test_the_last_refusal_allowed_goes_to_a_named_person_with_the_count_and_the_money_kept_reserved(
    agent_actor: Actor, finance: Any, settings: Any
) -> None:
    """Invariant 8 at the boundary: the refusal that brings the attempts to NOT_SENT_MAX_ATTEMPTS
    (not one more) is a person's. The reservation stays: a person decides whether it is sent."""
    settings.NOT_SENT_MAX_ATTEMPTS = 1
    action, attempt, token = claimed(agent_actor)
    assert action.attempt_count == 1
    before = timezone.now()

    result = submission_record(action_pk=action.pk, attempt_pk=attempt.pk, lease_token=token, answer=refused())

    assert result == S.NEEDS_REVIEW
    stored = Action.objects.get(pk=action.pk)
    assert (stored.status, stored.owner) == (S.NEEDS_REVIEW, finance)
    recorded_at = Attempt.objects.get(pk=attempt.pk).finished_at
    assert recorded_at is not None and recorded_at >= before
    assert stored.due_at == recorded_at + timedelta(hours=settings.REVIEW_DUE_HOURS)
    assert reserved(action) == AMOUNT
    receiver = kind_for(action.kind).contract().receiver
    event = ActionEvent.objects.get(action=action, transition="escalate")
    assert (event.from_state, event.actor_label) == (S.SUBMITTING, "system:dispatcher")
    assert event.reason == (
        f"The {receiver} refused it 1 times without taking it (ConnectionRefusedError: 451 try again later); "
        "nothing was sent. A person decides whether to send it again. Assigned to fiona.finance "
        "(the owner group's member with the fewest open items)."
    )
    assert event.evidence == {
        "answer": "ConnectionRefusedError: 451 try again later",
        "source": "submission",
        "attempt_id": attempt.pk,
        "owner": "fiona.finance",
    }
    assert event.created_at == stored.status_changed_at == recorded_at
    assert not ActionEvent.objects.filter(action=action, transition="record_not_sent").exists()
    assert Attempt.objects.get(pk=attempt.pk).outcome == "not_sent"


def test_a_supplier_email_the_relay_refused_is_claimed_again_under_the_same_approval(
    agent_actor: Actor,
    manager: Any,
    supplier: Any,  # noqa: F811 -- the imported fixture
) -> None:
    """The kind whose relay does answer NOT_SENT (a 4xx before DATA): the next claim sends it again,
    under the approval the manager gave, with no new decision."""
    action = approved_email(agent_actor, manager)
    first = submission_begin(action_pk=action.pk)
    assert first.attempt is not None and first.lease_token is not None
    submission_record(action_pk=action.pk, attempt_pk=first.attempt.pk, lease_token=first.lease_token, answer=refused())
    assert Action.objects.get(pk=action.pk).status == S.AUTHORIZED

    again = submission_begin(action_pk=action.pk)

    assert again.outcome == ClaimOutcome.CLAIMED and again.action is not None
    assert (again.action.status, again.action.attempt_count) == (S.SUBMITTING, 2)
    assert again.lease_token not in (None, first.lease_token)
    assert list(ActionEvent.objects.filter(action=action).values_list("transition", flat=True)) == [
        "propose",
        "approve",
        "begin_submission",
        "record_not_sent",
        "begin_submission",
    ]
