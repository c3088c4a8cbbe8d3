"""A manager approves in a real browser and sees the outcome arrive without reloading.

The worker is played by a thread started when the approval commits (the publish hook), which runs
the engine's dispatch against the live sandbox provider, as a Celery worker would. The page only
polls; a marker set on ``window`` before the clicks would be lost by any navigation.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from playwright.sync_api import Page, expect

from actions.engine.dispatch import execution_dispatch
from actions.models import Action, ActionEvent, ActionStatus, Order
from actions.providers.money import to_minor_units
from actions.services import Actor
from approvals.models import Approval
from approvals.services import approval_decide
from tests.approvals.test_views import propose
from tests.e2e.test_manager_inbox import as_someone_else
from tests.factories import PASSWORD, make_order
from tests.providers.sandbox_client import SandboxClient

pytestmark = [pytest.mark.browser, pytest.mark.processes, pytest.mark.django_db(transaction=True)]

S = ActionStatus


@pytest.fixture
def worker(monkeypatch: pytest.MonkeyPatch) -> list[threading.Thread]:
    """Each published dispatch runs in a thread of its own, as a worker would take it."""
    threads: list[threading.Thread] = []

    def run(pk: int) -> None:
        try:
            execution_dispatch(action_pk=pk)
        finally:
            connection.close()

    def enqueue(pk: int) -> None:
        thread = threading.Thread(target=run, args=(pk,), daemon=True)
        threads.append(thread)
        thread.start()

    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", enqueue)
    return threads


@pytest.fixture(autouse=True)
def quick(settings: Any) -> None:
    settings.AUTO_APPROVAL_ENABLED = False
    settings.LIVE_POLL_SECONDS = 1


def log_in(page: Page, url: str, user: Any) -> None:
    page.goto(f"{url}/login/")
    page.get_by_label("Username").fill(user.username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{url}/")


def test_a_manager_approves_and_sees_succeeded_without_reloading(
    live_server: Any,
    chromium_page: Callable[[], AbstractContextManager[Page]],
    screenshot_dir: Path,
    live_sandbox: SandboxClient,
    manager: Any,
    agent_actor: Actor,
    worker: list[threading.Thread],
) -> None:
    action = propose(agent_actor, amount="45.00", customer_name="Grace Hopper")
    order = Order.objects.get(actions=action)
    live_sandbox.seed_charge(order.charge_reference, to_minor_units(order.captured_amount, "EUR"), "eur")

    with chromium_page() as page:
        log_in(page, live_server.url, manager)
        page.goto(f"{live_server.url}/approvals/")
        page.evaluate("window.consoleTestMarker = 'no reload'")
        card = page.locator(f"#action-{action.pk}")
        card.get_by_role("button", name="Approve").click()
        expect(card).to_contain_text("Approved: Refund · 45.00 EUR · Order")
        # The card follows the action by itself until the provider's answer is recorded.
        expect(card).to_have_attribute("data-status", "SUCCEEDED")
        expect(card.get_by_test_id("status-badge")).to_have_text("Succeeded")
        expect(card.get_by_test_id("outcome")).to_contain_text("Succeeded: re_")
        expect(page.locator("#toasts")).to_contain_text("Refund · 45.00 EUR · Order")
        assert page.evaluate("window.consoleTestMarker") == "no reload"
        page.screenshot(path=str(screenshot_dir / "manager-live-outcome.png"), full_page=True)

        # The detail page's timeline: approved -> sent -> succeeded re_...
        page.goto(f"{live_server.url}/approvals/{action.pk}/")
        timeline = page.locator(f"#outcome-{action.pk}")
        expect(timeline).to_contain_text("Approved")
        expect(timeline).to_contain_text("Sent to the provider")
        expect(timeline).to_contain_text("Succeeded · re_")

        # And the Decided tab lists it with its outcome.
        page.goto(f"{live_server.url}/approvals/decided/?today=1")
        expect(page.get_by_test_id("decided-table")).to_contain_text(action.action_id)
        expect(page.get_by_test_id("decided-table")).to_contain_text("Succeeded")

    for thread in worker:
        thread.join(timeout=10)
    fresh = Action.objects.get(pk=action.pk)
    assert fresh.status == S.SUCCEEDED and fresh.provider_reference.startswith("re_")


def test_two_refunds_on_one_order_approved_together_both_succeed_and_neither_goes_stale(
    live_server: Any,
    chromium_page: Callable[[], AbstractContextManager[Page]],
    screenshot_dir: Path,
    live_sandbox: SandboxClient,
    manager: Any,
    agent_actor: Actor,
    worker: list[threading.Thread],
) -> None:
    order = make_order(captured="310.00", customer_name="Ada Lovelace")
    first = propose(agent_actor, amount="40.00", order=order)
    second = propose(agent_actor, amount="60.00", order=order)
    live_sandbox.seed_charge(order.charge_reference, 31000, "eur")

    with chromium_page() as page:
        log_in(page, live_server.url, manager)
        page.goto(f"{live_server.url}/approvals/")
        page.evaluate("window.consoleTestMarker = 'no reload'")
        group = page.locator(f"#group-order-{order.pk}")
        expect(group.get_by_test_id("group-summary")).to_contain_text("pending 100.00 EUR")
        expect(group.get_by_test_id("group-summary")).to_contain_text("refundable 310.00 EUR")
        for action in (first, second):
            page.locator(f"#action-{action.pk}").get_by_label("Approve together").check()
        group.get_by_role("button", name="Approve the ticked proposals together").click()
        group = page.locator(f"#group-order-{order.pk}")
        expect(group.get_by_test_id("group-notice")).to_contain_text("Approved 2 proposals together for 100.00 EUR")
        for action in (first, second):
            expect(page.locator(f"#action-{action.pk}")).to_have_attribute("data-status", "SUCCEEDED")
        assert page.evaluate("window.consoleTestMarker") == "no reload"
        page.screenshot(path=str(screenshot_dir / "manager-grouped-approval.png"), full_page=True)

    for thread in worker:
        thread.join(timeout=10)
    assert set(Action.objects.filter(pk__in=[first.pk, second.pk]).values_list("status", flat=True)) == {S.SUCCEEDED}
    assert not ActionEvent.objects.filter(action__in=[first, second], transition="invalidate").exists()
    [group_id] = set(Approval.objects.filter(action__in=[first, second]).values_list("group_id", flat=True))
    assert group_id is not None
    order.refresh_from_db()
    assert order.refunded_amount == Decimal("100.00") and order.reserved_amount == Decimal("0.00")


def test_when_the_cards_outcomes_are_final_the_orders_money_and_the_badge_follow_without_a_reload(
    live_server: Any,
    chromium_page: Callable[[], AbstractContextManager[Page]],
    live_sandbox: SandboxClient,
    manager: Any,
    agent_actor: Actor,
    worker: list[threading.Thread],
) -> None:
    order = make_order(captured="90.00", customer_name="Adele Goldberg")
    first = propose(agent_actor, amount="30.00", order=order)
    second = propose(agent_actor, amount="40.00", order=order)
    live_sandbox.seed_charge(order.charge_reference, 9000, "eur")

    with chromium_page() as page:
        log_in(page, live_server.url, manager)
        page.goto(f"{live_server.url}/approvals/")
        page.evaluate("window.consoleTestMarker = 'no reload'")
        summary = page.locator(f"#group-summary-order-{order.pk}")
        expect(summary).to_contain_text("Refunded 0.00 EUR")
        expect(page.get_by_test_id("nav-waiting")).to_contain_text("2")
        for action in (first, second):
            page.locator(f"#action-{action.pk}").get_by_label("Approve together").check()
        page.get_by_role("button", name="Approve the ticked proposals together").click()
        for action in (first, second):
            expect(page.locator(f"#action-{action.pk}")).to_have_attribute("data-status", "SUCCEEDED")
        # Both refunds are made: the order's money line and the count follow by themselves.
        expect(summary).to_contain_text("Refunded 70.00 EUR")
        expect(summary).to_contain_text("refundable 20.00 EUR")
        expect(page.get_by_test_id("nav-waiting")).to_have_count(0)
        assert page.evaluate("window.consoleTestMarker") == "no reload"

    for thread in worker:
        thread.join(timeout=10)
    order.refresh_from_db()
    assert order.refunded_amount == Decimal("70.00")


def _ledger(page: Page, label: str) -> Any:
    """The order page's money for ``label`` ("Refunded", not "Refunded outside the console")."""
    term = page.locator("dt", has_text=re.compile(f"^{label}$"))
    return page.get_by_test_id("order-money").locator("div").filter(has=term).locator("dd")


def test_the_order_pages_money_follows_a_refunds_outcome_without_a_reload(
    live_server: Any,
    chromium_page: Callable[[], AbstractContextManager[Page]],
    live_sandbox: SandboxClient,
    manager: Any,
    agent_actor: Actor,
    worker: list[threading.Thread],
) -> None:
    order = make_order(captured="100.00", customer_name="Ken Thompson")
    action = propose(agent_actor, amount="45.00", order=order)
    live_sandbox.seed_charge(order.charge_reference, 10000, "eur")

    with chromium_page() as page:
        log_in(page, live_server.url, manager)
        page.goto(f"{live_server.url}/orders/{order.pk}")
        page.evaluate("window.consoleTestMarker = 'no reload'")
        expect(_ledger(page, "Refunded")).to_have_text("0.00 EUR")
        expect(_ledger(page, "Refundable")).to_have_text("100.00 EUR")
        expect(page.get_by_test_id("order-follows")).to_be_visible()

        # Approved elsewhere (another tab, another manager's inbox); the worker sends it.
        as_someone_else(lambda: approval_decide(action_pk=action.pk, user=manager, decision="approve"))

        expect(_ledger(page, "Refunded")).to_have_text("45.00 EUR")
        expect(_ledger(page, "Refundable")).to_have_text("55.00 EUR")
        row = page.get_by_test_id("order-actions").locator(f"tr[data-action-id='{action.action_id}']")
        expect(row).to_contain_text("Succeeded")
        # Every action on the order is final: the page stops following it.
        expect(page.get_by_test_id("order-follows")).to_have_count(0)
        assert page.evaluate("window.consoleTestMarker") == "no reload"

    for thread in worker:
        thread.join(timeout=10)
    order.refresh_from_db()
    assert order.refunded_amount == Decimal("45.00")
