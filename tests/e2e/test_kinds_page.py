"""Finance opens the five checks of every kind in a real browser, from the navigation."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from actions.models import LedgerAuditRun
from tests.factories import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_finance_reads_the_five_checks_of_each_kind(
    live_server: Any, chromium_page: Callable[[], AbstractContextManager[Page]], screenshot_dir: Path, finance: Any
) -> None:
    LedgerAuditRun.objects.create(started_at=timezone.now(), finished_at=timezone.now())
    url = live_server.url
    with chromium_page() as page:
        page.set_viewport_size({"width": 1366, "height": 900})
        page.goto(f"{url}/login/")
        page.get_by_label("Username").fill(finance.username)
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url(f"{url}/")
        page.get_by_role("link", name="Kinds", exact=True).click()
        page.wait_for_url(f"{url}/kinds/")

        refund = page.locator("#kind-refund")
        expect(refund.locator("[data-check]")).to_have_count(5)
        expect(refund.locator('[data-ok="no"]')).to_have_count(0)
        compensation = page.locator("#kind-compensation")
        expect(compensation.locator('[data-ok="no"]')).to_have_count(3)
        expect(compensation).to_contain_text("never resent automatically")
        page.screenshot(path=str(screenshot_dir / "kinds.png"), full_page=True)
