"""An admin saves an agent's change form without touching its scopes: every scope it held is
shown ticked and kept, including those of kinds added after the form was written."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from actions.models import Agent
from tests.e2e.helpers import log_in
from tests.factories import make_agent, make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_admin_saving_an_agent_keeps_its_invoice_adjustment_scope(
    live_server: Any, chromium_page: Callable[[], AbstractContextManager[Page]], console_admin: Any
) -> None:
    owner = make_user("scopes-owner", "manager")
    agent = make_agent(owner=owner, scopes=["refund", "invoice_adjustment"])
    url = live_server.url

    with chromium_page() as page:
        log_in(page, url, console_admin)
        page.goto(f"{url}/admin/actions/agent/{agent.pk}/change/")
        scopes = page.locator('input[name="scopes"]')
        expect(scopes.and_(page.locator('[value="invoice_adjustment"]'))).to_be_checked()
        expect(scopes.and_(page.locator('[value="refund"]'))).to_be_checked()
        page.get_by_label("Name").fill("payables-bot renamed")
        page.get_by_role("button", name="Save", exact=True).click()
        expect(page.locator(".messagelist")).to_contain_text("was changed successfully")

    saved = Agent.objects.get(pk=agent.pk)
    assert saved.name == "payables-bot renamed"
    assert sorted(saved.scopes) == ["invoice_adjustment", "refund"]
