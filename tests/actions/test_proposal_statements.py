"""What one auto-approved refund proposal sends to the database (P-a).

The auto-approval policy decides before the INSERT, so the action is inserted AUTHORIZED; its
two events are inserted together (``actions.foundation.trail.Writes``). Its transaction is the proposal
function's own, so the INSERT needs no savepoint: a lost race on the action id ends the
transaction and the winner is read after it (``answers_a_lost_proposal_race``;
tests/concurrency/test_proposal_race.py races it on PostgreSQL). Here: the statements
themselves, the trail they leave, and that an IntegrityError that is not a lost race is raised,
not taken for one.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, connection
from django.test.utils import CaptureQueriesContext

from actions.kinds.refund.proposal import action_propose_refund
from actions.models import Action, ActionEvent, ActionStatus
from actions.services import Actor
from approvals.models import Approval
from tests.factories import make_order, make_request

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def no_publish(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)


def propose(proposer: Actor, order_number: str = "1001") -> Any:
    order = make_order(number=order_number, captured="100.00")
    request = make_request(order)
    return action_propose_refund(
        order_number=order.number,
        request_number=request.number,
        amount="10.00",
        currency="EUR",
        reason_code="damaged",
        proposer=proposer,
    )


def test_an_auto_approved_proposal_is_eight_statements_and_inserted_authorized(agent_actor: Actor) -> None:
    propose(agent_actor, "1000")  # the first proposal of a process also loads what is cached
    with CaptureQueriesContext(connection) as queries:
        result = propose(agent_actor)
    assert result.action.status == ActionStatus.AUTHORIZED
    sent = [query["sql"] for query in queries.captured_queries]
    proposal = sent[sent.index("BEGIN") + 1 : sent.index("COMMIT")]
    assert not [sql for sql in proposal if "SAVEPOINT" in sql], proposal
    # The request and order; the order locked; the agent locked, with its webhook (for both
    # events' outbox rows); the caps; the target's and the agent's totals in one read; the
    # action, inserted AUTHORIZED (the policy decided first); the approval; both events.
    assert len(proposal) == 8, "\n".join(proposal)
    assert not [sql for sql in proposal if sql.startswith('UPDATE "actions_action"')]
    assert len([sql for sql in proposal if sql.startswith('INSERT INTO "actions_actionevent"')]) == 1
    trail = list(ActionEvent.objects.filter(action=result.action).values_list("transition", "from_state", "to_state"))
    assert trail == [("propose", "", "PROPOSED"), ("approve", "PROPOSED", "AUTHORIZED")]


def test_an_integrity_error_that_is_not_a_lost_race_is_raised_and_writes_nothing(
    agent_actor: Actor, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused_insert(self: Action, *args: Any, **kwargs: Any) -> None:
        raise IntegrityError('new row for relation "actions_action" violates check constraint "amount_positive"')

    monkeypatch.setattr(Action, "save", refused_insert)
    with pytest.raises(IntegrityError, match="amount_positive"):
        propose(agent_actor)
    assert not Action.objects.exists()
    assert not ActionEvent.objects.exists()
    assert not Approval.objects.exists()


def test_a_repeated_proposal_meets_the_unique_action_id_and_returns_the_first_row(agent_actor: Actor) -> None:
    """A repeat is not read first: its INSERT meets the UNIQUE action id, which ends its
    transaction (nothing of it stays), and the row that holds the id is returned."""
    first = propose(agent_actor).action
    again = action_propose_refund(
        order_number="1001",
        request_number=1,
        amount="10.00",
        currency="EUR",
        reason_code="damaged",
        proposer=agent_actor,
    )
    assert again.created is False
    assert again.action.pk == first.pk
    assert Action.objects.count() == 1
    assert sorted(ActionEvent.objects.values_list("transition", flat=True)) == ["approve", "propose"]
    assert Approval.objects.count() == 1


def test_a_cap_that_holds_a_proposal_writes_its_hold_after_the_proposal_event(
    agent_actor: Actor, settings: Any
) -> None:
    """The hold is inserted with the proposal's event, in order: the trail reads "proposed, then
    held by the cap", and a PROPOSED-to-PROPOSED hold sends the agent no webhook."""
    settings.AUTO_APPROVAL_TARGET_MAX_COUNT = 0
    held = propose(agent_actor).action
    assert held.status == ActionStatus.PROPOSED
    trail = list(
        ActionEvent.objects.filter(action=held).order_by("created_at", "id").values_list("transition", "to_state")
    )
    assert trail == [("propose", "PROPOSED"), ("auto_approval_held", "PROPOSED")]


def test_an_approval_for_an_action_not_inserted_authorized_is_refused_before_anything_is_written(
    agent_actor: Actor, settings: Any
) -> None:
    """``approval_record(transitioned=True)`` writes the "approve" event without the transition,
    so it must only ever see an action the proposal inserted AUTHORIZED."""
    from django.utils import timezone

    from approvals.policy import approval_record

    settings.AUTO_APPROVAL_TARGET_MAX_COUNT = 0  # the cap holds it: it stays PROPOSED
    held = propose(agent_actor).action
    assert held.status == ActionStatus.PROPOSED
    with pytest.raises(ValueError, match="not inserted AUTHORIZED"):
        approval_record(
            action=held,
            approver=None,
            label="policy:test",
            policy="auto_threshold",
            policy_detail={},
            note="",
            now=timezone.now(),
            actor=Actor.system("test"),
            transitioned=True,
        )
    assert not Approval.objects.filter(action=held).exists()
    assert not ActionEvent.objects.filter(action=held, transition="approve").exists()
