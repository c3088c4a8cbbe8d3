"""The agent API for workflows: 201, 200 for the same plan, 409 naming the live workflow, 422
naming the field, scopes, and GET with steps, states, next and final."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from actions.agents.services import agent_token_issue
from actions.models import Agent, Supplier, SupplierContact, Workflow
from tests.factories import make_agent, make_bill
from tests.workflows.conftest import po_parameters

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_publish(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)
    monkeypatch.setattr("actions.foundation.publish.workflow_advance_enqueue", lambda workflow_id: None)


@pytest.fixture
def token(agent: Agent) -> str:
    agent.scopes = ["invoice_adjustment", "supplier_email"]
    agent.save(update_fields=["scopes"])
    bill = make_bill(number="INV-42")
    assert bill.pk
    supplier = Supplier.objects.create(code="ACME", name="Acme Supplies")
    SupplierContact.objects.create(supplier=supplier, email="ap@acme.example")
    return agent_token_issue(agent=agent, label="test").plain


def post(client: Client, token: str, body: dict[str, Any]) -> Any:
    return client.post(
        "/api/v1/workflows", data=body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )


def get(client: Client, token: str, workflow_id: str) -> Any:
    return client.get(f"/api/v1/workflows/{workflow_id}", HTTP_AUTHORIZATION=f"Bearer {token}")


def test_propose_replay_conflict_and_read(client: Client, token: str) -> None:
    body = {"template": "po_mismatch_resolution", "parameters": po_parameters()}
    created = post(client, token, body)
    assert created.status_code == 201, created.content
    workflow_id = created.json()["workflow_id"]
    assert workflow_id == "po-mismatch:bill-INV-42:case-1"
    assert created.json()["state"] == "PROPOSED" and created.json()["final"] is False
    again = post(client, token, body)
    assert (again.status_code, again.json()["workflow_id"]) == (200, workflow_id)
    other = post(client, token, {"template": "po_mismatch_resolution", "parameters": po_parameters(amount="30.00")})
    assert other.status_code == 409
    assert other.json()["workflow_id"] == workflow_id and other.json()["state"] == "PROPOSED"
    read = get(client, token, workflow_id)
    assert read.status_code == 200
    steps = read.json()["steps"]
    assert [s["name"] for s in steps] == ["read_documents", "post_credit_note", "email_supplier"]
    assert [s["step_class"] for s in steps] == ["read", "create", "irreversible"]
    assert steps[1]["compensation"]["kind"] == "credit-note-void"
    assert "manager" in read.json()["next"]
    assert Workflow.objects.count() == 1


def test_invalid_parameters_are_422_naming_the_field(client: Client, token: str) -> None:
    response = post(
        client, token, {"template": "po_mismatch_resolution", "parameters": po_parameters(currency="XXX", extra=1)}
    )
    assert response.status_code == 422
    fields = {error["field"] for error in response.json()["errors"]}
    assert {"parameters.currency", "parameters.extra"} <= fields
    unknown = post(client, token, {"template": "nope", "parameters": {}})
    assert unknown.status_code == 422 and unknown.json()["errors"][0]["field"] == "template"
    assert Workflow.objects.count() == 0


def test_scopes_and_visibility(client: Client, token: str, agent_owner: Any) -> None:
    stranger = make_agent(agent_owner, name="refund-bot", scopes=["refund"])
    other_token = agent_token_issue(agent=stranger, label="t").plain
    refused = post(client, other_token, {"template": "po_mismatch_resolution", "parameters": po_parameters()})
    assert refused.status_code == 403
    created = post(client, token, {"template": "po_mismatch_resolution", "parameters": po_parameters()})
    assert get(client, other_token, created.json()["workflow_id"]).status_code == 404
    assert Workflow.objects.count() == 1
