"""The review queue refreshes itself, but not while a clerk is choosing in it.

Its refresh is an htmx poll. The pause used to be a trigger filter, which htmx evaluates with
eval; the Content-Security-Policy forbids eval, so the filter never ran and every refresh
reset a half-chosen reassignment. The pause now lives in console.js.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from actions.models import Action
from actions.services import Actor
from tests.actions.test_finance_services import escalated
from tests.e2e.helpers import log_in
from tests.factories import make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

COUNT_POLLS = """() => {
  window.queuePolls = 0;
  window.queueErrors = [];
  document.addEventListener("htmx:beforeRequest", (event) => {
    if (event.detail.elt.id === "review-table") { window.queuePolls += 1; }
  });
  document.addEventListener("htmx:evalDisallowedError", () => window.queueErrors.push("eval"));
}"""


def _wait_for_polls(page: Page, at_least: int, deadline_seconds: float = 20) -> None:
    """Wait until the queue has tried to refresh ``at_least`` times (every 5 s), or fail."""
    deadline = time.monotonic() + deadline_seconds
    while page.evaluate("window.queuePolls") < at_least:
        assert time.monotonic() < deadline, "the queue never tried to refresh"
        page.wait_for_timeout(200)


def test_the_queue_does_not_refresh_away_a_reassignment_being_chosen(
    live_server: Any,
    chromium_page: Callable[[], AbstractContextManager[Page]],
    finance: Any,
    agent_actor: Actor,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)
    felix = make_user("felix.finance", "finance")
    make_user("fran.finance", "finance")
    item = escalated(agent_actor, owner=finance)

    with chromium_page() as page:
        log_in(page, live_server.url, finance)
        page.goto(f"{live_server.url}/review/")
        choice = page.locator(f"#queue-action-{item.pk} select[name='owner']")
        expect(choice).to_be_visible()
        page.evaluate(COUNT_POLLS)
        # A mark on the select: a refresh that replaced the table would drop it.
        choice.evaluate("(select) => { select.dataset.mark = 'still-here'; }")

        # While she has the select focused, nothing is refreshed away.
        choice.focus()
        _wait_for_polls(page, 1)
        expect(choice).to_have_attribute("data-mark", "still-here")
        expect(choice).to_be_focused()

        # She picks felix and looks elsewhere before pressing Reassign: the choice stays.
        choice.select_option(label=felix.username)
        page.locator("h1").click()
        _wait_for_polls(page, 2)
        expect(choice).to_have_attribute("data-mark", "still-here")
        expect(choice).to_have_value(str(felix.pk))
        assert page.evaluate("window.queueErrors") == []

        page.locator(f"#queue-action-{item.pk}").get_by_role("button", name="Reassign").click()
        expect(page.locator(f"#queue-action-{item.pk}")).to_contain_text(felix.username)

    assert Action.objects.get(pk=item.pk).owner == felix
