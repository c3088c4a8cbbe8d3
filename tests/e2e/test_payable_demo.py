"""Accounts payable in the demo: alex logs in and finds an invoice adjustment of his own on his
home page, and resolves it with a lookup at the accounting system, as ``seed_demo`` leaves it."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from actions.models import Action, ActionStatus
from harness.management.commands.seed_demo import DEMO_PASSWORD
from tests.e2e.test_crawler import demo_stack  # noqa: F401 (the fixture)

pytestmark = [pytest.mark.browser, pytest.mark.processes, pytest.mark.django_db(transaction=True)]


def test_alex_finds_an_adjustment_of_his_own_at_home_and_resolves_it(
    demo_stack: str,  # noqa: F811
    chromium_page: Callable[[], AbstractContextManager[Page]],
    settings: Any,
) -> None:
    url = demo_stack
    # A resolution waits for the last send's lease to pass; the demo was seeded a moment ago.
    settings.LEASE_SECONDS = 0
    [review] = Action.objects.filter(kind="invoice-adjustment", status=ActionStatus.NEEDS_REVIEW)

    with chromium_page() as page:
        page.goto(f"{url}/login/")
        page.get_by_label("Username").fill("alex")
        page.get_by_label("Password").fill(DEMO_PASSWORD)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url(f"{url}/")
        mine = page.get_by_test_id("payable-mine")
        expect(mine.locator(".tile__number")).to_have_text("1")
        mine.click()
        page.wait_for_url(f"{url}/review/?mine=1")
        row = page.locator(f"#queue-action-{review.pk}")
        expect(row).to_contain_text("Bill INV-2297")
        row.get_by_test_id("item-title").click()
        page.wait_for_url(f"{url}/review/actions/{review.pk}/")
        page.get_by_role("button", name="Look up at the provider now").click()
        expect(page.get_by_test_id("lookup-summary")).to_contain_text("Lookup found credit note")
        form = page.locator("#resolve-succeeded")
        form.get_by_label("Reason").fill("The lookup found the credit note the accounting system saved.")
        form.get_by_role("button", name="Record as succeeded").click()
        expect(page.get_by_test_id("action-status")).to_have_text("Succeeded")

    review.refresh_from_db()
    assert review.status == ActionStatus.SUCCEEDED and review.owner is not None
    assert review.owner.username == "alex"
