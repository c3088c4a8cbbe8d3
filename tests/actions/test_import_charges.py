"""manage.py import_charges: orders from the provider's charges, read page by page.

Runs against the real sandbox process over HTTP, through Stripe's own client.
"""

from __future__ import annotations

from decimal import Decimal
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from actions.models import Order
from actions.orders.charges import charges_import
from tests.factories import make_order
from tests.providers.sandbox_client import SandboxClient

pytestmark = [pytest.mark.django_db, pytest.mark.processes]


def seed(sandbox: SandboxClient, charge_id: str, amount: int, *, currency: str = "eur", **metadata: str) -> None:
    sandbox.control("POST", "charges", {"id": charge_id, "amount": amount, "currency": currency, "metadata": metadata})


def run(**options: Any) -> str:
    out = StringIO()
    call_command("import_charges", stdout=out, stderr=StringIO(), **options)
    return out.getvalue()


def test_it_creates_an_order_per_charge_across_pages(live_sandbox: SandboxClient) -> None:
    for n in range(5):
        seed(live_sandbox, f"ch_imp_{n}", 1000 + n, order_number=f"70{n}")
    seed(live_sandbox, "ch_yen", 3000, currency="jpy", order_number="yen-1", customer_name="Kenji")

    summary = run(page_size=2)

    assert "6 charges on 3 pages: 6 orders created" in summary
    order = Order.objects.get(number="703")
    assert order.captured_amount == Decimal("10.03") and order.currency == "EUR"
    assert order.charge_reference == "ch_imp_3" and order.version == 1
    yen = Order.objects.get(number="yen-1")
    assert yen.captured_amount == Decimal("3000") and yen.customer_name == "Kenji"


def test_a_second_run_changes_nothing(live_sandbox: SandboxClient) -> None:
    seed(live_sandbox, "ch_again", 2500, order_number="801")
    run()
    before = list(Order.objects.values_list("number", "version", "captured_amount"))

    summary = run()

    assert "0 orders created, 0 updated, 1 unchanged" in summary
    assert list(Order.objects.values_list("number", "version", "captured_amount")) == before


def test_an_order_the_shop_sent_keeps_its_own_details_and_gains_the_charge(live_sandbox: SandboxClient) -> None:
    order = make_order(number="802", captured="25.00")
    Order.objects.filter(pk=order.pk).update(charge_reference="")
    seed(live_sandbox, "ch_shop", 2500, order_number="802")

    assert "1 updated" in run()

    order.refresh_from_db()
    assert order.charge_reference == "ch_shop"
    assert order.customer_name == "Ada Lovelace"  # the shop's, not the charge's
    assert order.version == 2


def test_charges_without_an_order_number_or_with_a_refused_change_are_skipped_and_reported(
    live_sandbox: SandboxClient,
) -> None:
    seed(live_sandbox, "ch_anon", 1200)
    make_order(number="803", currency="USD", captured="12.00")
    seed(live_sandbox, "ch_803", 1200, order_number="803")  # EUR charge for a USD order
    seed(live_sandbox, "ch_ok", 1200, order_number="804")

    report = charges_import(page_size=10)

    assert report.created == 1
    skipped = dict(report.skipped)
    assert "no order number" in skipped["ch_anon"]
    assert "currency" in skipped["ch_803"]
    assert Order.objects.get(number="803").currency == "USD"


def test_a_provider_that_does_not_answer_is_a_command_error(live_sandbox: SandboxClient, settings: Any) -> None:
    settings.PROVIDER_API_BASE = "http://127.0.0.1:9"  # nothing listens on the discard port

    with pytest.raises(CommandError, match="run the command again"):
        run()
