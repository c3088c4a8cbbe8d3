"""A refusal stays inside the page in DEBUG too.

With DEBUG on, django-htmx's debug script replaces the whole document with any 400 or 403
answer to an htmx request, to show Django's error pages. A refusal is not an error: the card
that says why must be swapped in place and the rest of the page must stay.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from actions.models import Action, ActionStatus
from actions.services import Actor
from tests.approvals.test_views import propose
from tests.e2e.helpers import log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_rejection_without_a_reason_is_refused_inside_the_card_with_debug_on(
    live_server: Any,
    chromium_page: Callable[[], AbstractContextManager[Page]],
    manager: Any,
    agent_actor: Actor,
    settings: Any,
) -> None:
    settings.DEBUG = True
    settings.AUTO_APPROVAL_ENABLED = False
    action = propose(agent_actor, amount="45.00")

    with chromium_page() as page:
        log_in(page, live_server.url, manager)
        page.goto(f"{live_server.url}/approvals/{action.pk}/")
        # The debug script is on the page: without it this test would prove nothing.
        expect(page.locator('script[src*="django-htmx.js"]')).to_have_count(1)
        card = page.locator(f"#action-{action.pk}")
        card.get_by_role("button", name="Reject").click()
        expect(card).to_contain_text("Choose a reason for the rejection.")
        # The page around the card is still there.
        expect(page.get_by_role("navigation", name="Main")).to_be_visible()
        expect(page.locator(".order-money")).to_be_visible()

    assert Action.objects.get(pk=action.pk).status == ActionStatus.PROPOSED
