"""A plan waiting for a decision is told to managers like a proposal: in their count badge and
in the waiting-proposals mail, once per plan and manager."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core import mail
from django.utils import timezone

from actions.foundation.trail import Actor
from actions.models import Workflow, WorkflowState
from actions.notifications import notifications_send_due, waiting_count_for
from actions.workflows.services import workflow_propose
from tests.workflows.conftest import World, po_parameters

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_plan_waiting_for_a_decision_is_counted_and_told_once(
    world: World, agent_actor: Actor, manager: Any, settings: Any
) -> None:
    settings.NOTIFICATION_EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    mail.outbox = []
    assert waiting_count_for(manager, {"manager"}) == 0
    workflow = workflow_propose(
        template="po_mismatch_resolution", parameters=po_parameters(), proposer=agent_actor
    ).workflow
    assert workflow.state == WorkflowState.PROPOSED
    assert waiting_count_for(manager, {"manager"}) == 1

    notifications_send_due()
    assert mail.outbox == [], "younger than the manager's waiting limit"
    Workflow.objects.filter(pk=workflow.pk).update(created_at=timezone.now() - timedelta(hours=2))
    notifications_send_due()
    notifications_send_due()
    [message] = mail.outbox
    assert message.to == [manager.email]
    # Named by the bill it is about; its id is behind the link.
    assert "Plan for Bill INV-42, waiting since" in message.body
    assert f"/approvals/workflows/{workflow.pk}/" in message.body
    assert workflow.workflow_id not in message.body
