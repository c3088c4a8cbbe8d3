"""A clerk reads a queue item in her words: what it is, for whom, what the provider said, in a
sentence; the id, the key and the receiver's raw error wait behind "Technical details", where
the id can be copied."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from actions.services import Actor
from tests.actions.test_finance_services import escalated
from tests.e2e.helpers import log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"


def test_a_clerk_reads_a_queue_item_without_ids_or_raw_errors_and_can_copy_the_id(
    live_server: Any,
    chromium_page: Callable[[], AbstractContextManager[Page]],
    finance: Any,
    agent_actor: Actor,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)
    item = escalated(agent_actor, owner=finance)
    order = item.order
    assert order is not None

    with chromium_page() as page:
        page.set_viewport_size({"width": 1366, "height": 900})
        page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live_server.url)
        log_in(page, live_server.url, finance)
        page.goto(f"{live_server.url}/review/")
        row = page.locator(f"#queue-action-{item.pk}")
        expect(row.get_by_test_id("item-title")).to_have_text(f"Refund · Order {order.number}")
        expect(row.get_by_text(item.action_id)).not_to_be_visible()
        expect(row.get_by_text("AmbiguousError", exact=False)).not_to_be_visible()
        expect(row).to_contain_text("we do not know yet whether the refund was made")
        row.get_by_test_id("item-title").click()
        page.wait_for_url(f"{live_server.url}/review/actions/{item.pk}/")
        expect(page.get_by_test_id("action-lede")).to_contain_text(order.customer_name)
        expect(page.get_by_test_id("action-lede")).not_to_contain_text(item.action_id)
        expect(page.get_by_text(item.action_id, exact=True).first).not_to_be_visible()
        page.screenshot(path=str(DOCS_IMG / "queue-item.png"), full_page=False)

        details = page.get_by_test_id("technical-details")
        details.locator("summary").click()
        expect(details.locator(f"#action-id-{item.pk}")).to_be_visible()
        details.get_by_role("button", name="Copy").click()
        expect(details.get_by_role("button", name="Copied")).to_be_visible()
        assert page.evaluate("navigator.clipboard.readText()") == item.action_id
