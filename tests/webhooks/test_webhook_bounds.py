"""POST /webhooks/stripe bounds what it parses and when it was signed: a signed body that nests
too deep or is too large answers 400 (never a 500), and so does a timestamp from the future."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from django.test import Client

from actions.models import WebhookEvent
from actions.provider_events.services import json_nesting_exceeds
from harness.sandboxes.payment.webhooks import sign

pytestmark = pytest.mark.django_db

SECRET = "whsec_test_bounds"
URL = "/webhooks/stripe"


@pytest.fixture(autouse=True)
def endpoint_secret(settings: Any) -> None:
    settings.PROVIDER_WEBHOOK_SECRET = SECRET


def _post(payload: bytes, *, at: int | None = None) -> Any:
    header = sign(payload, SECRET, int(time.time()) if at is None else at)
    return Client().post(URL, data=payload, content_type="application/json", headers={"Stripe-Signature": header})


def _event(event_id: str = "evt_bounds") -> bytes:
    body = {"id": event_id, "object": "event", "type": "customer.created", "data": {"object": {"id": "cus_1"}}}
    return json.dumps(body).encode()


def test_a_signed_body_nested_100000_levels_deep_answers_400_and_writes_nothing() -> None:
    payload = b'{"id": "evt_deep", "type": "x", "data": {"object": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}"
    answer = _post(payload)
    assert answer.status_code == 400
    assert "nests deeper than" in answer.json()["error"]
    assert not WebhookEvent.objects.exists()


def test_a_signed_body_over_the_size_limit_answers_400(settings: Any) -> None:
    settings.PROVIDER_WEBHOOK_MAX_BODY_BYTES = 1024
    payload = json.dumps({"id": "evt_big", "type": "x", "data": {"object": {"pad": "x" * 2000}}}).encode()
    answer = _post(payload)
    assert answer.status_code == 400
    assert "larger than 1024 bytes" in answer.json()["error"]
    assert not WebhookEvent.objects.exists()


def test_a_timestamp_an_hour_in_the_future_is_refused() -> None:
    answer = _post(_event(), at=int(time.time()) + 3600)
    assert answer.status_code == 400
    assert "future" in answer.json()["error"]
    assert not WebhookEvent.objects.exists()


def test_a_timestamp_a_little_ahead_of_the_clock_is_accepted() -> None:
    answer = _post(_event(), at=int(time.time()) + 60)
    assert answer.status_code == 200
    assert WebhookEvent.objects.filter(event_id="evt_bounds").exists()


def test_the_past_side_keeps_stripes_tolerance() -> None:
    assert _post(_event("evt_old"), at=int(time.time()) - 400).status_code == 400
    assert _post(_event("evt_recent"), at=int(time.time()) - 200).status_code == 200


@pytest.mark.parametrize(
    ("text", "limit", "exceeds"),
    [
        (b"[[[]]]", 3, False),
        (b"[[[[]]]]", 3, True),
        (b'{"a": "[[[[[[[["}', 1, False),
        (b'{"a": "\\"[[[[["}', 1, False),
        (b'{"a": {"b": {"c": 1}}}', 2, True),
        (b'[1, [2], [3], {"x": [4]}]', 3, False),
    ],
)
def test_nesting_is_counted_outside_strings_only(text: bytes, limit: int, exceeds: bool) -> None:
    assert json_nesting_exceeds(text, limit) is exceeds
