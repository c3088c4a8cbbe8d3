"""Limits and hygiene: rate limit, body size, JSON only, problem documents for every error,
and structured logs that carry the action id."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import pytest

from actions.agents.services import agent_token_issue
from actions.api.ratelimit import ratelimit_hit
from actions.models import Agent
from tests.api.conftest import ApiClient, assert_problem

pytestmark = pytest.mark.django_db

REFUNDS = "/api/v1/refunds"


def test_a_token_over_its_limit_gets_429_with_retry_after(api: ApiClient, agent: Agent, settings: Any) -> None:
    settings.API_RATE_LIMIT_PER_MINUTE = 3
    for _ in range(3):
        assert api.get("/api/v1/actions").status_code == 200

    response = api.get("/api/v1/actions")

    assert_problem(response, 429, "rate_limited")
    assert 1 <= int(response["Retry-After"]) <= 60
    # The limit is per token: another token of the same agent still gets through.
    assert ApiClient(agent_token_issue(agent=agent).plain).get("/api/v1/actions").status_code == 200


def test_the_window_resets_after_its_minute() -> None:
    start = 60.0 * 16_667 + 20  # 20 s into a window
    decisions = [ratelimit_hit(key="unit", limit=2, now=start + i) for i in range(3)]
    assert [d.allowed for d in decisions] == [True, True, False]
    assert decisions[-1].retry_after == 38
    assert ratelimit_hit(key="unit", limit=2, now=start + 40).allowed


def test_a_body_over_the_size_cap_is_a_413_and_writes_nothing(
    api: ApiClient, proposal: dict[str, Any], row_counts: Callable[[], dict[str, int]], settings: Any
) -> None:
    settings.API_MAX_BODY_BYTES = 1024
    before = row_counts()

    response = api.post(REFUNDS, {**proposal, "evidence": "x" * 2000})

    assert_problem(response, 413, "body_too_large")
    assert row_counts() == before


@pytest.mark.parametrize(
    "content_type", ["application/x-www-form-urlencoded", "text/plain", "application/json; charset=latin-1"]
)
def test_a_body_that_is_not_json_is_a_415(
    api: ApiClient, proposal: dict[str, Any], row_counts: Callable[[], dict[str, int]], content_type: str
) -> None:
    before = row_counts()
    response = api.post(REFUNDS, json.dumps(proposal), content_type=content_type)
    assert_problem(response, 415, "not_json")
    assert row_counts() == before


def test_a_json_content_type_with_utf8_charset_is_accepted(api: ApiClient, proposal: dict[str, Any]) -> None:
    response = api.post(REFUNDS, proposal, content_type="application/json; charset=UTF-8")
    assert response.status_code == 201


def test_a_wrong_method_is_a_405_problem_listing_the_allowed_ones(api: ApiClient, anonymous: ApiClient) -> None:
    response = api.client.delete("/api/v1/actions", headers=api.headers())
    assert_problem(response, 405, "method_not_allowed")
    assert response["Allow"] == "GET"
    assert_problem(anonymous.post("/api/v1/openapi.json", {}), 405, "method_not_allowed")


def test_an_unknown_url_under_the_api_is_a_404_problem(anonymous: ApiClient, api: ApiClient) -> None:
    assert_problem(anonymous.get("/api/v1/nothing-here"), 404, "not_found")
    assert_problem(api.post("/api/v1/refunds/extra", {}), 404, "not_found")
    assert_problem(anonymous.get("/api/v1/"), 404, "not_found")


def test_a_crash_in_an_operation_is_a_500_problem_and_a_logged_traceback(
    api: ApiClient, proposal: dict[str, Any], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def explode(**kwargs: Any) -> Any:
        raise RuntimeError("database on fire")

    monkeypatch.setattr("actions.proposals.refunds.action_propose_refund", explode)
    with caplog.at_level(logging.INFO, logger="actions.api"):
        response = api.post(REFUNDS, proposal)

    body = assert_problem(response, 500, "server_error")
    assert "database on fire" not in json.dumps(body)
    crashed = [json.loads(r.getMessage()) for r in caplog.records if "request.crashed" in r.getMessage()]
    assert crashed and "database on fire" in crashed[0]["traceback"]


def _api_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [json.loads(record.getMessage()) for record in caplog.records if record.name == "actions.api"]


def test_every_log_line_of_a_request_about_an_action_carries_its_action_id(
    api: ApiClient, proposal: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    action_id = "refund:order-4821:request-1"
    with caplog.at_level(logging.INFO):
        api.post(REFUNDS, proposal)
        api.post(REFUNDS, proposal)
        api.post(REFUNDS, {**proposal, "amount": "41.00"})
        api.get(f"/api/v1/actions/{action_id}")

    lines = _api_lines(caplog)
    assert {line["event"] for line in lines} >= {
        "refund.proposed",
        "refund.replayed",
        "refund.conflict",
        "request.finished",
    }
    assert all(line["action_id"] == action_id for line in lines), lines
    assert len({line["request_id"] for line in lines}) == 4
    assert all(line["agent"] == "support-bot" for line in lines)
    # Django's own plain-text line for the 409 ("Conflict: /api/v1/refunds") is not repeated.
    assert not [r for r in caplog.records if r.name == "django.request"]


def test_a_refused_token_is_logged_without_the_secret(
    token: str, caplog: pytest.LogCaptureFixture, proposal: dict[str, Any]
) -> None:
    wrong = token[:-6] + "ZZZZZZ"
    with caplog.at_level(logging.INFO):
        ApiClient(wrong).post(REFUNDS, proposal)

    refused = [line for line in _api_lines(caplog) if line["event"] == "auth.refused"]
    assert refused and refused[0]["code"] == "token_invalid"
    assert wrong not in caplog.text
    assert refused[0]["token"] == wrong[:12]


def test_a_client_request_id_is_echoed_and_logged(api: ApiClient, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        response = api.get("/api/v1/actions", headers={"X-Request-Id": "agent-run-42.7"})
    assert response["X-Request-Id"] == "agent-run-42.7"
    assert _api_lines(caplog)[-1]["request_id"] == "agent-run-42.7"
