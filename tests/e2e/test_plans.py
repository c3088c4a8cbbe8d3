"""A manager finds a waiting plan from the inbox, reads it in a clerk's words, approves it and
watches it complete without reloading the page; the plan page reads on a phone too."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from playwright.sync_api import Page, ViewportSize, expect

from actions.models import Workflow, WorkflowState
from actions.workflows.services import workflow_propose
from tests.e2e.helpers import log_in
from tests.e2e.test_manager_inbox import as_someone_else
from tests.workflows.conftest import World, po_parameters, world  # noqa: F401 (the fixture)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"
DESKTOP: ViewportSize = {"width": 1366, "height": 900}


class Visit(NamedTuple):
    page: Page
    workflow: Workflow
    url: str  # the live server's


Visitor = Callable[..., AbstractContextManager[Visit]]


@pytest.fixture
def manager_visits(
    live_server: Any,
    chromium_page: Callable[[], AbstractContextManager[Page]],
    world: World,  # noqa: F811
    manager: Any,
    agent_actor: Any,
) -> Visitor:
    """A plan waiting for a decision, and a browser logged in as a manager, on its page unless
    ``start`` is "home", at the size of ``viewport``."""
    workflow = workflow_propose(
        template="po_mismatch_resolution", parameters=po_parameters(), proposer=agent_actor
    ).workflow
    url = live_server.url

    @contextmanager
    def visit(viewport: ViewportSize = DESKTOP, *, start: str = "plan") -> Iterator[Visit]:
        with chromium_page() as page:
            page.set_viewport_size(viewport)
            log_in(page, url, manager)
            if start == "plan":
                page.goto(f"{url}/approvals/workflows/{workflow.pk}/")
            yield Visit(page, workflow, url)

    return visit


def test_a_manager_with_only_a_plan_waiting_is_led_to_it_from_the_badge_and_the_plans_tab(
    manager_visits: Visitor,
) -> None:
    with manager_visits(start="home") as (page, workflow, url):
        # The badge counts the plan and leads to it, not to an inbox with nothing in it.
        badge = page.get_by_test_id("nav-waiting")
        expect(badge).to_contain_text("1")
        badge.click()
        page.wait_for_url(f"{url}/approvals/workflows/")
        page.goto(f"{url}/approvals/")
        tab = page.get_by_test_id("tab-plans")
        expect(tab).to_have_text("Plans 1")
        tab.click()
        page.wait_for_url(f"{url}/approvals/workflows/")
        row = page.get_by_test_id("plan-row")
        expect(row).to_have_count(1)
        expect(row).to_contain_text("Resolve a purchase-order mismatch")
        expect(row).to_contain_text("Bill INV-42")
        expect(row).to_contain_text("20.00")
        expect(row).not_to_contain_text(workflow.workflow_id)
        page.screenshot(path=str(DOCS_IMG / "inbox-plans.png"), full_page=True)
        row.get_by_role("link", name="Resolve a purchase-order mismatch").click()
        page.wait_for_url(f"{url}/approvals/workflows/{workflow.pk}/")


def test_the_plan_page_speaks_plainly_and_follows_its_workflow_to_the_end_without_a_reload(
    manager_visits: Visitor,
    world: World,  # noqa: F811
) -> None:
    with manager_visits() as (page, workflow, _):
        read = page.get_by_test_id("plan-step-read_documents")
        # Numbered once, by the list; named in words.
        expect(read.locator("h3")).to_have_text("Read documents read")
        expect(page.locator("main")).not_to_contain_text("None: ")
        expect(page.locator("main")).not_to_contain_text("1. 1.")
        # Ids, template names and the hash are behind the technical details.
        expect(page.get_by_text(workflow.plan_hash)).not_to_be_visible()
        expect(page.get_by_role("heading", level=1)).not_to_contain_text("po_mismatch_resolution")
        email = page.get_by_test_id("plan-step-email_supplier").get_by_test_id("email-preview")
        expect(email).to_contain_text("Dear Acme Supplies,")
        approve = page.get_by_role("button", name="Approve the plan")
        expect(approve).to_have_class("button button--approve")
        approve.click()
        expect(page.get_by_test_id("workflow-state")).to_have_text("Authorized")
        # A marker on window: any reload or navigation from here would lose it.
        page.evaluate("window.stillThisPage = true")

        # The workers run the plan while the page is open.
        as_someone_else(lambda: world.run(workflow.workflow_id))

        expect(page.get_by_test_id("workflow-state")).to_have_text("Completed")
        expect(page.get_by_test_id("progress-step-email_supplier").get_by_test_id("progress-state")).to_have_text(
            "Done"
        )
        expect(page.get_by_test_id("workflow-next")).not_to_contain_text("starts shortly")
        assert page.evaluate("window.stillThisPage") is True
        page.screenshot(path=str(DOCS_IMG / "plan-completed.png"), full_page=True)

    assert Workflow.objects.get(pk=workflow.pk).state == WorkflowState.COMPLETED


def test_on_a_phone_the_plan_steps_labels_never_run_into_their_values(manager_visits: Visitor) -> None:
    with manager_visits({"width": 390, "height": 844}) as (page, _, _):
        pairs = page.locator(".plan-step .ledger > div")
        expect(pairs.first).to_be_visible()
        for index in range(pairs.count()):
            term = pairs.nth(index).locator("dt").bounding_box()
            value = pairs.nth(index).locator("dd").bounding_box()
            assert term is not None and value is not None
            beside = term["x"] + term["width"] + 8 <= value["x"]
            below = value["y"] >= term["y"] + term["height"] - 1
            assert beside or below, f"label and value overlap in row {index}: {term} {value}"
