"""Fuzzing POST /webhooks/stripe: no body, header or event shape makes it answer 5xx.

The endpoint is not an agent API operation (it is not in the OpenAPI document the schemathesis
run reads), so Hypothesis generates its inputs here: raw bytes and headers, which must be
refused with 400 and write nothing; and validly signed events of any JSON shape, which must be
answered 200 or 400, never with a server error.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from django.test import Client
from hypothesis import HealthCheck, example, given, seed, settings
from hypothesis import strategies as st

from actions.models import Order, OrderEvent, OutsideRefund, WebhookEvent
from harness.sandboxes.payment.webhooks import sign
from tests.factories import make_order

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

SECRET = "whsec_fuzz"
URL = "/webhooks/stripe"
FUZZ = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)
refund_like = st.fixed_dictionaries(
    {},
    optional={
        "id": st.one_of(st.text(max_size=30), st.integers(), st.none()),
        "charge": st.one_of(st.sampled_from(["ch_fuzz", "ch_other", ""]), st.text(max_size=10), st.integers()),
        "amount": st.one_of(st.integers(min_value=-(10**12), max_value=10**12), st.text(max_size=5), st.none()),
        "currency": st.one_of(st.sampled_from(["eur", "usd", "EUR"]), st.text(max_size=4)),
        "status": st.one_of(st.sampled_from(["succeeded", "pending", "failed", "canceled"]), st.text(max_size=8)),
        "metadata": st.one_of(st.dictionaries(st.text(max_size=10), st.text(max_size=30), max_size=2), json_values),
        "refunds": json_values,
    },
)
events = st.fixed_dictionaries(
    {},
    optional={
        "id": st.one_of(st.text(max_size=40), st.integers(), st.none()),
        "type": st.one_of(
            st.sampled_from(["refund.created", "refund.updated", "refund.failed", "charge.refunded", "x"]),
            json_values,
        ),
        "data": st.one_of(st.fixed_dictionaries({"object": refund_like}), json_values),
    },
)


@pytest.fixture
def order(db: Any, settings: Any) -> Order:
    settings.PROVIDER_WEBHOOK_SECRET = SECRET
    order = make_order(captured="100.00")
    Order.objects.filter(pk=order.pk).update(charge_reference="ch_fuzz")
    return order


def rows() -> tuple[int, int, int]:
    return WebhookEvent.objects.count(), OutsideRefund.objects.count(), OrderEvent.objects.count()


@seed(20261201)
@FUZZ
@given(
    body=st.binary(max_size=300),
    # A header travels as latin-1.
    signature=st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=255), max_size=120),
)
def test_unsigned_or_forged_requests_are_refused_with_400_and_write_nothing(
    order: Order, client: Client, body: bytes, signature: str
) -> None:
    before = rows()
    response = client.post(URL, data=body, content_type="application/json", headers={"Stripe-Signature": signature})

    assert response.status_code == 400
    assert rows() == before


@seed(20261201)
@FUZZ
@given(event=events)
@example(event={"id": "evt_nul", "type": "refund.created", "data": {"object": {"id": "re_\x00", "charge": "ch_\x00"}}})
@example(
    event={
        "id": "evt_big",
        "type": "refund.created",
        "data": {
            "object": {"id": "re_big", "charge": "ch_fuzz", "amount": 10**20, "currency": "eur", "status": "succeeded"}
        },
    }
)
def test_signed_events_of_any_shape_never_make_a_server_error(order: Order, client: Client, event: Any) -> None:
    payload = json.dumps(event).encode()
    response = client.post(
        URL,
        data=payload,
        content_type="application/json",
        headers={"Stripe-Signature": sign(payload, SECRET, int(time.time()))},
    )

    assert response.status_code in (200, 400), response.content
    order.refresh_from_db()
    assert order.refundable_amount >= 0
