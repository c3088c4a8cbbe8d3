"""The MCP tools through the SDK's own client, against the real ASGI app on a local port."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace
from typing import Any

import httpx2
import pytest
from django.db import OperationalError
from django.test import Client

from actions.agents.services import agent_token_issue
from actions.models import Action, RefundRequest
from tests.factories import make_agent, make_order, make_request, make_user
from tests.mcp.conftest import mcp_call, mcp_tools

pytestmark = pytest.mark.django_db(transaction=True)


def _proposal(order: Any, **changes: Any) -> dict[str, Any]:
    return {
        "order_number": order.number,
        "request_number": 1,
        "amount": "12.50",
        "currency": "EUR",
        "reason_code": "damaged",
        "evidence": "Photo of the broken lid.",
        **changes,
    }


def test_the_write_tools_say_what_a_repeat_does_and_carry_the_hints(mcp_url: str, token: str) -> None:
    tools = {tool.name: tool for tool in mcp_tools(mcp_url, token)}
    assert set(tools) == {
        "open_refund_request",
        "propose_refund",
        "open_adjustment_request",
        "propose_invoice_adjustment",
        "get_action",
        "list_actions",
        "explain_action",
    }

    propose = tools["propose_refund"]
    assert propose.annotations is not None
    assert propose.annotations.read_only_hint is False
    assert propose.annotations.idempotent_hint is True
    assert propose.annotations.destructive_hint is True  # money, once sent, cannot be taken back
    assert "returns the same action; it never refunds twice" in (propose.description or "")

    opening = tools["open_refund_request"]
    assert opening.annotations is not None
    assert opening.annotations.idempotent_hint is True
    assert opening.annotations.destructive_hint is False
    assert "it never opens a second one" in (opening.description or "")

    for name in ("get_action", "list_actions", "explain_action"):
        annotations = tools[name].annotations
        assert annotations is not None and annotations.read_only_hint is True, name


def test_the_same_proposal_twice_is_one_action(mcp_url: str, token: str) -> None:
    order = make_order()
    make_request(order)
    first = mcp_call(mcp_url, token, "propose_refund", _proposal(order))
    again = mcp_call(mcp_url, token, "propose_refund", _proposal(order))
    assert not first.is_error and not again.is_error
    assert first.structured_content is not None and again.structured_content is not None
    assert first.structured_content["action_id"] == again.structured_content["action_id"]
    assert first.structured_content["action_id"] == f"refund:order-{order.number}:request-1"
    assert Action.objects.filter(order=order).count() == 1


def test_a_changed_payload_is_a_needs_person_error_naming_the_fields(mcp_url: str, token: str) -> None:
    """Like the API's 409: the differing fields with both values, the existing action's id."""
    order = make_order()
    make_request(order)
    mcp_call(mcp_url, token, "propose_refund", _proposal(order))
    changed = mcp_call(mcp_url, token, "propose_refund", _proposal(order, amount="13.00", reason_code="goodwill"))
    assert changed.is_error
    error = changed.structured_content
    assert error is not None
    assert error["error"] == "needs_person"
    assert error["code"] == "payload_conflict"
    assert error["action_id"] == f"refund:order-{order.number}:request-1"
    assert error["differing"]["amount"] == {"existing": "12.50", "proposed": "13.00"}
    assert set(error["differing"]) == {"amount", "reason_code"}
    # The text the model reads carries the same document.
    assert '"payload_conflict"' in changed.content[0].text  # type: ignore[union-attr]
    assert Action.objects.get(order=order).amount == 12.50


def test_bad_arguments_are_bad_input_naming_each_field_and_write_nothing(mcp_url: str, token: str) -> None:
    order = make_order()
    make_request(order)
    result = mcp_call(mcp_url, token, "propose_refund", _proposal(order, amount=12.5, currency="EURO", colour="blue"))
    assert result.is_error
    error = result.structured_content
    assert error is not None
    assert error["error"] == "bad_input"
    assert {(e["field"], e["code"]) for e in error["errors"]} == {
        ("amount", "invalid_type"),
        ("currency", "too_long"),
        ("colour", "unknown_field"),
    }
    # The service's own checks (does the order exist?) name their field the same way.
    unknown = mcp_call(mcp_url, token, "propose_refund", _proposal(order, order_number="no-such-order"))
    assert unknown.structured_content is not None
    assert unknown.structured_content["error"] == "bad_input"
    assert [e["field"] for e in unknown.structured_content["errors"]] == ["order_number"]
    assert not Action.objects.exists()


def test_another_agents_token_gets_not_found_identical_to_an_unknown_id(
    mcp_url: str, token: str, agent_owner: Any
) -> None:
    """Isolation, as in the API: an id that is someone else's answers exactly like one that
    does not exist, so a token learns nothing about other agents' actions."""
    order = make_order()
    make_request(order)
    action_id = mcp_call(mcp_url, token, "propose_refund", _proposal(order)).structured_content["action_id"]  # type: ignore[index]
    other = agent_token_issue(agent=make_agent(make_user("olga.owner", "agent"), name="other-bot")).plain

    for tool in ("get_action", "explain_action"):
        theirs = mcp_call(mcp_url, other, tool, {"action_id": action_id})
        unknown = mcp_call(mcp_url, other, tool, {"action_id": "refund:order-0000:request-9"})
        assert theirs.is_error and unknown.is_error
        assert theirs.structured_content == unknown.structured_content
        assert theirs.content == unknown.content
        assert theirs.structured_content is not None
        assert theirs.structured_content["code"] == "action_not_found"
        # The owner still reads it.
        assert not mcp_call(mcp_url, token, tool, {"action_id": action_id}).is_error

    listed = mcp_call(mcp_url, other, "list_actions", {})
    assert listed.structured_content == {"items": [], "next_cursor": None}


def test_opening_a_refund_request_twice_returns_the_same_request(mcp_url: str, token: str) -> None:
    order = make_order()
    arguments = {
        "order_number": order.number,
        "external_reference": "ZD-48213",
        "reason_code": "damaged",
        "note": "Lid broken.",
    }
    first = mcp_call(mcp_url, token, "open_refund_request", arguments)
    again = mcp_call(mcp_url, token, "open_refund_request", arguments)
    assert first.structured_content is not None and again.structured_content is not None
    assert (first.structured_content["created"], again.structured_content["created"]) == (True, False)
    assert first.structured_content["request_number"] == again.structured_content["request_number"] == 1
    assert RefundRequest.objects.filter(order=order).count() == 1
    # Then a proposal by the ticket's reference names the same request.
    proposed = mcp_call(
        mcp_url, token, "propose_refund", _proposal(order, request_number=None, external_reference="ZD-48213")
    )
    assert proposed.structured_content is not None
    assert proposed.structured_content["action_id"] == f"refund:order-{order.number}:request-1"


def test_an_agent_without_the_refund_scope_needs_a_person(mcp_url: str, agent_owner: Any) -> None:
    order = make_order()
    make_request(order)
    scopeless = agent_token_issue(agent=make_agent(agent_owner, name="read-only-bot", scopes=[])).plain
    result = mcp_call(mcp_url, scopeless, "propose_refund", _proposal(order))
    assert result.structured_content is not None
    assert (result.structured_content["error"], result.structured_content["code"]) == ("needs_person", "scope_missing")
    assert not Action.objects.exists()


def test_explain_action_says_what_the_agent_should_do(mcp_url: str, token: str) -> None:
    order = make_order()
    make_request(order)
    mcp_call(mcp_url, token, "propose_refund", _proposal(order))
    explained = mcp_call(
        mcp_url, token, "explain_action", {"action_id": f"refund:order-{order.number}:request-1"}
    ).structured_content
    assert explained is not None
    assert explained["status"] == "AUTHORIZED"  # 12.50 EUR is under the auto-approval threshold
    assert explained["explanation"]["final"] is False
    assert "Never send a new proposal" in explained["agent_should"]
    assert explained["read_again_after_seconds"] > 0


@pytest.mark.parametrize("authorization", [None, "Bearer ect_not-a-real-token", "Basic abc"])
def test_a_request_without_a_valid_token_is_refused_before_the_sdk_sees_it(
    mcp_url: str, authorization: str | None
) -> None:
    headers = {"Accept": "application/json, text/event-stream"}
    if authorization:
        headers["Authorization"] = authorization
    response = httpx2.post(mcp_url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, headers=headers)
    assert response.status_code == 401
    assert response.headers["content-type"] == "application/problem+json"
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert response.json()["code"] in {"token_missing", "token_invalid"}


def test_bad_tokens_from_one_address_are_refused_as_rate_limited_after_the_apis_limit(
    mcp_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guessing tokens over MCP costs the same per-address budget as over REST (60 a minute by
    default, API_ANONYMOUS_RATE_LIMIT_PER_MINUTE): the 61st bad token is a 429, and the REST API
    then refuses the same address too, because both count with the same limiter."""
    # The middle of one counting window, so that the 61 requests cannot straddle two windows.
    window_middle = (int(time.time()) // 60) * 60 + 30.0
    monkeypatch.setattr("actions.api.ratelimit.time", SimpleNamespace(time=lambda: window_middle))
    headers = {"Accept": "application/json, text/event-stream"}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}

    answers = [
        httpx2.post(mcp_url, json=body, headers={**headers, "Authorization": f"Bearer ect_guess{n}"})
        for n in range(61)
    ]

    assert [answer.status_code for answer in answers[:60]] == [401] * 60
    limited = answers[60]
    assert limited.status_code == 429
    assert limited.headers["content-type"] == "application/problem+json"
    assert limited.json()["code"] == "rate_limited"
    assert 1 <= int(limited.headers["retry-after"]) <= 60
    # One budget per address, whichever interface the guesses came through.
    rest = Client(REMOTE_ADDR="127.0.0.1").get("/api/v1/actions", headers={"Authorization": "Bearer ect_guess-rest"})
    assert rest.status_code == 429


def test_a_deactivated_agent_is_forbidden(mcp_url: str, agent: Any, token: str) -> None:
    agent.is_active = False
    agent.save(update_fields=["is_active"])
    response = httpx2.post(
        mcp_url,
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers={"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"},
    )
    assert response.status_code == 403
    assert response.json()["code"] == "agent_inactive"


def test_calls_over_the_tokens_rate_limit_are_retryable_with_the_wait(mcp_url: str, token: str, settings: Any) -> None:
    """One budget per token, shared with the HTTP API (the same counter)."""
    settings.API_RATE_LIMIT_PER_MINUTE = 2
    for _ in range(2):
        assert not mcp_call(mcp_url, token, "list_actions", {}).is_error
    limited = mcp_call(mcp_url, token, "list_actions", {})
    assert limited.is_error
    assert limited.structured_content is not None
    assert (limited.structured_content["error"], limited.structured_content["code"]) == ("retryable", "rate_limited")
    assert 1 <= limited.structured_content["retry_after_seconds"] <= 60


@pytest.mark.parametrize(
    ("failure", "code"),
    [
        (RuntimeError("a bug"), "server_error"),
        (OperationalError("the server closed the connection"), "database_unavailable"),
    ],
)
def test_a_crash_or_a_lost_database_is_retryable_and_tells_nothing_of_the_internals(
    mcp_url: str, token: str, monkeypatch: pytest.MonkeyPatch, failure: Exception, code: str
) -> None:
    def broken(**kwargs: Any) -> Any:
        raise failure

    monkeypatch.setattr("actions.proposals.reads.action_get_for_agent", broken)
    result = mcp_call(mcp_url, token, "get_action", {"action_id": "refund:order-1:request-1"})
    assert result.is_error
    assert result.structured_content is not None
    assert (result.structured_content["error"], result.structured_content["code"]) == ("retryable", code)
    assert str(failure) not in result.content[0].text  # type: ignore[union-attr]


def test_opening_a_refund_request_is_logged_with_the_order_and_request_numbers(
    mcp_url: str, token: str, caplog: pytest.LogCaptureFixture
) -> None:
    order = make_order()
    arguments = {"order_number": order.number, "external_reference": "ZD-48213", "reason_code": "damaged"}
    with caplog.at_level(logging.INFO):
        mcp_call(mcp_url, token, "open_refund_request", arguments)
        mcp_call(mcp_url, token, "open_refund_request", arguments)

    opened = [r.getMessage() for r in caplog.records if r.getMessage().startswith("mcp.refund_request.")]
    assert [line.split(" agent=")[0] for line in opened] == ["mcp.refund_request.opened", "mcp.refund_request.replayed"]
    assert all(line.endswith(f" order={order.number} request=1") for line in opened), opened
