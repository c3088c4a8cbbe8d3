"""POST /api/v1/supplier-emails: a template and its parameters, never raw text."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from actions.models import Action, ActionStatus, Agent
from tests.api.conftest import ApiClient, assert_problem
from tests.mail import BILL_PARAMETERS

URL = "/api/v1/supplier-emails"


@pytest.fixture
def email_scope(agent: Agent) -> None:
    agent.scopes = ["supplier_email"]
    agent.save(update_fields=["scopes"])


@pytest.fixture
def body(supplier: Any) -> dict[str, Any]:
    return {
        "supplier": "ACME",
        "reference": "bill-BL-1042",
        "template": "bill_adjusted",
        "parameters": dict(BILL_PARAMETERS),
        "to": "ap@acme.example",
    }


def test_a_proposal_renders_the_template_and_waits_for_a_manager(
    api: ApiClient, email_scope: None, body: dict[str, Any], dispatched: list[int]
) -> None:
    response = api.post(URL, body)

    assert response.status_code == 201, response.content
    data = response.json()
    assert data["action_id"] == "supplier_email:ACME:bill-BL-1042:bill_adjusted"
    assert data["status"] == ActionStatus.PROPOSED and dispatched == []
    action = Action.objects.get(action_id=data["action_id"])
    assert action.payload["subject"] == "Bill BL-1042: adjusted by 120.00 EUR"
    assert "Two pallets arrived damaged." in action.payload["body"]
    assert action.payload["template_version"] == 1
    assert action.payload["message_id"].startswith("<email-") and action.payload["message_id"].endswith(">")

    again = api.post(URL, body)
    assert again.status_code == 200 and again.json()["action_id"] == data["action_id"]


def test_the_same_action_with_other_parameters_is_a_conflict(
    api: ApiClient, email_scope: None, body: dict[str, Any]
) -> None:
    assert api.post(URL, body).status_code == 201
    body["parameters"]["amount"] = "130.00"
    assert_problem(api.post(URL, body), 409, "payload_conflict")


def test_an_agent_without_the_scope_is_refused(api: ApiClient, body: dict[str, Any]) -> None:
    assert_problem(api.post(URL, body), 403, "scope_missing")


@pytest.mark.parametrize(
    ("change", "field", "code"),
    [
        (
            {"parameters": {**BILL_PARAMETERS, "bill_number": "BL-1\r\nBcc: all@evil.example"}},
            "parameters.bill_number",
            "header_injection",
        ),
        ({"to": "ap@acme.example\r\nBcc: all@evil.example"}, "to", "header_injection"),
        ({"to": "ap@acme.example\nBcc: x@evil.example"}, "to", "header_injection"),
        ({"parameters": {k: v for k, v in BILL_PARAMETERS.items() if k != "reason"}}, "parameters.reason", "required"),
        ({"parameters": {**BILL_PARAMETERS, "html": "<b>hi</b>"}}, "parameters.html", "unknown_parameter"),
        ({"to": "someone@elsewhere.example"}, "to", "unknown_contact"),
        ({"template": "free_text"}, "template", "unknown_template"),
        ({"supplier": "NOPE"}, "supplier", "not_found"),
    ],
)
def test_bad_input_is_a_422_naming_the_field_and_writes_nothing(
    change: dict[str, Any],
    field: str,
    code: str,
    api: ApiClient,
    email_scope: None,
    body: dict[str, Any],
    row_counts: Callable[[], dict[str, int]],
) -> None:
    """Invariant 11."""
    before = row_counts()

    problem = assert_problem(api.post(URL, {**body, **change}), 422, "validation_failed")

    assert (field, code) in {(error["field"], error["code"]) for error in problem["errors"]}, problem["errors"]
    assert row_counts() == before


def test_the_operation_is_in_the_openapi_document(api: ApiClient) -> None:
    document = api.get("/api/v1/openapi.json").json()
    operation = document["paths"]["/api/v1/supplier-emails"]["post"]
    assert set(operation["responses"]) >= {"201", "200", "409", "422"}


def test_the_docs_page_describes_the_operation(client: Any) -> None:
    page = client.get("/api/v1/docs").content.decode()
    assert "/api/v1/supplier-emails" in page
    assert "Propose an email to a supplier" in page
