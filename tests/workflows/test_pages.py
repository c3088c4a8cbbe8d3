"""The manager's plan page, the workflow timeline and finance's queue entries."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from actions.foundation.trail import Actor
from actions.models import Workflow, WorkflowState
from actions.workflows.services import workflow_propose
from tests.approvals.test_views import propose
from tests.factories import PASSWORD
from tests.workflows.conftest import World, po_parameters

pytestmark = pytest.mark.django_db(transaction=True)


def login(user: Any) -> Client:
    client = Client()
    assert client.login(username=user.get_username(), password=PASSWORD)
    return client


def test_a_manager_sees_every_step_and_approves_the_plan(
    world: World, agent_actor: Actor, manager: Any, settings: Any
) -> None:
    settings.STEP_UP_THRESHOLDS = {}
    workflow = workflow_propose(
        template="po_mismatch_resolution", parameters=po_parameters(), proposer=agent_actor
    ).workflow
    client = login(manager)
    # The list names the plan in words and links to it; the id is on the plan page's details.
    listing = client.get("/approvals/workflows/").content.decode()
    assert "Resolve a purchase-order mismatch" in listing and f"/approvals/workflows/{workflow.pk}/" in listing
    page = client.get(f"/approvals/workflows/{workflow.pk}/").content.decode()
    for text in (
        "read_documents",
        "post_credit_note",
        "email_supplier",
        "irreversible",
        "create",
        "Credit note void",
        "Bill INV-42: adjusted by 20.00 EUR",
        "ap@acme.example",
        "20.00 EUR",
        "accounting system",
        "mail relay",
    ):
        assert text in page, text
    response = client.post(
        f"/approvals/workflows/{workflow.pk}/decide", {"decision": "approve", "plan_hash": workflow.plan_hash}
    )
    assert response.status_code == 302, response.content[:500]
    assert Workflow.objects.get(pk=workflow.pk).state == WorkflowState.AUTHORIZED
    assert world.run(workflow.workflow_id) == WorkflowState.COMPLETED
    timeline = client.get(f"/review/workflows/{workflow.pk}/").content.decode()
    assert "Completed" in timeline and f"{workflow.workflow_id}:email_supplier" in timeline


def test_the_proposers_owner_cannot_approve_and_others_cannot_see(
    world: World, agent_actor: Actor, agent_owner: Any, finance: Any
) -> None:
    workflow = workflow_propose(
        template="po_mismatch_resolution", parameters=po_parameters(), proposer=agent_actor
    ).workflow
    assert login(agent_owner).get(f"/approvals/workflows/{workflow.pk}/").status_code == 403
    assert login(finance).post(f"/approvals/workflows/{workflow.pk}/decide", {"decision": "approve"}).status_code == 403
    assert Workflow.objects.get(pk=workflow.pk).state == WorkflowState.PROPOSED


def _highlighted(page: str) -> list[str]:
    """The main navigation's links marked as the current section."""
    nav = re.search(r'<nav class="topnav"[^>]*>(.*?)</nav>', page, flags=re.DOTALL)
    assert nav is not None
    return re.findall(r'<a href="[^"]*" aria-current="page">([^<]+)</a>', nav.group(1))


def test_every_approvals_page_highlights_approvals_in_the_navigation(
    world: World, agent_actor: Actor, manager: Any, finance: Any
) -> None:
    workflow = workflow_propose(
        template="po_mismatch_resolution", parameters=po_parameters(), proposer=agent_actor
    ).workflow
    proposal = propose(agent_actor)
    client = login(manager)
    for address in (
        "/approvals/",
        f"/approvals/{proposal.pk}/",
        "/approvals/decided/",
        "/approvals/workflows/",
        f"/approvals/workflows/{workflow.pk}/",
    ):
        response = client.get(address)
        assert response.status_code == 200, address
        assert _highlighted(response.content.decode()) == ["Approvals"], address
    assert _highlighted(client.get("/").content.decode()) == ["Home"]

    finance_client = login(finance)
    for address in ("/review/", f"/review/workflows/{workflow.pk}/"):
        assert _highlighted(finance_client.get(address).content.decode()) == ["Review queue"], address
