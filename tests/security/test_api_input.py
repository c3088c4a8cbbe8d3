"""Findings 9, 11 and 12 (API part): agents see only their own data; text cannot be spoofed;
a body means one thing."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from actions.agents.services import agent_token_issue
from actions.foundation.text import unsafe_characters
from actions.models import Action, RefundRequest
from tests.factories import make_agent, make_order, make_request

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def manual(settings: Any) -> None:
    settings.AUTO_APPROVAL_ENABLED = False


def post(token: str, path: str, body: Any) -> Any:
    raw = body if isinstance(body, str) else json.dumps(body)
    return Client().post(path, raw, content_type="application/json", headers={"Authorization": f"Bearer {token}"})


@pytest.fixture
def token(agent: Any) -> str:
    return agent_token_issue(agent=agent).plain


@pytest.fixture
def order(db: Any) -> Any:
    order = make_order(number="4821", captured="310.00")
    make_request(order, 1, external_reference="ZD-1")
    return order


@pytest.mark.parametrize("char", ["\u202e", "\u0007", "\u2066", "\u200f", "\x1b"])
def test_control_and_bidi_characters_are_refused_naming_the_field(token: str, order: Any, char: str) -> None:
    proposal = {
        "order_number": "4821",
        "request_number": 1,
        "amount": "40.00",
        "currency": "EUR",
        "reason_code": "damaged",
        "evidence": f"Customer says {char}01 EUR only",
    }
    opened = {"order_number": "4821", "external_reference": "ZD-7", "reason_code": "damaged", "note": f"x{char}y"}

    refused = post(token, "/api/v1/refunds", proposal)
    refused_note = post(token, "/api/v1/refund-requests", opened)

    assert refused.status_code == 422
    assert [e["field"] for e in refused.json()["errors"]] == ["evidence"]
    assert refused.json()["errors"][0]["code"] == "invalid_characters"
    assert refused_note.status_code == 422
    assert [e["field"] for e in refused_note.json()["errors"]] == ["note"]
    assert not Action.objects.exists()
    assert not RefundRequest.objects.filter(external_reference="ZD-7").exists()


def test_line_breaks_and_tabs_stay_allowed() -> None:
    assert unsafe_characters("line one\nline two\r\n\tindented") == []
    assert unsafe_characters("a\u202eb\u0007") == ["U+202E", "U+0007"]


def test_duplicate_json_keys_are_refused_with_422(token: str, order: Any) -> None:
    body = (
        '{"order_number": "4821", "request_number": 1, "amount": "1.00", "amount": "300.00", '
        '"currency": "EUR", "reason_code": "damaged"}'
    )
    response = post(token, "/api/v1/refunds", body)

    assert response.status_code == 422
    assert response.json()["code"] == "duplicate_keys"
    assert [e["field"] for e in response.json()["errors"]] == ["amount"]
    assert not Action.objects.exists()


def test_a_balance_error_does_not_reveal_the_orders_figures(token: str, order: Any) -> None:
    proposal = {
        "order_number": "4821",
        "request_number": 1,
        "amount": "999.00",
        "currency": "EUR",
        "reason_code": "damaged",
    }
    response = post(token, "/api/v1/refunds", proposal)

    assert response.status_code == 422
    text = response.content.decode()
    assert "over_refundable_balance" in text
    assert "310" not in text and "captured" not in text and "reserved" not in text


def test_another_agents_refund_request_cannot_be_replayed(token: str, order: Any, agent_owner: Any) -> None:
    other = agent_token_issue(agent=make_agent(agent_owner, name="other-bot")).plain
    mine = {"order_number": "4821", "external_reference": "ZD-MINE", "reason_code": "damaged", "note": "private"}
    assert post(token, "/api/v1/refund-requests", mine).status_code == 201

    replay = post(other, "/api/v1/refund-requests", mine)
    propose = post(
        other,
        "/api/v1/refunds",
        {
            "order_number": "4821",
            "external_reference": "ZD-MINE",
            "amount": "5.00",
            "currency": "EUR",
            "reason_code": "damaged",
        },
    )

    assert replay.status_code == 409
    assert replay.json()["code"] == "reference_taken"
    assert "request_number" not in replay.json()
    assert propose.status_code == 422
    assert post(token, "/api/v1/refund-requests", mine).status_code == 200  # the opener's own retry


def test_an_agent_opens_at_most_n_requests_per_order_per_day(token: str, order: Any, settings: Any) -> None:
    settings.REFUND_REQUESTS_PER_ORDER_PER_DAY = 3
    answers = [
        post(
            token,
            "/api/v1/refund-requests",
            {"order_number": "4821", "external_reference": f"ZD-{n}0", "reason_code": "damaged"},
        )
        for n in range(5)
    ]
    assert [a.status_code for a in answers] == [201, 201, 201, 422, 422]
    assert answers[3].json()["errors"][0]["code"] == "request_limit_reached"


def test_a_refund_request_needs_a_reason_code(token: str, order: Any) -> None:
    response = post(token, "/api/v1/refund-requests", {"order_number": "4821", "external_reference": "ZD-9"})
    assert response.status_code == 422
    assert [e["field"] for e in response.json()["errors"]] == ["reason_code"]
