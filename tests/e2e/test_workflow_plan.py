"""A workflow in a real browser: a manager reads a po_mismatch_resolution plan step by
step (kind, receiver, step class, compensation, the email, the money), approves it on one page,
and watches the workflow complete on its timeline."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from actions.models import Workflow, WorkflowState
from actions.workflows.services import workflow_propose
from tests.factories import PASSWORD
from tests.workflows.conftest import World, po_parameters, world  # noqa: F401 (the fixture)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _log_in(page: Page, url: str, user: Any) -> None:
    page.goto(f"{url}/login/")
    page.get_by_label("Username").fill(user.username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{url}/")


def test_a_manager_approves_a_po_mismatch_plan_and_watches_it_complete(
    live_server: Any,
    chromium_page: Callable[[], AbstractContextManager[Page]],
    screenshot_dir: Path,
    world: World,  # noqa: F811
    manager: Any,
    agent_actor: Any,
) -> None:
    workflow = workflow_propose(
        template="po_mismatch_resolution", parameters=po_parameters(), proposer=agent_actor
    ).workflow
    url = live_server.url

    with chromium_page() as page:
        _log_in(page, url, manager)
        page.goto(f"{url}/approvals/workflows/")
        page.get_by_role("link", name="Resolve a purchase-order mismatch").click()
        steps = page.get_by_test_id("plan-steps")
        expect(steps.locator("li")).to_have_count(3)
        post = page.get_by_test_id("plan-step-post_credit_note")
        expect(post.get_by_test_id("step-class")).to_have_text("create")
        expect(post.get_by_test_id("compensation")).to_contain_text("Credit note void")
        expect(post).to_contain_text("20.00 EUR")
        email = page.get_by_test_id("plan-step-email_supplier")
        expect(email.get_by_test_id("step-class")).to_have_text("irreversible")
        expect(email.get_by_test_id("email-preview")).to_contain_text("We have adjusted your bill INV-42 by 20.00 EUR")
        expect(page.get_by_test_id("plan-step-read_documents").get_by_test_id("step-class")).to_have_text("read")
        page.screenshot(path=str(screenshot_dir / "workflow-plan.png"), full_page=True)
        page.get_by_role("button", name="Approve the plan").click()
        expect(page.get_by_test_id("workflow-state")).to_have_text("Authorized")

    # The workers' part, in this process: the coordinator and the engine run the plan.
    assert world.run(workflow.workflow_id) == WorkflowState.COMPLETED

    with chromium_page() as page:
        _log_in(page, url, manager)
        page.goto(f"{url}/review/workflows/{workflow.pk}/")
        expect(page.get_by_test_id("workflow-state")).to_have_text("Completed")
        for name in ("read_documents", "post_credit_note", "email_supplier"):
            expect(page.get_by_test_id(f"timeline-step-{name}").get_by_test_id("step-state")).to_have_text("SUCCEEDED")
        page.screenshot(path=str(screenshot_dir / "workflow-timeline.png"), full_page=True)

    assert Workflow.objects.get(pk=workflow.pk).state == WorkflowState.COMPLETED
    assert [key.rsplit(":", 1)[1] for key, _ in world.effects] == ["post_credit_note", "email_supplier"]
