"""Proposing refunds over HTTP: created, replayed, conflicting and invalid proposals."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from actions.agents.services import agent_token_issue
from actions.models import Action, ActionStatus, Order
from tests.api.conftest import ApiClient, assert_problem
from tests.factories import make_agent, make_order, make_request

pytestmark = pytest.mark.django_db

REFUNDS = "/api/v1/refunds"


def test_a_new_proposal_is_created_with_201_and_names_its_action(
    api: ApiClient, proposal: dict[str, Any], agent: Any
) -> None:
    response = api.post(REFUNDS, proposal)

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["action_id"] == "refund:order-4821:request-1"
    assert body["status"] == "PROPOSED"
    assert body["amount"] == "40.00"
    assert body["links"]["self"] == "/api/v1/actions/refund:order-4821:request-1"
    assert body["explanation"]["held_by"] == "a manager"
    assert body["explanation"]["final"] is False
    action = Action.objects.get(action_id=body["action_id"])
    assert action.proposed_by_agent == agent
    assert action.evidence == proposal["evidence"]


def test_sending_the_same_proposal_again_returns_the_existing_action_with_200(
    api: ApiClient, proposal: dict[str, Any]
) -> None:
    first = api.post(REFUNDS, proposal)
    # "40" and "40.00" are the same amount: the retry of a client that formats differently is
    # still the same proposal.
    again = api.post(REFUNDS, {**proposal, "amount": "40", "currency": "eur"})

    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["action_id"] == first.json()["action_id"]
    assert again.json()["created_at"] == first.json()["created_at"]
    assert Action.objects.count() == 1


def test_a_small_refund_is_approved_by_policy_and_its_dispatch_published_on_commit(
    api: ApiClient, proposal: dict[str, Any], dispatched: list[int], django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post(REFUNDS, {**proposal, "amount": "12.50"})

    assert response.status_code == 201
    assert response.json()["status"] == "AUTHORIZED"
    assert dispatched == [Action.objects.get().pk]


def test_the_same_request_with_a_different_amount_is_a_409_naming_the_differing_fields(
    api: ApiClient, proposal: dict[str, Any], row_counts: Callable[[], dict[str, int]]
) -> None:
    api.post(REFUNDS, proposal)
    before = row_counts()

    response = api.post(REFUNDS, {**proposal, "amount": "45.00", "reason_code": "goodwill"})

    body = assert_problem(response, 409, "payload_conflict")
    assert body["action_id"] == "refund:order-4821:request-1"
    assert body["differing"] == {
        "amount": {"existing": "40.00", "proposed": "45.00"},
        "reason_code": {"existing": "damaged", "proposed": "goodwill"},
    }
    assert "new refund request" in body["detail"]
    assert row_counts() == before
    assert Action.objects.get().amount == 40


def test_a_proposal_may_name_the_request_by_its_external_reference(api: ApiClient, proposal: dict[str, Any]) -> None:
    by_reference = {**proposal, "external_reference": "ZD-1"}
    del by_reference["request_number"]

    response = api.post(REFUNDS, by_reference)

    assert response.status_code == 201, response.content
    assert response.json()["action_id"] == "refund:order-4821:request-1"
    assert response.json()["external_reference"] == "ZD-1"
    # The same proposal by number is the same action.
    assert api.post(REFUNDS, proposal).status_code == 200


def test_an_external_reference_of_another_order_is_not_found(
    api: ApiClient, proposal: dict[str, Any], row_counts: Callable[[], dict[str, int]]
) -> None:
    other = make_order(number="5000")
    make_request(other, 1, external_reference="ZD-OTHER")
    body = {**proposal, "external_reference": "ZD-OTHER"}
    del body["request_number"]
    before = row_counts()

    problem = assert_problem(api.post(REFUNDS, body), 422, "validation_failed")

    assert problem["errors"] == [
        {"field": "external_reference", "code": "not_found", "message": problem["errors"][0]["message"]}
    ]
    assert row_counts() == before


def test_a_proposal_already_made_by_another_agent_is_a_409_that_reveals_nothing_of_it(
    api: ApiClient, proposal: dict[str, Any], agent_owner: Any
) -> None:
    other = ApiClient(agent_token_issue(agent=make_agent(agent_owner, name="other-bot")).plain)
    other.post(REFUNDS, proposal)

    same = api.post(REFUNDS, proposal)
    different = api.post(REFUNDS, {**proposal, "amount": "41.00"})

    for response in (same, different):
        body = assert_problem(response, 409, "proposed_elsewhere")
        assert "action_id" not in body and "differing" not in body
        assert "40.00" not in response.content.decode()
    assert Action.objects.count() == 1


def test_invalid_fields_are_each_named_with_a_code_and_nothing_is_written(
    api: ApiClient, order: Order, row_counts: Callable[[], dict[str, int]]
) -> None:
    """Invariant 11: bad input gets a clear error naming the field and writes nothing."""
    before = row_counts()

    response = api.post(
        REFUNDS,
        {
            "order_number": "no spaces allowed",
            "request_number": 0,
            "amount": 12.5,
            "currency": "EURO",
            "reason_code": "because",
            "colour": "blue",
        },
    )

    body = assert_problem(response, 422, "validation_failed")
    codes = {(error["field"], error["code"]) for error in body["errors"]}
    assert codes == {
        ("order_number", "invalid_format"),
        ("request_number", "out_of_range"),
        ("amount", "invalid_type"),
        ("currency", "too_long"),
        ("reason_code", "invalid_choice"),
        ("colour", "unknown_field"),
    }
    amount = next(error for error in body["errors"] if error["field"] == "amount")
    assert "decimal string" in amount["message"]
    assert row_counts() == before


def test_missing_fields_are_named_as_required(api: ApiClient, order: Order) -> None:
    body = assert_problem(api.post(REFUNDS, {"order_number": order.number}), 422, "validation_failed")
    assert {(e["field"], e["code"]) for e in body["errors"]} == {
        ("amount", "required"),
        ("currency", "required"),
        ("reason_code", "required"),
    }


@pytest.mark.parametrize("references", [{}, {"request_number": 1, "external_reference": "ZD-1"}])
def test_a_proposal_names_its_request_exactly_once(
    api: ApiClient, proposal: dict[str, Any], references: dict[str, Any]
) -> None:
    body = {key: value for key, value in proposal.items() if key != "request_number"} | references
    problem = assert_problem(api.post(REFUNDS, body), 422, "validation_failed")
    assert [(e["field"], e["code"]) for e in problem["errors"]] == [("request_number", "one_request_reference")]


@pytest.mark.parametrize(
    ("change", "field", "code"),
    [
        ({"order_number": "9999"}, "order_number", "not_found"),
        ({"request_number": 7}, "request_number", "not_found"),
        ({"currency": "USD"}, "currency", "currency_mismatch"),
        ({"currency": "CHF"}, "currency", "unknown_currency"),
        ({"amount": "0"}, "amount", "not_positive"),
        ({"amount": "12.345"}, "amount", "too_many_decimals"),
        ({"amount": "100.01"}, "amount", "over_refundable_balance"),
        ({"evidence": "nul \x00 byte"}, "evidence", "invalid_characters"),
    ],
)
def test_the_services_verdict_on_bad_input_is_a_422_naming_the_field(
    api: ApiClient,
    proposal: dict[str, Any],
    row_counts: Callable[[], dict[str, int]],
    change: dict[str, Any],
    field: str,
    code: str,
) -> None:
    """Invariant 11: each service-level refusal names its field and writes nothing."""
    before = row_counts()
    body = assert_problem(api.post(REFUNDS, {**proposal, **change}), 422, "validation_failed")
    assert [(e["field"], e["code"]) for e in body["errors"]] == [(field, code)]
    assert row_counts() == before


def test_a_body_that_is_not_json_is_a_400_problem(api: ApiClient, row_counts: Callable[[], dict[str, int]]) -> None:
    before = row_counts()
    assert_problem(api.post(REFUNDS, "{not json"), 400, "malformed_json")
    empty = assert_problem(api.post(REFUNDS, "", CONTENT_TYPE="application/json"), 422, "validation_failed")
    assert [(e["field"], e["code"]) for e in empty["errors"]] == [("body", "required")]
    assert row_counts() == before


def test_a_json_body_that_is_not_an_object_is_a_422_problem(api: ApiClient) -> None:
    body = assert_problem(api.post(REFUNDS, "[1, 2]"), 422, "validation_failed")
    assert body["errors"][0]["code"] == "invalid_type"


def test_a_refund_outside_the_refund_window_is_recorded_as_rejected_with_its_reason(
    api: ApiClient, proposal: dict[str, Any]
) -> None:
    Order.objects.filter(number=proposal["order_number"]).update(paid_at=timezone.now() - timedelta(days=400))

    response = api.post(REFUNDS, proposal)

    assert response.status_code == 201
    body = response.json()
    assert body["status"] == ActionStatus.REJECTED
    assert body["rejection_reasons"][0]["code"] == "refund_window_past"
    assert body["explanation"]["final"] is True
    assert "refund window" in body["explanation"]["summary"]
