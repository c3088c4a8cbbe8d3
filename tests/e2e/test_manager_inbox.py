"""A manager works the inbox in a real browser: log in, approve one proposal, reject another.

The decisions are posted by htmx and each row is replaced in place: the page is never reloaded.
A marker set on ``window`` before the clicks would be lost by any navigation.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from playwright.sync_api import Page, expect

from actions.models import Action, ActionStatus
from actions.services import Actor
from approvals.models import Approval
from approvals.services import approval_decide
from tests.approvals.test_views import make_stale, order_of, propose
from tests.factories import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

S = ActionStatus


def as_someone_else(work: Callable[[], object]) -> None:
    """Run database work on another thread while the browser is open, as another person would.

    The browser's event loop runs on the test's thread, where Django refuses queries (see
    conftest.py); a thread of its own has no loop.
    """
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as error:
            errors.append(error)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive(), "the other person's work did not finish"
    if errors:
        raise errors[0]


def test_a_manager_approves_and_rejects_proposals_in_the_inbox_without_a_page_reload(
    live_server: Any,
    chromium_page: Callable[[], AbstractContextManager[Page]],
    screenshot_dir: Path,
    manager: Any,
    second_manager: Any,
    agent_actor: Actor,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Seeded proposals must wait for a person instead of being approved by policy.
    settings.AUTO_APPROVAL_ENABLED = False
    # A short undo window, so the rejection commits within the test; no broker here: the card's
    # own poll commits it once the window has passed.
    settings.REJECTION_UNDO_SECONDS = 1
    settings.LIVE_POLL_SECONDS = 1
    monkeypatch.setattr("actions.foundation.publish.rejection_commit_enqueue", lambda pk, countdown: None)
    published: list[int] = []
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", published.append)
    to_approve = propose(
        agent_actor,
        amount="120.00",
        customer_name="Grace Hopper",
        evidence="Customer sent photos of the crushed parcel (ticket 4411). Carrier confirmed the damage.",
    )
    to_reject = propose(
        agent_actor,
        amount="75.50",
        customer_name="Alan Turing",
        evidence="Customer says the item is not as described; no photos yet.",
    )
    over_limit = propose(agent_actor, amount="900.00", customer_name="Katherine Johnson")
    taken = propose(agent_actor, amount="45.00", customer_name="Barbara Liskov")
    stale = make_stale(propose(agent_actor, amount="60.00", customer_name="Edsger Dijkstra"), approver=second_manager)
    approved_order_number = order_of(to_approve).number
    published.clear()

    with chromium_page() as page:
        page.goto(f"{live_server.url}/login/")
        page.get_by_label("Username").fill(manager.username)
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url(f"{live_server.url}/")
        page.get_by_role("link", name="Approvals", exact=True).click()
        page.wait_for_url(f"{live_server.url}/approvals/")
        expect(page.locator(f"#action-{over_limit.pk}").get_by_role("button", name="Approve")).to_be_disabled()
        expect(page.locator(f"#action-{stale.pk}")).to_contain_text("The order changed after the approval")
        page.screenshot(path=str(screenshot_dir / "manager-inbox-before.png"), full_page=True)
        page.evaluate("window.consoleTestMarker = 'no reload'")

        approve_row = page.locator(f"#action-{to_approve.pk}")
        approve_row.get_by_label("Note for the audit trail").fill("Photos check out.")
        approve_row.get_by_role("button", name="Approve").click()
        expect(approve_row).to_have_attribute("data-status", "AUTHORIZED")
        expect(approve_row).to_contain_text("Approved: Refund · 120.00 EUR · Order")

        reject_row = page.locator(f"#action-{to_reject.pk}")
        reject_row.get_by_label("Note for the audit trail").fill("Ask the customer for photos first.")
        reject_row.get_by_label("Reason, if you reject").select_option("not_enough_evidence")
        reject_row.get_by_role("button", name="Reject").click()
        expect(reject_row).to_contain_text("(not enough evidence). It takes effect in")
        expect(reject_row.get_by_role("button", name="Undo the rejection")).to_be_visible()
        # The undo window passes; the card, following the action, shows it rejected.
        expect(reject_row).to_have_attribute("data-status", "REJECTED")
        expect(reject_row).to_contain_text("Rejected. Nothing was sent.")

        # Another manager rejects a proposal while this page still offers to approve it: the
        # click is refused with a 409 and the row shows why, in place.
        as_someone_else(
            lambda: approval_decide(action_pk=taken.pk, user=second_manager, decision="reject", note="Duplicate.")
        )
        taken_row = page.locator(f"#action-{taken.pk}")
        taken_row.get_by_role("button", name="Approve").click()
        expect(taken_row).to_have_attribute("data-status", "REJECTED")
        expect(taken_row).to_contain_text("Not done.")
        expect(taken_row).to_contain_text("no longer waiting for a decision")

        assert page.evaluate("window.consoleTestMarker") == "no reload"
        assert page.url == f"{live_server.url}/approvals/"
        # The other rows were left as they were.
        expect(page.locator(f"#action-{over_limit.pk}")).to_have_attribute("data-status", "PROPOSED")
        page.screenshot(path=str(screenshot_dir / "manager-inbox.png"), full_page=True)

        # The approved proposal's page shows the decision and its audit trail.
        # "Order N" opens the order page; the request's own link opens the proposal.
        expect(approve_row.get_by_role("link", name=f"Order {approved_order_number}")).to_have_attribute(
            "href", re.compile(r"^/orders/\d+$")
        )
        approve_row.get_by_role("link", name=re.compile(r"^refund request \d+$")).click()
        page.wait_for_url(f"{live_server.url}/approvals/{to_approve.pk}/")
        expect(page.locator("#trail-heading + .trail")).to_contain_text("Photos check out.")
        expect(page.locator(f"#outcome-{to_approve.pk}")).to_contain_text("Approved")
        page.screenshot(path=str(screenshot_dir / "manager-detail.png"), full_page=True)

    assert Action.objects.get(pk=to_approve.pk).status == S.AUTHORIZED
    assert Approval.objects.get(action_id=to_approve.pk).note == "Photos check out."
    assert Action.objects.get(pk=to_reject.pk).status == S.REJECTED
    assert Action.objects.get(pk=over_limit.pk).status == S.PROPOSED
    assert list(Approval.objects.filter(action_id=taken.pk).values_list("approver__username", "decision")) == [
        (second_manager.username, "reject")
    ]
    assert published == [to_approve.pk]
    assert (screenshot_dir / "manager-inbox.png").stat().st_size > 10_000
