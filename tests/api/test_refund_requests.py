"""Opening refund requests: numbered per order, idempotent by external reference."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import pytest

from actions.kinds.fields import ProposalInvalid
from actions.kinds.refund.requests import RefundRequestConflict, refund_request_open
from actions.models import Order, RefundRequest, RequestSource
from tests.api.conftest import ApiClient, assert_problem
from tests.factories import make_order
from tests.threads import run_at_once

REQUESTS = "/api/v1/refund-requests"


@pytest.mark.django_db
def test_opening_a_request_numbers_it_after_the_orders_last_one(api: ApiClient, order: Order) -> None:
    response = api.post(
        REQUESTS,
        {"order_number": order.number, "external_reference": "ZD-2", "reason_code": "damaged", "note": "Lid broken"},
    )

    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["order_number"], body["request_number"], body["external_reference"]) == ("4821", 2, "ZD-2")
    assert body["source"] == RequestSource.AGENT
    assert RefundRequest.objects.get(external_reference="ZD-2").note == "Lid broken"


@pytest.mark.django_db
def test_opening_the_same_reference_again_returns_the_existing_request_with_200(api: ApiClient, order: Order) -> None:
    first = api.post(REQUESTS, {"order_number": order.number, "external_reference": "ZD-2", "reason_code": "damaged"})
    again = api.post(
        REQUESTS,
        {"order_number": order.number, "external_reference": "ZD-2", "reason_code": "damaged", "note": "retry"},
    )

    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["request_number"] == first.json()["request_number"]
    assert RefundRequest.objects.filter(external_reference="ZD-2").count() == 1


@pytest.mark.django_db
def test_a_reference_already_used_on_another_order_is_a_409(
    api: ApiClient, order: Order, row_counts: Callable[[], dict[str, int]]
) -> None:
    other = make_order(number="5000")
    before = row_counts()

    response = api.post(
        REQUESTS, {"order_number": other.number, "external_reference": "ZD-1", "reason_code": "damaged"}
    )

    body = assert_problem(response, 409, "reference_conflict")
    assert body["differing"] == {"order_number": {"existing": "4821", "proposed": "5000"}}
    assert row_counts() == before


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "field", "code"),
    [
        ({"order_number": "9999", "external_reference": "ZD-2", "reason_code": "damaged"}, "order_number", "not_found"),
        (
            {"order_number": "4821", "external_reference": "has space", "reason_code": "damaged"},
            "external_reference",
            "invalid_format",
        ),
        ({"order_number": "4821", "reason_code": "damaged"}, "external_reference", "required"),
        (
            {"order_number": "4821", "external_reference": "ZD-2", "reason_code": "damaged", "note": "x" * 2001},
            "note",
            "too_long",
        ),
    ],
)
def test_bad_input_names_the_field_and_opens_nothing(
    api: ApiClient,
    order: Order,
    row_counts: Callable[[], dict[str, int]],
    body: dict[str, Any],
    field: str,
    code: str,
) -> None:
    """Invariant 11: bad input gets a clear error naming the field and writes nothing."""
    before = row_counts()
    problem = assert_problem(api.post(REQUESTS, body), 422, "validation_failed")
    assert [(e["field"], e["code"]) for e in problem["errors"]] == [(field, code)]
    assert row_counts() == before


@pytest.mark.django_db
def test_the_service_refuses_bad_input_with_named_fields(order: Order) -> None:
    with pytest.raises(ProposalInvalid) as refused:
        refund_request_open(order_number="", external_reference=" ", note="\x00")
    assert {(p.field, p.code) for p in refused.value.problems} == {
        ("order_number", "required"),
        ("external_reference", "required"),
        ("note", "invalid_characters"),
    }
    with pytest.raises(RefundRequestConflict):
        refund_request_open(order_number=make_order(number="6000").number, external_reference="ZD-1")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_requests_opened_at_once_on_one_order_get_distinct_consecutive_numbers() -> None:
    order = make_order(number="7000")
    references = [f"ZD-{n}" for n in range(5)]

    results = run_at_once(
        *(lambda ref=ref: refund_request_open(order_number=order.number, external_reference=ref) for ref in references)
    )

    assert all(result.created for result in results)
    assert sorted(result.request.number for result in results) == [1, 2, 3, 4, 5]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_same_reference_opened_at_once_opens_one_request() -> None:
    order = make_order(number="7001")

    results = run_at_once(
        *(lambda: refund_request_open(order_number=order.number, external_reference="ZD-SAME") for _ in range(4))
    )

    assert sorted(result.created for result in results) == [False, False, False, True]
    assert {result.request.pk for result in results} == {RefundRequest.objects.get(external_reference="ZD-SAME").pk}


@pytest.mark.django_db
def test_opening_and_reopening_a_request_are_logged_with_the_order_and_request_numbers(
    api: ApiClient, order: Order, caplog: pytest.LogCaptureFixture
) -> None:
    opening = {"order_number": order.number, "external_reference": "ZD-2", "reason_code": "damaged"}
    with caplog.at_level(logging.INFO, logger="actions.api"):
        api.post(REQUESTS, opening)
        api.post(REQUESTS, opening)

    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "actions.api"]
    logged = [(line["event"], line.get("order_number"), line.get("request_number")) for line in lines]
    assert [entry for entry in logged if entry[0].startswith("refund_request.")] == [
        ("refund_request.opened", "4821", 2),
        ("refund_request.replayed", "4821", 2),
    ]
