"""Dated API versions: the token's pin, the Console-Version header, the compatibility layer and
what last week's client gets without a reason code (docs/api-versions.md)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from actions.agents.services import agent_token_issue
from actions.api import versions
from actions.api.versions import ApiVersion, VersionChange
from actions.models import Agent, AgentToken, Order, RefundRequest
from tests.api.conftest import ApiClient, assert_problem

pytestmark = pytest.mark.django_db

LAST_WEEK = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


def _token_created(agent: Agent, when: datetime) -> str:
    issued = agent_token_issue(agent=agent, label=f"created {when:%Y-%m-%d}")
    AgentToken.objects.filter(pk=issued.token.pk).update(created_at=when)
    return issued.plain


@pytest.fixture
def last_weeks_client(agent: Agent) -> ApiClient:
    """An agent deployed before 2026-12-01, its token created then and nothing changed since."""
    return ApiClient(_token_created(agent, LAST_WEEK))


def _open(client: ApiClient, order: Order, *, headers: dict[str, str] | None = None, **body: Any) -> Any:
    return client.post(
        "/api/v1/refund-requests",
        {"order_number": order.number, "external_reference": "ZD-77", **body},
        headers=headers,
    )


# --- pins and headers -----------------------------------------------------------------------


def test_a_token_is_pinned_to_the_version_of_the_day_it_was_created() -> None:
    assert versions.version_resolve(requested="", token_created_at=LAST_WEEK) == "2026-11-29"
    assert versions.version_resolve(requested="", token_created_at=datetime(2026, 12, 1, tzinfo=UTC)) == "2026-12-01"
    assert versions.version_resolve(requested="", token_created_at=datetime(2026, 1, 1, tzinfo=UTC)) == "2026-11-29"


def test_todays_token_is_answered_in_the_current_version_without_deprecation(api: ApiClient, order: Order) -> None:
    response = api.get("/api/v1/actions")
    assert response.status_code == 200
    assert response["Console-Version"] == versions.current_version()
    assert not response.has_header("Deprecation") and not response.has_header("Sunset")


def test_an_older_version_is_announced_as_deprecated_with_its_sunset(last_weeks_client: ApiClient) -> None:
    response = last_weeks_client.get("/api/v1/actions")
    assert response.status_code == 200
    assert response["Console-Version"] == "2026-11-29"
    assert response["Deprecation"] == f"@{int(datetime(2026, 12, 1, tzinfo=UTC).timestamp())}"
    assert response["Sunset"] == "Tue, 01 Jun 2027 00:00:00 GMT"


def test_the_header_chooses_the_version_for_one_request(last_weeks_client: ApiClient) -> None:
    response = last_weeks_client.get("/api/v1/actions", headers={"Console-Version": "2026-12-01"})
    assert response["Console-Version"] == "2026-12-01"


def test_an_unknown_version_is_a_422_naming_the_known_ones_and_writes_nothing(api: ApiClient, order: Order) -> None:
    response = _open(api, order, reason_code="damaged", headers={"Console-Version": "2025-01-01"})
    body = assert_problem(response, 422, "unknown_version")
    assert "2026-11-29" in body["detail"] and "2026-12-01" in body["detail"]
    assert body["errors"][0]["field"] == "Console-Version"
    assert not RefundRequest.objects.filter(external_reference="ZD-77").exists()


# --- the refund request without a reason code: today's client and last week's ---------------


def test_todays_request_with_a_reason_code_opens_the_request(api: ApiClient, order: Order) -> None:
    response = _open(api, order, reason_code="damaged")
    assert response.status_code == 201, response.content
    assert RefundRequest.objects.get(external_reference="ZD-77").reason_code == "damaged"


def test_todays_request_without_a_reason_code_is_a_422_naming_the_field(api: ApiClient, order: Order) -> None:
    body = assert_problem(_open(api, order), 422, "validation_failed")
    assert [e["field"] for e in body["errors"]] == ["reason_code"]
    assert not RefundRequest.objects.filter(external_reference="ZD-77").exists()


def test_last_weeks_request_without_a_reason_code_is_a_422_naming_the_version_that_requires_it(
    last_weeks_client: ApiClient, order: Order
) -> None:
    response = _open(last_weeks_client, order, note="Lid broken.")
    body = assert_problem(response, 422, "validation_failed")
    assert body["errors"] == [
        {
            "field": "reason_code",
            "code": "required",
            "message": "Required since API version 2026-12-01 (this request uses 2026-11-29): say why the customer "
            "asks for money back, one of: duplicate_charge, not_received, damaged, not_as_described, "
            "cancelled_order, late_delivery, goodwill. See the API's versions page.",
        }
    ]
    assert response["Console-Version"] == "2026-11-29" and response.has_header("Sunset")
    assert not RefundRequest.objects.filter(external_reference="ZD-77").exists()


def test_last_weeks_client_that_sends_a_reason_code_is_served(last_weeks_client: ApiClient, order: Order) -> None:
    response = _open(last_weeks_client, order, reason_code="goodwill")
    assert response.status_code == 201, response.content


# --- the compatibility layer keeps an older version's behaviour ------------------------------


@pytest.fixture
def renamed_note(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A future version that renames ``note`` to ``customer_words`` on the refund request; older
    versions keep sending ``note``, which the layer renames for them."""

    def older_request(body: dict[str, Any], version: str) -> dict[str, Any]:
        body = dict(body)
        if "note" in body:
            body["customer_words"] = body.pop("note")
        return body

    def newest_reads(body: dict[str, Any], version: str) -> dict[str, Any]:
        # Stands in for the newest schema: it reads customer_words as the note.
        body = dict(body)
        body["note"] = body.pop("customer_words", "")
        return body

    future = ApiVersion(
        "2099-01-01",
        "note is called customer_words.",
        changes=(VersionChange("refund_requests", "renamed", older_request),),
    )
    reader = ApiVersion("2099-01-02", "test reader", changes=(VersionChange("refund_requests", "read", newest_reads),))
    monkeypatch.setattr(versions, "VERSIONS", (*versions.VERSIONS, future, reader))
    yield


def test_a_pinned_request_goes_through_each_later_change_oldest_first(renamed_note: None) -> None:
    body = versions.request_upgrade(
        version="2026-12-01", operation="refund_requests", body={"note": "Lid broken.", "reason_code": "damaged"}
    )
    assert body == {"note": "Lid broken.", "reason_code": "damaged"}
    newest = versions.request_upgrade(
        version="2099-01-01", operation="refund_requests", body={"customer_words": "x", "reason_code": "damaged"}
    )
    assert newest == {"note": "x", "reason_code": "damaged"}


def test_the_layer_rewrites_an_older_versions_body_before_the_schema_reads_it(
    renamed_note: None, api: ApiClient, order: Order
) -> None:
    response = _open(api, order, reason_code="damaged", note="Lid broken.", headers={"Console-Version": "2026-12-01"})
    assert response.status_code == 201, response.content
    assert response["Console-Version"] == "2026-12-01"
    assert RefundRequest.objects.get(external_reference="ZD-77").note == "Lid broken."
