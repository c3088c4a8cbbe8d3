"""Fixtures for the agent API: a token for the support agent, a client that sends it, an order
with a refund request, and a recorder standing in for the dispatch publisher."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client

from actions.agents.services import agent_token_issue
from actions.models import Action, ActionEvent, AdjustmentRequest, Agent, Bill, Order, RefundRequest
from tests.factories import make_order, make_request

PROBLEM = "application/problem+json"


class ApiClient:
    """Django's test client, speaking JSON with a bearer token (or none)."""

    def __init__(self, token: str | None) -> None:
        self.client = Client()
        self.token = token

    def headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        headers.update(extra or {})
        return headers

    def post(self, path: str, data: Any, *, headers: dict[str, str] | None = None, **kwargs: Any) -> Any:
        body = data if isinstance(data, str | bytes) else json.dumps(data)
        kwargs.setdefault("content_type", "application/json")
        return self.client.post(path, body, headers=self.headers(headers), **kwargs)

    def get(self, path: str, params: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        return self.client.get(path, params or {}, headers=self.headers(kwargs.pop("headers", None)), **kwargs)


@pytest.fixture(autouse=True)
def fast_password_hashing(settings: Any) -> None:
    """Personas are users with passwords; the production hasher is slow by design."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def dispatched(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Action pks whose dispatch was published. The dispatcher is not part of these tests."""
    calls: list[int] = []
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", calls.append)
    return calls


@pytest.fixture
def token(agent: Agent) -> str:
    return agent_token_issue(agent=agent, label="tests").plain


@pytest.fixture
def api(token: str) -> ApiClient:
    return ApiClient(token)


@pytest.fixture
def anonymous() -> ApiClient:
    return ApiClient(None)


@pytest.fixture
def order(db: Any) -> Order:
    """A EUR order of 100.00 paid two days ago, with refund request 1 (ticket ZD-1)."""
    order = make_order(number="4821", currency="EUR", captured="100.00")
    make_request(order, 1, external_reference="ZD-1")
    return order


@pytest.fixture
def proposal(order: Order) -> dict[str, Any]:
    """A valid proposal body for request 1 of ``order``, above the auto-approval threshold."""
    return {
        "order_number": order.number,
        "request_number": 1,
        "amount": "40.00",
        "currency": "EUR",
        "reason_code": "damaged",
        "evidence": "Photo of the broken mug in ticket ZD-1.",
    }


@pytest.fixture
def row_counts(db: Any) -> Callable[[], dict[str, int]]:
    """Count the rows a rejected request must not write (invariant 11)."""

    def _counts() -> dict[str, int]:
        return {
            "actions": Action.objects.count(),
            "events": ActionEvent.objects.count(),
            "refund_requests": RefundRequest.objects.count(),
            "orders": Order.objects.count(),
            # A rejected change to an order must not raise its version either.
            "order_versions": sum(Order.objects.values_list("version", flat=True)),
            "adjustment_requests": AdjustmentRequest.objects.count(),
            "bill_versions": sum(Bill.objects.values_list("version", flat=True)),
        }

    return _counts


def assert_problem(response: Any, status: int, code: str) -> dict[str, Any]:
    """The response is an RFC 9457 problem document with this status and code."""
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith(PROBLEM), response["Content-Type"]
    body: dict[str, Any] = response.json()
    assert body["status"] == status
    assert body["code"] == code, body
    assert body["title"] and body["detail"]
    assert body["type"].startswith("/api/v1/docs#problem-")
    return body
