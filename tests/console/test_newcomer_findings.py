"""What a newcomer met in the demo: the favicon, the demo's 404 page, money written with its
currency's places everywhere, accounts payable's own badge and home page, the seeded ticket the
README searches for, the order page's paid time said once, the account page's form controls."""

from __future__ import annotations

from decimal import Decimal
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client

from actions.models import RefundRequest
from actions.orders.selectors import CustomerSummary
from actions.providers.money import money_text
from tests.factories import PASSWORD, make_order, make_user

pytestmark = pytest.mark.django_db


def _client(user: Any) -> Client:
    client = Client()
    assert client.login(username=user.username, password=PASSWORD)
    return client


def test_favicon_ico_leads_to_the_consoles_icon() -> None:
    answer = Client().get("/favicon.ico")
    assert answer.status_code == 301
    assert answer["Location"].endswith("console/favicon.svg")


@pytest.mark.parametrize(
    ("amount", "currency", "text"),
    [
        (Decimal("82.5"), "EUR", "82.50 EUR"),
        (82.5, "EUR", "82.50 EUR"),
        (Decimal("12800"), "JPY", "12,800 JPY"),
        (Decimal("1.5"), "KWD", "1.500 KWD"),
        ("x", "EUR", "x EUR"),
    ],
)
def test_money_is_written_with_its_currencys_places(amount: Any, currency: str, text: str) -> None:
    assert money_text(amount, currency) == text


def test_the_customers_history_writes_money_with_two_decimals() -> None:
    history = CustomerSummary(
        name="Ada",
        email="",
        orders=2,
        refunds_in_window=1,
        refunded_in_window=[("EUR", Decimal("82.5"))],
        window_days=90,
    )
    assert "(82.50 EUR)" in history.sentence


def test_the_order_page_says_when_it_was_paid_once(manager: Any) -> None:
    order = make_order(captured="82.50")
    page = _client(manager).get(f"/orders/{order.pk}").content.decode()
    lede = page.split('class="lede"', 1)[1].split("</p>", 1)[0]
    assert lede.count("abs-time") == 1 and lede.count("paid") == 1


def test_accounts_payable_wears_its_own_badge_and_sees_adjustments_and_bills() -> None:
    alex = make_user("alex.payable", "accounts payable")
    page = _client(alex).get("/").content.decode()
    header = page.split("</header>", 1)[0]
    assert '<span class="role">accounts payable</span>' in header
    assert '<span class="role">finance</span>' not in header
    assert 'data-testid="payable-summary"' in page and "Invoice adjustments and bills" in page
    assert "refunds that failed for good get a remedy" not in page


def test_finance_keeps_the_refunds_home_page(finance: Any) -> None:
    page = _client(finance).get("/").content.decode()
    assert '<span class="role">finance</span>' in page
    assert 'data-testid="payable-summary"' not in page and 'id="finance-heading"' in page


@pytest.fixture
def demo_profile(settings: Any) -> Any:
    """DEBUG on and the demo's 404 installed, as console/settings.py does when `make start` sets
    DEMO_FRIENDLY_404."""
    settings.DEBUG = True
    settings.MIDDLEWARE = [
        *settings.MIDDLEWARE[:-1],
        "console.middleware.FriendlyNotFoundMiddleware",
        settings.MIDDLEWARE[-1],
    ]
    return None


def test_the_demos_404_is_the_consoles_own_page_not_the_list_of_url_patterns(demo_profile: None, finance: Any) -> None:
    for client in (Client(), _client(finance)):
        answer = client.get("/no-such-page/")
        assert answer.status_code == 404
        text = answer.content.decode()
        assert "There is nothing at this address" in text
        assert "Django tried these URL patterns" not in text
    # A 404 raised by a view (an order that does not exist) too.
    missing = _client(finance).get("/orders/999999")
    assert missing.status_code == 404 and "There is nothing at this address" in missing.content.decode()


def test_without_the_demo_profile_debug_keeps_djangos_page(settings: Any) -> None:
    settings.DEBUG = True
    assert "Django tried these URL patterns" in Client().get("/no-such-page/").content.decode()


def test_the_seeded_ticket_of_the_readme_is_the_requests_reference(settings: Any) -> None:
    settings.DEBUG = True
    settings.ACCOUNTING_API_BASE = ""
    call_command("seed_demo", "--sandbox", "http://127.0.0.1:9", stdout=StringIO(), stderr=StringIO())
    assert RefundRequest.objects.filter(external_reference="T-1001", order__number="4821").exists()
