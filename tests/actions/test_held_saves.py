"""Transitions written together at the end of a block of locked actions (issue 18, P-a).

``rows_written_together(actions_locked=True)`` holds back each transition's UPDATE, and each
answer written on an attempt, to the end of the block: one UPDATE per set of columns. The batched
claim and the grouped record use it, having locked their actions and checked their status and
lease. These tests pin what keeps that as safe as one conditional UPDATE per action: each row
must still be in its former status (and hold its lease, where the save was fenced), or nothing
of the block is written; a material column is never written this way; and the copy in hand can
be saved again afterwards.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django_fsm import ConcurrentTransition

from actions.models import Action, ActionEvent, ActionStatus
from actions.models.actions import MaterialFieldChanged
from actions.services import Actor
from actions.trail import action_transition, rows_written_together
from tests.actions.test_reconciliation import authorized_refund

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
S = ActionStatus


@pytest.fixture(autouse=True)
def no_publish(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)


def invalidate(action: Action) -> None:
    action_transition(action=action, transition="invalidate", actor=Actor.system("test"), reason="test")


def locked(pks: list[int]) -> list[Action]:
    return list(Action.objects.select_for_update().filter(pk__in=pks).order_by("pk"))


def test_the_transitions_of_a_block_are_one_update_and_the_copies_can_be_saved_again(agent_actor: Actor) -> None:
    pks = [authorized_refund(agent_actor).pk for _ in range(3)]
    with CaptureQueriesContext(connection) as queries, transaction.atomic(), rows_written_together(actions_locked=True):
        actions = locked(pks)
        for action in actions:
            invalidate(action)
    updates = [q["sql"] for q in queries.captured_queries if q["sql"].startswith('UPDATE "actions_action"')]
    assert len(updates) == 1
    assert set(Action.objects.filter(pk__in=pks).values_list("status", flat=True)) == {S.STALE}
    assert ActionEvent.objects.filter(action_id__in=pks, transition="invalidate").count() == 3
    # The copies know their rows are STALE now: the next conditional save finds them.
    for action in actions:
        action_transition(action=action, transition="reopen", actor=Actor.system("test"), reason="test")
    assert set(Action.objects.filter(pk__in=pks).values_list("status", flat=True)) == {S.PROPOSED}


def test_a_row_that_left_its_status_meanwhile_fails_the_whole_block(agent_actor: Actor) -> None:
    first, second = authorized_refund(agent_actor), authorized_refund(agent_actor)
    copies = list(Action.objects.filter(pk__in=[first.pk, second.pk]).order_by("pk"))
    # Not locked, so another writer could move it: the held UPDATE must not write over it.
    Action.objects.filter(pk=second.pk).update(status=S.CANCELLED)
    with (
        pytest.raises(ConcurrentTransition, match="1 of 2 actions left AUTHORIZED"),
        transaction.atomic(),
        rows_written_together(actions_locked=True),
    ):
        for action in copies:
            invalidate(action)
    assert Action.objects.get(pk=first.pk).status == S.AUTHORIZED  # rolled back with the block
    assert Action.objects.get(pk=second.pk).status == S.CANCELLED
    assert not ActionEvent.objects.filter(transition="invalidate").exists()


def test_a_fenced_save_whose_lease_is_not_held_fails_the_block(agent_actor: Actor) -> None:
    action = authorized_refund(agent_actor)
    token = uuid.uuid4()
    Action.objects.filter(pk=action.pk).update(lease_token=token)
    copy = Action.objects.get(pk=action.pk)
    copy.lease_fence = uuid.uuid4()  # another lease than the row's
    with (
        pytest.raises(ConcurrentTransition, match="or their lease"),
        transaction.atomic(),
        rows_written_together(actions_locked=True),
    ):
        invalidate(copy)
    assert Action.objects.get(pk=action.pk).status == S.AUTHORIZED

    right = Action.objects.get(pk=action.pk)
    right.lease_fence = token
    with transaction.atomic(), rows_written_together(actions_locked=True):
        invalidate(right)
    assert "lease_fence" not in right.__dict__  # spent on the held UPDATE, not left for a later save
    assert Action.objects.get(pk=action.pk).status == S.STALE


def test_a_material_column_is_never_written_by_the_held_update(agent_actor: Actor) -> None:
    action = authorized_refund(agent_actor)
    with pytest.raises(MaterialFieldChanged), transaction.atomic(), rows_written_together(actions_locked=True):
        copy = locked([action.pk])[0]
        copy.amount = copy.amount + 1
        invalidate(copy)
    assert Action.objects.get(pk=action.pk).status == S.AUTHORIZED


def test_outside_a_block_of_locked_actions_each_transition_saves_at_once(agent_actor: Actor) -> None:
    pks = [authorized_refund(agent_actor).pk for _ in range(2)]
    seen: list[Any] = []
    with CaptureQueriesContext(connection) as queries, transaction.atomic(), rows_written_together():
        for action in locked(pks):
            invalidate(action)
            seen.append(Action.objects.filter(pk=action.pk).values_list("status", flat=True).get())
    assert seen == [S.STALE, S.STALE]
    updates = [q["sql"] for q in queries.captured_queries if q["sql"].startswith('UPDATE "actions_action"')]
    assert len(updates) == 2
