"""Notifications in a real browser: the bell's count in the navigation, the list it opens, an
item opened (and so marked read) from it; and the same notification in the mail sandbox's inbox,
whose link leads back to the item. Screenshots: artifacts/screenshots/notifications.png,
mail-inbox.png and mail-message.png (docs/img/ has copies of the first two)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from actions.models import Action, Notification
from actions.notifications import notifications_send_due
from actions.services import Actor
from tests.approvals.test_views import propose
from tests.e2e.test_search_and_layout import log_in
from tests.mail import MailSandboxClient

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_bell_opens_the_list_and_an_item_and_the_mail_links_back(
    live_server: Any,
    chromium_page: Callable[[], AbstractContextManager[Page]],
    screenshot_dir: Path,
    mail_sandbox: MailSandboxClient,
    finance: Any,
    agent_actor: Actor,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)
    settings.NOTIFICATION_EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.CONSOLE_BASE_URL = live_server.url
    settings.AUTO_APPROVAL_ENABLED = False
    actions = [propose(agent_actor, amount=amount) for amount in ("24.00", "82.50", "130.00")]
    for index, action in enumerate(actions):
        Action.objects.filter(pk=action.pk).update(
            status="NEEDS_REVIEW", owner=finance, due_at=timezone.now() + timedelta(hours=4 + index)
        )
    notifications_send_due()
    first = actions[0]
    url = live_server.url

    with chromium_page() as page:
        page.set_viewport_size({"width": 1366, "height": 800})
        log_in(page, url, finance)
        bell = page.get_by_test_id("nav-bell")
        expect(bell).to_contain_text("3")
        bell.click()
        page.wait_for_url(f"{url}/notifications/")
        expect(page.get_by_test_id("notification")).to_have_count(3)
        page.screenshot(path=str(screenshot_dir / "notifications.png"))
        item = page.get_by_test_id("notification").filter(has_text="Refund · 24.00 EUR · Order")
        item.get_by_role("button", name="Open").click()
        page.wait_for_url(f"{url}/review/actions/{first.pk}/")
        expect(page.get_by_test_id("nav-bell")).to_contain_text("2")

        page.goto(f"{mail_sandbox.url}/")
        expect(page.get_by_role("heading", name="Inbox")).to_be_visible()
        page.screenshot(path=str(screenshot_dir / "mail-inbox.png"))
        page.get_by_role("link", name="3 item(s) escalated to you").click()
        expect(page.locator("pre")).to_contain_text(f"{url}/review/actions/{first.pk}/")
        page.screenshot(path=str(screenshot_dir / "mail-message.png"), full_page=True)
        page.get_by_role("link", name=f"{url}/review/actions/{first.pk}/").click()
        page.wait_for_url(f"{url}/review/actions/{first.pk}/")

    assert Notification.objects.filter(recipient=finance, read_at__isnull=True).count() == 2
