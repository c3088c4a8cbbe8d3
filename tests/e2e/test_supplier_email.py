"""A supplier email in a real browser: the manager reads the message exactly as it
will be sent and approves it; the relay stores it and drops the connection; finance confirms
the delivery with the supplier's reply as evidence."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from actions.engine.dispatch import execution_dispatch
from actions.kinds.supplier_email.proposal import supplier_email_propose
from actions.models import Action, ActionEvent, ActionStatus
from tests.e2e.test_manager_inbox import as_someone_else
from tests.factories import PASSWORD
from tests.mail import BILL_PARAMETERS, MailSandboxClient

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

S = ActionStatus


def _log_in(page: Page, url: str, user: Any) -> None:
    page.goto(f"{url}/login/")
    page.get_by_label("Username").fill(user.username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{url}/")


def test_a_manager_approves_the_previewed_message_and_finance_confirms_an_ambiguous_send(
    live_server: Any,
    chromium_page: Callable[[], AbstractContextManager[Page]],
    screenshot_dir: Path,
    mail_sandbox: MailSandboxClient,
    supplier: Any,
    manager: Any,
    finance: Any,
    agent_actor: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Invariants 2 and 16 end to end: what the manager read is what the relay received; the
    ambiguous send is held for finance, never resent, and recorded once with the evidence."""
    # The test sends by hand, after the approval, so that the relay's fault applies to it.
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)
    parameters = {**BILL_PARAMETERS, "reason": "Two pallets <b>damaged</b> & one missing."}
    action = supplier_email_propose(
        supplier="ACME",
        reference="bill-BL-1042",
        template="bill_adjusted",
        parameters=parameters,
        to="ap@acme.example",
        proposer=agent_actor,
    ).action
    url = live_server.url

    with chromium_page() as page:
        _log_in(page, url, manager)
        page.goto(f"{url}/approvals/")
        row = page.locator(f"#action-{action.pk}")
        expect(row.get_by_test_id("message-subject")).to_have_text("Bill BL-1042: adjusted by 120.00 EUR")
        # Escaped: the agent's angle brackets are text, not markup.
        expect(row.get_by_test_id("message-body")).to_contain_text("Two pallets <b>damaged</b> & one missing.")
        expect(row.locator("b")).to_have_count(0)
        page.screenshot(path=str(screenshot_dir / "email-preview.png"), full_page=True)
        row.get_by_role("button", name="Approve").click()
        expect(page.locator(f"#action-{action.pk}")).to_have_attribute("data-status", "AUTHORIZED")

    mail_sandbox.fault(mode="drop_after_data", count=1)
    outcome: list[str] = []
    as_someone_else(lambda: outcome.append(execution_dispatch(action_pk=action.pk)))
    assert outcome == [S.NEEDS_REVIEW]
    [message] = mail_sandbox.messages(action.action_id)
    assert message["body"] == action.payload["body"] and message["subject"] == action.payload["subject"]

    with chromium_page() as page:
        _log_in(page, url, finance)
        page.goto(f"{url}/review/actions/{action.pk}/")
        expect(page.get_by_test_id("action-status")).to_have_text("Needs review")
        expect(page.get_by_test_id("cannot-be-asked")).to_be_visible()
        form = page.locator("#resolve-succeeded")
        form.get_by_label("Evidence").fill("Reply from ap@acme.example, 10:42: 'Thanks, noted the adjustment.'")
        form.get_by_label("Reason").fill("The supplier answered the message.")
        page.screenshot(path=str(screenshot_dir / "email-review.png"), full_page=True)
        form.get_by_role("button", name="Confirm delivered").click()
        expect(page.get_by_test_id("action-status")).to_have_text("Succeeded")

    done = Action.objects.get(pk=action.pk)
    assert done.status == S.SUCCEEDED
    event = ActionEvent.objects.filter(action=done).latest("pk")
    assert (event.transition, event.actor_user) == ("resolve_succeeded", finance)
    assert "Thanks, noted" in event.evidence["evidence"]
    assert len(mail_sandbox.messages(action.action_id)) == 1, "never resent"
