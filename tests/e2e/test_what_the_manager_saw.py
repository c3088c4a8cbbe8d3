"""What the manager saw is what she approves, in a real browser.

She opens a proposal. Meanwhile another refund on the same order goes ahead. Her click on
Approve is refused in place: the card says what changed and offers to reload. After the reload
she sees the order as it is, and her approval of that goes through.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from actions.engine.claim import ClaimOutcome, submission_begin
from actions.models import Action, ActionStatus, Order
from actions.services import Actor
from approvals.models import Approval
from approvals.services import approval_decide
from tests.approvals.test_views import propose
from tests.e2e.test_manager_inbox import as_someone_else
from tests.factories import PASSWORD, make_order

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

S = ActionStatus


def test_a_manager_approving_an_order_that_changed_meanwhile_is_told_what_changed_and_approves_after_a_reload(
    live_server: Any,
    chromium_page: Callable[[], AbstractContextManager[Page]],
    screenshot_dir: Path,
    manager: Any,
    second_manager: Any,
    agent_actor: Actor,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings.AUTO_APPROVAL_ENABLED = False
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)
    order = make_order(captured="300.00", customer_name="Grace Hopper")
    action = propose(agent_actor, amount="50.00", order=order)
    other = propose(agent_actor, amount="20.00", order=order)
    detail = f"{live_server.url}/approvals/{action.pk}/"

    def another_refund_goes_ahead() -> None:
        approval_decide(action_pk=other.pk, user=second_manager, decision="approve")
        assert submission_begin(action_pk=other.pk).outcome == ClaimOutcome.CLAIMED

    with chromium_page() as page:
        page.goto(f"{live_server.url}/login/")
        page.get_by_label("Username").fill(manager.username)
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url(f"{live_server.url}/")

        page.goto(detail)
        money = page.locator(".order-money")
        expect(money).to_contain_text("300.00 EUR")
        card = page.locator(f"#action-{action.pk}")

        # While her page is open, another manager's refund on the same order goes ahead.
        as_someone_else(another_refund_goes_ahead)

        card.get_by_role("button", name="Approve").click()
        expect(card).to_contain_text(
            "The order changed since you opened this page: another refund of 20.00 EUR went ahead."
        )
        expect(card).to_contain_text("It now has 280.00 EUR left to refund.")
        expect(card).to_have_attribute("data-status", "PROPOSED")
        expect(card.get_by_role("button", name="Approve")).to_have_count(0)
        page.screenshot(path=str(screenshot_dir / "approval-changed-since-shown.png"), full_page=True)

        card.get_by_role("link", name="Reload the page to see it as it is now").click()
        page.wait_for_url(detail)
        expect(money).to_contain_text("280.00 EUR")
        card.get_by_role("button", name="Approve").click()
        expect(card).to_have_attribute("data-status", "AUTHORIZED")
        expect(card).to_contain_text("Approved: Refund · 50.00 EUR · Order")

    assert Action.objects.get(pk=action.pk).status == S.AUTHORIZED
    approval = Approval.objects.get(action_id=action.pk)
    # Bound to the order as she saw it after the reload: after the other refund's reservation.
    assert approval.order_version == Order.objects.get(pk=order.pk).version
    assert approval.approver == manager
