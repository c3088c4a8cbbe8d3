"""A plan is decided on the plan the page showed: the decision form carries the plan's hash.

A form without it is refused with 400 naming ``plan_hash``; a hash that is not the plan's is
refused with 409 and the page offers to reload. Either way nothing is written.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from actions.foundation.trail import Actor
from actions.models import Workflow, WorkflowState
from actions.workflows.services import PlanDecisionRefused, plan_decide, workflow_propose
from approvals.models import WorkflowApproval
from tests.factories import PASSWORD
from tests.workflows.conftest import World, po_parameters

pytestmark = pytest.mark.django_db(transaction=True)


def proposed(agent_actor: Actor) -> Workflow:
    return workflow_propose(
        template="po_mismatch_resolution", parameters=po_parameters(), proposer=agent_actor
    ).workflow


def nothing_decided(workflow: Workflow) -> None:
    assert Workflow.objects.get(pk=workflow.pk).state == WorkflowState.PROPOSED
    assert not WorkflowApproval.objects.filter(workflow=workflow).exists()


def login(user: Any) -> Client:
    client = Client()
    assert client.login(username=user.get_username(), password=PASSWORD)
    return client


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_a_plan_decided_without_its_hash_is_a_400_naming_the_field(
    world: World, agent_actor: Actor, manager: Any, settings: Any, decision: str
) -> None:
    settings.STEP_UP_THRESHOLDS = {}
    workflow = proposed(agent_actor)

    response = login(manager).post(f"/approvals/workflows/{workflow.pk}/decide", {"decision": decision})

    assert response.status_code == 400
    assert "plan_hash is missing" in response.content.decode()
    nothing_decided(workflow)


def test_a_plan_decided_with_another_hash_is_a_409_that_offers_to_reload(
    world: World, agent_actor: Actor, manager: Any, settings: Any
) -> None:
    settings.STEP_UP_THRESHOLDS = {}
    workflow = proposed(agent_actor)

    response = login(manager).post(
        f"/approvals/workflows/{workflow.pk}/decide", {"decision": "approve", "plan_hash": "sha256:not-this-plan"}
    )

    assert response.status_code == 409
    body = response.content.decode()
    assert "This is not the plan the page showed: its hash differs." in body
    assert f'href="/approvals/workflows/{workflow.pk}/" data-testid="reload"' in body
    nothing_decided(workflow)


def test_the_service_refuses_an_empty_hash_and_a_wrong_one(world: World, agent_actor: Actor, manager: Any) -> None:
    workflow = proposed(agent_actor)

    with pytest.raises(PlanDecisionRefused) as missing:
        plan_decide(workflow_pk=workflow.pk, user=manager, decision="approve", plan_hash="")
    with pytest.raises(PlanDecisionRefused) as wrong:
        plan_decide(workflow_pk=workflow.pk, user=manager, decision="approve", plan_hash="sha256:not-this-plan")

    assert (missing.value.status, missing.value.field) == (400, "plan_hash")
    assert (wrong.value.status, wrong.value.code) == (409, "plan_changed")
    nothing_decided(workflow)
    plan_decide(workflow_pk=workflow.pk, user=manager, decision="approve", plan_hash=workflow.plan_hash)
    assert Workflow.objects.get(pk=workflow.pk).state == WorkflowState.AUTHORIZED
