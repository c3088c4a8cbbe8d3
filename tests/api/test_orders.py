"""POST /api/v1/orders: the shop's commerce system sends its orders, idempotently by number.

A changed order raises its version, so that an approval given for the old order goes stale at
the reservation (docs/architecture.md section 5, invariant 6).
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest

from actions.agents.services import agent_token_issue
from actions.engine.claim import ClaimOutcome, submission_begin
from actions.kinds.refund.proposal import action_propose_refund
from actions.kinds.refund.requests import refund_request_open
from actions.models import Action, ActionStatus, Order
from actions.services import Actor
from approvals.models import Decision
from approvals.services import approval_decide
from tests.api.conftest import ApiClient, assert_problem
from tests.factories import make_agent

pytestmark = pytest.mark.django_db

ORDERS = "/api/v1/orders"


@pytest.fixture
def shop(agent_owner: Any) -> ApiClient:
    """The shop's commerce system: an agent whose only scope is ``orders``."""
    return ApiClient(agent_token_issue(agent=make_agent(agent_owner, name="shop", scopes=["orders"])).plain)


@pytest.fixture
def order_body() -> dict[str, Any]:
    return {
        "order_number": "5001",
        "customer_name": "Grace Hopper",
        "customer_email": "grace@example.com",
        "currency": "EUR",
        "captured_amount": "79.00",
        "charge_reference": "ch_5001",
        "paid_at": "2026-11-20T09:30:00Z",
    }


@pytest.fixture
def order_rows(db: Any) -> Callable[[], list[tuple[Any, ...]]]:
    def _rows() -> list[tuple[Any, ...]]:
        return list(Order.objects.order_by("pk").values_list("number", "captured_amount", "version", "customer_name"))

    return _rows


def test_a_new_order_is_created_with_201_at_version_1(shop: ApiClient, order_body: dict[str, Any]) -> None:
    response = shop.post(ORDERS, order_body)

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["order_number"] == "5001"
    assert body["version"] == 1
    assert body["captured_amount"] == "79.00" and body["refundable_amount"] == "79.00"
    assert body["changed"] == []
    order = Order.objects.get(number="5001")
    assert order.captured_amount == Decimal("79.00") and order.charge_reference == "ch_5001"


def test_the_same_order_again_is_200_and_writes_nothing(
    shop: ApiClient, order_body: dict[str, Any], order_rows: Callable[[], list[tuple[Any, ...]]]
) -> None:
    shop.post(ORDERS, order_body)
    before = order_rows()

    response = shop.post(ORDERS, {**order_body, "paid_at": "2026-11-20T10:30:00+01:00"})  # the same instant

    assert response.status_code == 200
    assert response.json()["version"] == 1 and response.json()["changed"] == []
    assert order_rows() == before


def test_a_changed_order_raises_its_version_and_names_the_changed_fields(
    shop: ApiClient, order_body: dict[str, Any]
) -> None:
    shop.post(ORDERS, order_body)

    response = shop.post(ORDERS, {**order_body, "captured_amount": "59.00", "customer_name": "G. Hopper"})

    assert response.status_code == 200
    body = response.json()
    assert body["version"] == 2
    assert body["changed"] == ["captured_amount", "customer_name"]
    assert Order.objects.get(number="5001").captured_amount == Decimal("59.00")


def test_an_approval_given_before_the_order_changed_goes_stale_at_the_reservation(
    shop: ApiClient, order_body: dict[str, Any], manager: Any, agent: Any
) -> None:
    """Invariant 6: nothing is submitted under an approval whose bound order version differs."""
    shop.post(ORDERS, order_body)
    refund_request_open(order_number="5001", external_reference="ZD-9")
    action = action_propose_refund(
        order_number="5001",
        request_number=1,
        amount="40.00",
        currency="EUR",
        reason_code="damaged",
        proposer=Actor.for_agent(agent),
    ).action
    approval_decide(action_pk=action.pk, user=manager, decision=Decision.APPROVE)

    # Items were cancelled in the shop after the manager approved.
    assert shop.post(ORDERS, {**order_body, "captured_amount": "45.00"}).json()["version"] == 2
    claim = submission_begin(action_pk=action.pk)

    assert claim.outcome == ClaimOutcome.STALE
    assert "order_version" in [failure["binding"] for failure in claim.failures]
    assert Action.objects.get(pk=action.pk).status == ActionStatus.STALE
    assert Order.objects.get(number="5001").reserved_amount == 0


def test_captured_below_refunded_and_reserved_is_a_409_naming_the_field(
    shop: ApiClient, order_body: dict[str, Any], order_rows: Callable[[], list[tuple[Any, ...]]]
) -> None:
    shop.post(ORDERS, order_body)
    Order.objects.filter(number="5001").update(refunded_amount=Decimal("30.00"), reserved_amount=Decimal("20.00"))
    before = order_rows()

    response = shop.post(ORDERS, {**order_body, "captured_amount": "49.99"})

    body = assert_problem(response, 409, "captured_below_refunds")
    assert body["errors"][0]["field"] == "captured_amount"
    assert "50.00" in body["detail"]
    assert order_rows() == before
    # Down to exactly what is refunded and reserved is allowed.
    assert shop.post(ORDERS, {**order_body, "captured_amount": "50.00"}).status_code == 200


@pytest.mark.parametrize(
    ("change", "code", "field"),
    [
        ({"currency": "USD"}, "currency_changed", "currency"),
        ({"charge_reference": "ch_other"}, "charge_changed", "charge_reference"),
    ],
)
def test_a_change_of_currency_or_charge_is_refused_naming_the_field(
    shop: ApiClient,
    order_body: dict[str, Any],
    order_rows: Callable[[], list[tuple[Any, ...]]],
    change: dict[str, str],
    code: str,
    field: str,
) -> None:
    shop.post(ORDERS, order_body)
    before = order_rows()

    body = assert_problem(shop.post(ORDERS, {**order_body, **change}), 409, code)

    assert [error["field"] for error in body["errors"]] == [field]
    assert order_rows() == before


def test_an_order_sent_without_its_optional_fields_keeps_them(shop: ApiClient, order_body: dict[str, Any]) -> None:
    """The shop may not know the charge id that import_charges recorded: empty means not given."""
    shop.post(ORDERS, order_body)

    response = shop.post(ORDERS, {**order_body, "charge_reference": "", "customer_email": ""})

    assert response.status_code == 200 and response.json()["changed"] == []
    order = Order.objects.get(number="5001")
    assert (order.charge_reference, order.customer_email, order.version) == ("ch_5001", "grace@example.com", 1)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"captured_amount": "12.345"}, "captured_amount"),
        ({"captured_amount": "0"}, "captured_amount"),
        ({"currency": "XXX"}, "currency"),
        ({"customer_email": "not-an-email"}, "customer_email"),
        ({"paid_at": "2999-01-01T00:00:00Z"}, "paid_at"),
        ({"paid_at": "2026-11-20T09:30:00"}, "paid_at"),
        ({"order_number": "bad number"}, "order_number"),
        ({"customer_name": "Grace\x00Hopper"}, "customer_name"),
        ({"unexpected": 1}, "unexpected"),
    ],
)
def test_bad_input_is_a_422_naming_the_field_and_writes_nothing(
    shop: ApiClient,
    order_body: dict[str, Any],
    order_rows: Callable[[], list[tuple[Any, ...]]],
    change: dict[str, str],
    field: str,
) -> None:
    """Invariant 11: bad input gets a clear error naming the field and writes nothing."""
    body = assert_problem(shop.post(ORDERS, {**order_body, **change}), 422, "validation_failed")

    assert field in [error["field"] for error in body["errors"]], body
    assert order_rows() == []


def test_a_zero_decimal_currency_takes_whole_units_only(shop: ApiClient, order_body: dict[str, Any]) -> None:
    yen = {**order_body, "currency": "JPY", "order_number": "5002", "charge_reference": ""}
    assert_problem(shop.post(ORDERS, {**yen, "captured_amount": "3000.50"}), 422, "validation_failed")
    assert shop.post(ORDERS, {**yen, "captured_amount": "3000"}).status_code == 201


def test_an_agent_without_the_orders_scope_is_refused_with_403(
    api: ApiClient, order_body: dict[str, Any], order_rows: Callable[[], list[tuple[Any, ...]]]
) -> None:
    assert_problem(api.post(ORDERS, order_body), 403, "scope_missing")
    assert order_rows() == []


def test_the_shops_token_cannot_propose_refunds(shop: ApiClient, order_body: dict[str, Any]) -> None:
    shop.post(ORDERS, order_body)
    proposal = {
        "order_number": "5001",
        "external_reference": "ZD-1",
        "amount": "1.00",
        "currency": "EUR",
        "reason_code": "damaged",
    }
    assert_problem(shop.post("/api/v1/refunds", proposal), 403, "scope_missing")
