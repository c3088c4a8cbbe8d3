"""The audit trail tells registered listeners of every state change, inside its transaction; the
workflows wake their coordinator this way, and the trail itself names no workflow."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.db import transaction

from actions.foundation import trail
from actions.foundation.trail import action_transition
from actions.models import Action
from actions.services import Actor
from actions.workflows.wake import workflow_wake_on_child_change
from tests.approvals.test_views import propose

pytestmark = pytest.mark.django_db

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_the_workflows_listener_is_registered_when_the_app_starts() -> None:
    assert workflow_wake_on_child_change in trail._state_change_listeners


def test_a_listener_hears_each_state_change_inside_its_transaction(
    agent_actor: Actor, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    settings.AUTO_APPROVAL_ENABLED = False
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)
    heard: list[tuple[str, str, str, bool]] = []

    def listener(action: Action, from_state: str) -> None:
        heard.append((action.action_id, from_state, action.status, transaction.get_connection().in_atomic_block))

    monkeypatch.setattr(trail, "_state_change_listeners", [listener])
    action = propose(agent_actor)
    with transaction.atomic():
        fresh = Action.objects.select_for_update().get(pk=action.pk)
        action_transition(action=fresh, transition="cancel", actor=Actor.system("test"))
    assert (action.action_id, "PROPOSED", "CANCELLED", True) in heard


def test_a_child_of_a_workflow_wakes_it_and_a_lone_action_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    woken: list[str] = []
    monkeypatch.setattr(
        "actions.foundation.publish.workflow_advance_enqueue_on_commit", lambda workflow_id: woken.append(workflow_id)
    )
    child = Action(action_id="x", kind="refund", payload={"workflow": "refund-notice:order-1:c"}, status="SUCCEEDED")
    lone = Action(action_id="y", kind="refund", payload={}, status="SUCCEEDED")
    workflow_wake_on_child_change(child, "SUBMITTING")
    workflow_wake_on_child_change(lone, "SUBMITTING")
    assert woken == ["refund-notice:order-1:c"]


def test_the_trail_reads_no_workflow_key_and_wakes_no_coordinator_itself() -> None:
    text = (REPO_ROOT / "actions" / "foundation" / "trail.py").read_text()
    assert '"workflow"' not in text
    assert "workflow_advance" not in text
