"""A rejection takes a reason from the picker and an optional note, and commits only after an
undo window.

Design: the rejection is a durable row (PendingRejection) written at the click; the action stays
PROPOSED and nobody may approve it meanwhile. The commit (a task published for the end of the
window, the beat's sweep, and every inbox load) and the undo both lock the action's row and
delete the pending row, so exactly one of them takes effect: never lost, never doubled.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from actions.models import Action, ActionEvent, ActionStatus
from actions.services import Actor
from approvals.models import Approval, Decision, PendingRejection
from approvals.services import (
    DecisionRefused,
    approval_decide,
    rejection_commit,
    rejection_request,
    rejection_undo,
    rejections_commit_due,
)
from tests.approvals.test_views import propose

pytestmark = pytest.mark.django_db

S = ActionStatus


@pytest.fixture(autouse=True)
def manual_decisions(settings: Any) -> None:
    settings.AUTO_APPROVAL_ENABLED = False
    settings.REJECTION_UNDO_SECONDS = 8


@pytest.fixture(autouse=True)
def published(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)
    monkeypatch.setattr(
        "actions.foundation.publish.rejection_commit_enqueue", lambda pk, countdown: calls.append((pk, countdown))
    )
    return calls


def rejections(action: Action) -> list[Approval]:
    return list(Approval.objects.filter(action=action, decision=Decision.REJECT))


def test_a_rejection_waits_out_its_window_then_commits_once_with_its_reason(
    manager: Any, agent_actor: Actor, published: list[tuple[int, int]], django_capture_on_commit_callbacks: Any
) -> None:
    action = propose(agent_actor)
    now = timezone.now()
    with django_capture_on_commit_callbacks(execute=True):
        rejection_request(
            action_pk=action.pk, user=manager, reason_code="duplicate", note="Same as ticket 12.", now=now
        )

    assert published == [(action.pk, 8)]
    assert Action.objects.get(pk=action.pk).status == S.PROPOSED
    assert rejection_commit(action_pk=action.pk, now=now + timedelta(seconds=3)) is None, "inside the window"
    assert rejections(action) == []

    committed = rejection_commit(action_pk=action.pk, now=now + timedelta(seconds=9))

    assert committed is not None and committed.reason_code == "duplicate"
    assert Action.objects.get(pk=action.pk).status == S.REJECTED
    event = ActionEvent.objects.get(action=action, transition="reject")
    assert "Duplicate of another request" in event.reason and "Same as ticket 12." in event.reason
    # A late task, the sweep and a page load after it change nothing.
    assert rejection_commit(action_pk=action.pk, now=now + timedelta(seconds=20)) is None
    assert rejections_commit_due(now=now + timedelta(seconds=20)) == 0
    assert len(rejections(action)) == 1


def test_an_undone_rejection_never_commits(manager: Any, agent_actor: Actor) -> None:
    action = propose(agent_actor)
    now = timezone.now()
    rejection_request(action_pk=action.pk, user=manager, reason_code="not_enough_evidence", now=now)

    rejection_undo(action_pk=action.pk, user=manager)

    assert rejection_commit(action_pk=action.pk, now=now + timedelta(seconds=60)) is None
    assert Action.objects.get(pk=action.pk).status == S.PROPOSED
    assert rejections(action) == []
    assert not ActionEvent.objects.filter(action=action, transition="reject").exists()


def test_undo_after_the_commit_is_refused_clearly(manager: Any, agent_actor: Actor) -> None:
    action = propose(agent_actor)
    now = timezone.now()
    rejection_request(action_pk=action.pk, user=manager, reason_code="wrong_amount", now=now)
    rejections_commit_due(now=now + timedelta(seconds=9))

    with pytest.raises(DecisionRefused) as refused:
        rejection_undo(action_pk=action.pk, user=manager)

    assert refused.value.code == "nothing_to_undo"
    assert Action.objects.get(pk=action.pk).status == S.REJECTED


def test_nobody_may_approve_while_a_rejection_is_pending(manager: Any, agent_actor: Actor, console_admin: Any) -> None:
    action = propose(agent_actor)
    rejection_request(action_pk=action.pk, user=manager, reason_code="against_policy")

    with pytest.raises(DecisionRefused) as refused:
        approval_decide(action_pk=action.pk, user=manager, decision="approve")

    assert refused.value.code == "rejection_pending"
    assert not Approval.objects.filter(action=action).exists()


def test_a_reason_is_required_and_other_needs_a_note(manager: Any, agent_actor: Actor) -> None:
    action = propose(agent_actor)
    for reason, note, code in [
        ("", "", "invalid_reason"),
        ("made_up", "", "invalid_reason"),
        ("other", " ", "note_required"),
    ]:
        with pytest.raises(DecisionRefused) as refused:
            rejection_request(action_pk=action.pk, user=manager, reason_code=reason, note=note)
        assert refused.value.code == code
    assert not PendingRejection.objects.exists()


def test_only_the_manager_who_rejected_may_undo(manager: Any, second_manager: Any, agent_actor: Actor) -> None:
    action = propose(agent_actor)
    rejection_request(action_pk=action.pk, user=manager, reason_code="duplicate")

    with pytest.raises(DecisionRefused):
        rejection_undo(action_pk=action.pk, user=second_manager)

    assert PendingRejection.objects.filter(action=action).exists()


def test_a_second_rejection_while_one_is_pending_is_refused(
    manager: Any, second_manager: Any, agent_actor: Actor
) -> None:
    action = propose(agent_actor)
    rejection_request(action_pk=action.pk, user=manager, reason_code="duplicate")
    with pytest.raises(DecisionRefused) as refused:
        rejection_request(action_pk=action.pk, user=second_manager, reason_code="duplicate")
    assert refused.value.code == "rejection_pending"
    assert PendingRejection.objects.get(action=action).requested_by == manager
