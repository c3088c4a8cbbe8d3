"""Reading actions over HTTP: one action, the agent's list, and isolation between agents."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from actions.agents.services import agent_token_issue
from actions.models import Action, ActionStatus, Order
from tests.api.conftest import ApiClient, assert_problem
from tests.factories import make_agent, make_order, make_request

pytestmark = pytest.mark.django_db

S = ActionStatus
REFUNDS = "/api/v1/refunds"


def propose_many(api: ApiClient, count: int, *, amount: str = "30.00") -> list[str]:
    """Propose ``count`` refunds, each on a fresh order; returns their action ids, oldest first."""
    ids = []
    for _ in range(count):
        order = make_order(captured="100.00")
        make_request(order, 1)
        body = {
            "order_number": order.number,
            "request_number": 1,
            "amount": amount,
            "currency": "EUR",
            "reason_code": "damaged",
        }
        response = api.post(REFUNDS, body)
        assert response.status_code == 201, response.content
        ids.append(response.json()["action_id"])
    return ids


@pytest.fixture
def other_agent_client(agent_owner: Any) -> ApiClient:
    return ApiClient(agent_token_issue(agent=make_agent(agent_owner, name="other-bot")).plain)


def test_an_agent_reads_its_action_with_status_explanation_and_timestamps(
    api: ApiClient, proposal: dict[str, Any]
) -> None:
    action_id = api.post(REFUNDS, proposal).json()["action_id"]

    response = api.get(f"/api/v1/actions/{action_id}")

    assert response.status_code == 200
    body = response.json()
    assert body["action_id"] == action_id
    assert body["status"] == "PROPOSED"
    assert body["explanation"]["needs_person"] is True
    assert "manager" in body["explanation"]["next_step"]
    assert body["created_at"] and body["updated_at"] and body["status_changed_at"]
    assert body["provider_reference"] is None


def test_the_provider_reference_is_shown_once_known(api: ApiClient, proposal: dict[str, Any]) -> None:
    action_id = api.post(REFUNDS, proposal).json()["action_id"]
    # Only the read side is under test: the outcome services belong to the worker.
    Action.objects.filter(action_id=action_id).update(
        status=S.SUCCEEDED, provider_reference="re_3PXk9", status_changed_at=timezone.now()
    )

    body = api.get(f"/api/v1/actions/{action_id}").json()

    assert body["status"] == "SUCCEEDED"
    assert body["provider_reference"] == "re_3PXk9"
    assert body["explanation"]["final"] is True
    assert "re_3PXk9" in body["explanation"]["summary"]


def test_an_unknown_outcome_tells_the_agent_to_wait_and_never_send_again(
    api: ApiClient, proposal: dict[str, Any]
) -> None:
    action_id = api.post(REFUNDS, proposal).json()["action_id"]
    Action.objects.filter(action_id=action_id).update(status=S.UNKNOWN)

    explanation = api.get(f"/api/v1/actions/{action_id}").json()["explanation"]

    assert explanation["final"] is False
    assert "never send a new request" in explanation["next_step"]


def test_another_agents_action_is_a_404_identical_to_an_id_that_does_not_exist(
    api: ApiClient, other_agent_client: ApiClient, order: Order, proposal: dict[str, Any]
) -> None:
    theirs = other_agent_client.post(REFUNDS, proposal).json()["action_id"]
    assert other_agent_client.get(f"/api/v1/actions/{theirs}").status_code == 200

    not_mine = api.get(f"/api/v1/actions/{theirs}")
    absent = api.get("/api/v1/actions/refund:order-4821:request-99")

    assert_problem(not_mine, 404, "action_not_found")
    assert not_mine.content == absent.content
    assert not_mine["Content-Type"] == absent["Content-Type"]
    assert theirs not in not_mine.content.decode()


def test_the_list_shows_only_the_agents_own_actions(
    api: ApiClient, other_agent_client: ApiClient, proposal: dict[str, Any]
) -> None:
    theirs = other_agent_client.post(REFUNDS, proposal).json()["action_id"]
    mine = propose_many(api, 2)

    listed = [item["action_id"] for item in api.get("/api/v1/actions").json()["items"]]
    their_list = [item["action_id"] for item in other_agent_client.get("/api/v1/actions").json()["items"]]

    assert listed == list(reversed(mine))
    assert their_list == [theirs]


def test_the_list_filters_by_status(api: ApiClient) -> None:
    proposed, rejected, approved = propose_many(api, 3)
    Action.objects.filter(action_id=rejected).update(status=S.REJECTED)
    Action.objects.filter(action_id=approved).update(status=S.AUTHORIZED)

    def listed(*statuses: str) -> set[str]:
        query = "&".join(f"status={status}" for status in statuses)
        response = api.get(f"/api/v1/actions?{query}")
        assert response.status_code == 200
        return {item["action_id"] for item in response.json()["items"]}

    assert listed("PROPOSED") == {proposed}
    assert listed("REJECTED", "AUTHORIZED") == {rejected, approved}
    body = assert_problem(api.get("/api/v1/actions?status=BOGUS"), 422, "validation_failed")
    assert body["errors"][0]["field"].startswith("status")


def test_the_cursor_pages_through_every_action_once_newest_first(api: ApiClient) -> None:
    ids = propose_many(api, 5)
    seen: list[str] = []
    response = api.get("/api/v1/actions", {"limit": 2})
    pages = 0
    while True:
        pages += 1
        body = response.json()
        seen += [item["action_id"] for item in body["items"]]
        if body["next_cursor"] is None:
            assert "next" not in body["links"]
            break
        # Newer actions proposed while paging do not shift the pages.
        if pages == 1:
            propose_many(api, 1)
        response = api.get(body["links"]["next"])
        assert response.status_code == 200

    assert seen == list(reversed(ids))
    assert pages == 3


def test_an_edited_cursor_is_refused_with_a_problem_naming_it(api: ApiClient) -> None:
    propose_many(api, 2)
    cursor = api.get("/api/v1/actions", {"limit": 1}).json()["next_cursor"]

    body = assert_problem(api.get("/api/v1/actions", {"cursor": cursor[:-3] + "abc"}), 422, "validation_failed")

    assert body["errors"] == [{"field": "cursor", "code": "invalid_cursor", "message": body["errors"][0]["message"]}]


def test_an_out_of_range_page_size_is_a_problem_naming_the_parameter(api: ApiClient) -> None:
    body = assert_problem(api.get("/api/v1/actions", {"limit": 0}), 422, "validation_failed")
    assert [(e["field"], e["code"]) for e in body["errors"]] == [("limit", "out_of_range")]
