"""The shop sends one order several times at once, and changes an order while a worker reserves.

PostgreSQL, one connection per thread. The order number is UNIQUE, so concurrent first sends
make one order; an update applies only at the version it read, so it never overwrites a
reservation made in between and never leaves refunded + reserved above captured (invariant 5).
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db.models import F
from django.utils import timezone

import actions.orders.services
from actions.models import Order
from actions.orders.services import OrderConflict, OrderData, OrderResult, order_upsert
from tests.threads import run_at_once

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

SENDERS = 6


def order_data(**overrides: Any) -> OrderData:
    values: dict[str, Any] = {
        "number": "race-1",
        "customer_name": "Ada Lovelace",
        "customer_email": "",
        "currency": "EUR",
        "captured_amount": Decimal("100.00"),
        "charge_reference": "ch_race_1",
        "paid_at": timezone.now() - timedelta(days=1),
    }
    values.update(overrides)
    return OrderData(**values)


def test_concurrent_first_sends_of_one_order_create_it_once() -> None:
    data = order_data()

    results: list[OrderResult] = run_at_once(*[lambda: order_upsert(data=data, source="test")] * SENDERS)

    assert sum(result.created for result in results) == 1
    assert Order.objects.filter(number="race-1").count() == 1
    assert {result.order.pk for result in results} == {results[0].order.pk}
    assert Order.objects.get(number="race-1").version == 1


def test_a_change_read_before_a_reservation_is_decided_again_after_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant 5. The shop lowers the captured amount to 60 while a worker reserves 70: the
    update read the order before the reservation, so its conditional UPDATE changes no row; it
    reads again and refuses, naming the field. The reservation stands."""
    order_upsert(data=order_data(), source="test")
    real_refuse = actions.orders.services._refuse
    reserved: list[int] = []

    def reserve_in_between(order: Order, changes: dict[str, Any]) -> None:
        # The first time through: a worker's reservation commits between the read and the write.
        if not reserved:
            reserved.append(
                Order.objects.filter(pk=order.pk).update(
                    reserved_amount=F("reserved_amount") + Decimal("70.00"), version=F("version") + 1
                )
            )
        real_refuse(order, changes)

    monkeypatch.setattr(actions.orders.services, "_refuse", reserve_in_between)

    with pytest.raises(OrderConflict) as refused:
        order_upsert(data=order_data(captured_amount=Decimal("60.00")), source="test")

    assert refused.value.field == "captured_amount"
    order = Order.objects.get(number="race-1")
    assert (order.captured_amount, order.reserved_amount, order.version) == (Decimal("100.00"), Decimal("70.00"), 2)
