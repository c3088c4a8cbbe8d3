"""The agent API for invoice adjustments: the same semantics as refunds (201, 200, 409, 422)."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from django.test import Client

from actions.agents.services import agent_token_issue
from actions.models import Action, Agent
from tests.factories import make_adjustment_request, make_bill

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_publish(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)


@pytest.fixture
def token(agent: Agent) -> str:
    agent.scopes = ["invoice_adjustment"]
    agent.save(update_fields=["scopes"])
    return agent_token_issue(agent=agent, label="test").plain


def post(client: Client, token: str, path: str, body: dict[str, Any]) -> Any:
    return client.post(
        f"/api/v1/{path}", data=body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )


def proposal(**change: Any) -> dict[str, Any]:
    return {
        "bill_number": "INV-2291",
        "adjustment_number": 1,
        "amount": "20.00",
        "currency": "EUR",
        "reason_code": "price_mismatch",
        **change,
    }


def test_an_agent_opens_a_request_and_proposes_an_adjustment_and_a_retry_returns_it(client: Client, token: str) -> None:
    make_bill(number="INV-2291")
    opened = post(client, token, "adjustment-requests", {"bill_number": "INV-2291", "external_reference": "M-1"})
    assert (opened.status_code, opened.json()["adjustment_number"]) == (201, 1)
    assert (
        post(client, token, "adjustment-requests", {"bill_number": "INV-2291", "external_reference": "M-1"}).status_code
        == 200
    )

    created = post(client, token, "invoice-adjustments", proposal())
    assert created.status_code == 201, created.json()
    assert created.json()["action_id"] == "invoice-adjustment:bill-INV-2291:adjustment-1"
    assert created.json()["status"] == "AUTHORIZED"  # below the kind's auto-approval threshold
    again = post(client, token, "invoice-adjustments", proposal())
    assert (again.status_code, again.json()["action_id"]) == (200, created.json()["action_id"])


def test_a_different_amount_is_a_409_naming_the_field(client: Client, token: str) -> None:
    bill = make_bill(number="INV-2291")
    make_adjustment_request(bill)
    post(client, token, "invoice-adjustments", proposal())
    conflict = post(client, token, "invoice-adjustments", proposal(amount="21.00"))
    assert conflict.status_code == 409
    assert set(conflict.json()["differing"]) == {"amount"}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"amount": "900.00"}, "amount"),
        ({"currency": "USD"}, "currency"),
        ({"adjustment_number": 2}, "adjustment_number"),
        ({"bill_number": "NOPE"}, "bill_number"),
        ({"reason_code": "goodwill"}, "reason_code"),
    ],
)
def test_bad_input_is_a_422_naming_the_field_and_writes_nothing(
    client: Client, token: str, change: dict[str, Any], field: str
) -> None:
    """Invariant 11."""
    bill = make_bill(number="INV-2291", amount="200.00")
    make_adjustment_request(bill)
    answer = post(client, token, "invoice-adjustments", proposal(**change))
    assert answer.status_code == 422, answer.json()
    assert [error["field"] for error in answer.json()["errors"]] == [field]
    assert not Action.objects.exists()


def test_an_agent_without_the_scope_is_refused(client: Client, agent: Agent) -> None:
    make_adjustment_request(make_bill(number="INV-2291"))
    plain = agent_token_issue(agent=agent, label="refunds only").plain  # scopes: ["refund"]
    answer = post(client, plain, "invoice-adjustments", proposal())
    assert (answer.status_code, answer.json()["code"]) == (403, "scope_missing")


def test_the_openapi_document_has_both_operations(client: Client) -> None:
    paths = client.get("/api/v1/openapi.json").json()["paths"]
    assert {"/api/v1/adjustment-requests", "/api/v1/invoice-adjustments"} <= set(paths)


def test_opening_and_reopening_a_request_are_logged_with_the_bill_and_adjustment_numbers(
    client: Client, token: str, caplog: pytest.LogCaptureFixture
) -> None:
    make_bill(number="INV-2291")
    opening = {"bill_number": "INV-2291", "external_reference": "M-1"}
    with caplog.at_level(logging.INFO, logger="actions.api"):
        post(client, token, "adjustment-requests", opening)
        post(client, token, "adjustment-requests", opening)

    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "actions.api"]
    logged = [(line["event"], line.get("bill_number"), line.get("adjustment_number")) for line in lines]
    assert [entry for entry in logged if entry[0].startswith("adjustment_request.")] == [
        ("adjustment_request.opened", "INV-2291", 1),
        ("adjustment_request.replayed", "INV-2291", 1),
    ]
