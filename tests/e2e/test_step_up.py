"""A manager approves above the step-up amount with a TOTP code generated in the test.

Also watches the browser's console: the pages run under the Content-Security-Policy with no
inline script, style or eval, and any violation would show up there.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from decimal import Decimal
from typing import Any

import pytest
from django_otp.oath import totp
from django_otp.plugins.otp_totp.models import TOTPDevice
from playwright.sync_api import Page, expect

from actions.models import Action, ActionStatus
from actions.services import Actor
from approvals.models import Approval
from tests.approvals.test_views import propose
from tests.factories import PASSWORD, make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_manager_approves_a_high_value_refund_after_confirming_a_totp_code(
    live_server: Any,
    chromium_page: Callable[[], AbstractContextManager[Page]],
    agent_actor: Actor,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings.AUTO_APPROVAL_ENABLED = False
    settings.STEP_UP_THRESHOLDS = {"EUR": Decimal("1000")}
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)
    manager = make_user("hedy.manager", "manager", limits={"EUR": "5000"})
    device = TOTPDevice.objects.create(user=manager, name="phone", confirmed=True)
    key, step, t0, digits = device.bin_key, device.step, device.t0, device.digits
    action = propose(agent_actor, amount="1500.00", captured="3000.00", customer_name="Ada Byron")
    detail = f"{live_server.url}/approvals/{action.pk}/"
    csp_violations: list[str] = []

    with chromium_page() as page:
        page.on(
            "console",
            lambda message: csp_violations.append(message.text) if "Content Security Policy" in message.text else None,
        )
        page.goto(f"{live_server.url}/login/")
        page.get_by_label("Username").fill(manager.username)
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url(f"{live_server.url}/")

        # Approving without a fresh code takes the manager to the code page, and back.
        page.goto(detail)
        page.locator(f"#action-{action.pk}").get_by_role("button", name="Approve").click()
        page.wait_for_url(f"{live_server.url}/account/verify/**")
        page.get_by_label("Code").fill(f"{totp(key, step=step, t0=t0, digits=digits):06d}")
        page.get_by_role("button", name="Confirm").click()
        page.wait_for_url(detail)

        row = page.locator(f"#action-{action.pk}")
        row.get_by_role("button", name="Approve").click()
        expect(row).to_have_attribute("data-status", "AUTHORIZED")
        expect(row).to_contain_text("Approved")

    assert Action.objects.get(pk=action.pk).status == ActionStatus.AUTHORIZED
    assert Approval.objects.get(action_id=action.pk).approver == manager
    assert csp_violations == []
