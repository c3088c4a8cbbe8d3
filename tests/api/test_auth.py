"""Authentication and authorisation over HTTP: every refusal is a problem document, and a
refused request writes nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client

from actions.agents.services import agent_token_issue, agent_token_revoke, agent_token_rotate
from actions.models import Agent, AgentToken
from tests.api.conftest import ApiClient, assert_problem
from tests.factories import PASSWORD, make_agent

pytestmark = pytest.mark.django_db

REFUNDS = "/api/v1/refunds"


def test_a_request_without_a_token_is_refused_with_401(
    anonymous: ApiClient, proposal: dict[str, Any], row_counts: Callable[[], dict[str, int]]
) -> None:
    before = row_counts()
    response = anonymous.post(REFUNDS, proposal)
    assert_problem(response, 401, "token_missing")
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert row_counts() == before


def test_a_wrong_token_is_refused_with_401(proposal: dict[str, Any], token: str) -> None:
    wrong = ApiClient(token[:-4] + "AAAA")
    assert_problem(wrong.post(REFUNDS, proposal), 401, "token_invalid")
    assert_problem(ApiClient("not-even-our-format").get("/api/v1/actions"), 401, "token_invalid")


def test_a_basic_auth_header_is_not_a_token(proposal: dict[str, Any], token: str) -> None:
    client = Client()
    response = client.post(
        REFUNDS, proposal, content_type="application/json", headers={"Authorization": f"Basic {token}"}
    )
    assert_problem(response, 401, "token_missing")


def test_a_revoked_token_is_refused_with_401(agent: Agent, proposal: dict[str, Any]) -> None:
    issued = agent_token_issue(agent=agent)
    client = ApiClient(issued.plain)
    assert client.get("/api/v1/actions").status_code == 200

    agent_token_revoke(token=issued.token)

    assert_problem(client.post(REFUNDS, proposal), 401, "token_invalid")
    assert_problem(client.get("/api/v1/actions"), 401, "token_invalid")


def test_after_a_rotation_the_old_token_is_refused_and_the_new_one_works(agent: Agent) -> None:
    old = agent_token_issue(agent=agent, label="prod")
    new = agent_token_rotate(token=old.token)

    assert_problem(ApiClient(old.plain).get("/api/v1/actions"), 401, "token_invalid")
    assert ApiClient(new.plain).get("/api/v1/actions").status_code == 200
    assert new.token.label == "prod"


def test_a_deactivated_agent_is_refused_with_403(agent: Agent, api: ApiClient, proposal: dict[str, Any]) -> None:
    Agent.objects.filter(pk=agent.pk).update(is_active=False)

    body = assert_problem(api.post(REFUNDS, proposal), 403, "agent_inactive")
    assert agent.name in body["detail"]
    assert_problem(api.get("/api/v1/actions"), 403, "agent_inactive")


def test_an_agent_without_the_refund_scope_may_not_propose_refunds(
    agent_owner: Any, proposal: dict[str, Any], row_counts: Callable[[], dict[str, int]]
) -> None:
    reader = make_agent(agent_owner, name="reporting-bot", scopes=[])
    client = ApiClient(agent_token_issue(agent=reader).plain)
    before = row_counts()

    assert_problem(client.post(REFUNDS, proposal), 403, "scope_missing")
    assert_problem(
        client.post(
            "/api/v1/refund-requests", {"order_number": "4821", "external_reference": "ZD-9", "reason_code": "damaged"}
        ),
        403,
        "scope_missing",
    )
    assert row_counts() == before
    # Reading its own (empty) list needs no scope.
    assert client.get("/api/v1/actions").json()["items"] == []


def test_a_successful_request_records_when_the_token_was_last_used(api: ApiClient, agent: Agent) -> None:
    assert AgentToken.objects.get(agent=agent).last_used_at is None
    api.get("/api/v1/actions")
    assert AgentToken.objects.get(agent=agent).last_used_at is not None


def test_a_console_session_does_not_authenticate_api_requests(
    agent_owner: Any, proposal: dict[str, Any], row_counts: Callable[[], dict[str, int]]
) -> None:
    """The API is CSRF-exempt because it never reads the session: a logged-in browser that is
    tricked into posting to it is refused like anyone without a token."""
    browser = Client(enforce_csrf_checks=True)
    assert browser.login(username=agent_owner.username, password=PASSWORD)
    before = row_counts()

    response = browser.post(REFUNDS, proposal, content_type="application/json")

    assert_problem(response, 401, "token_missing")
    assert row_counts() == before


def test_the_browser_console_keeps_its_csrf_protection(agent_owner: Any) -> None:
    browser = Client(enforce_csrf_checks=True)
    response = browser.post("/login/", {"username": agent_owner.username, "password": PASSWORD})
    assert response.status_code == 403  # Django's CSRF failure, not a login
