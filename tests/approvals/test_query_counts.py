"""The manager's pages run a fixed number of queries, however many actions there are.

A query per row is invisible with three proposals in development and a slow inbox on a busy
Monday. Each test measures a page with a little data and again with ten times as much, and
expects the same count.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from actions.models import Action, Order
from actions.services import Actor
from approvals.services import action_reopen
from tests.approvals.test_views import make_stale, propose
from tests.factories import make_agent, make_order

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def manual_decisions(settings: Any) -> None:
    settings.AUTO_APPROVAL_ENABLED = False


@pytest.fixture(autouse=True)
def published(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", calls.append)
    return calls


def queries_for(client: Client, url: str) -> tuple[int, str]:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200
    return len(captured.captured_queries), response.content.decode()


def add_inbox_rows(*, waiting: int, stale: int, proposers: list[Actor], approver: Any) -> None:
    """Proposals by several agents (so rows differ in who proposed them), some of them stale."""
    for number in range(waiting):
        # Every third one is above the manager's limit, so greyed-out rows are measured too.
        amount = "900.00" if number % 3 == 0 else "60.00"
        propose(proposers[number % len(proposers)], amount=amount)
    for number in range(stale):
        make_stale(propose(proposers[number % len(proposers)], amount="60.00"), approver=approver)


def test_the_inbox_runs_as_many_queries_for_twenty_proposals_as_for_two(
    client: Client, manager: Any, second_manager: Any, agent_actor: Actor
) -> None:
    own_agent = Actor.for_agent(make_agent(manager, name="maria-bot"))
    proposers = [agent_actor, own_agent]
    client.force_login(manager)

    add_inbox_rows(waiting=2, stale=1, proposers=proposers, approver=second_manager)
    few, _ = queries_for(client, "/approvals/")
    add_inbox_rows(waiting=18, stale=4, proposers=proposers, approver=second_manager)
    many, page = queries_for(client, "/approvals/")

    # Each proposal is on an order of its own: a page holds ten order groups, plus every stale row.
    assert page.count('<article class="proposal') == 10 + 5, "a full page of groups and the stale rows"
    assert page.count('data-testid="group-summary"') == 10
    assert many == few


def grow_order(order: Order, *, actions: int, cycles: int, viewed: Action, proposer: Actor, approver: Any) -> None:
    """Add actions on ``order`` and decisions on ``viewed``: each cycle approves it, makes it
    stale and asks for a new decision (an approval and three events more)."""
    for _ in range(actions):
        other = propose(proposer, amount="10.00", order=order)
        if other.pk % 2:
            make_stale(other, approver=approver)
    for _ in range(cycles):
        make_stale(viewed, approver=approver)
        action_reopen(action_pk=viewed.pk, user=approver)


def test_the_detail_page_runs_as_many_queries_for_twenty_actions_on_the_order_as_for_two(
    client: Client, manager: Any, second_manager: Any, agent_actor: Actor
) -> None:
    order = make_order(captured="5000.00")
    viewed = propose(agent_actor, amount="40.00", order=order)
    url = reverse("approvals-detail", args=[viewed.pk])
    client.force_login(manager)

    grow_order(order, actions=1, cycles=1, viewed=viewed, proposer=agent_actor, approver=second_manager)
    few, _ = queries_for(client, url)
    grow_order(order, actions=18, cycles=4, viewed=viewed, proposer=agent_actor, approver=second_manager)
    many, page = queries_for(client, url)

    assert Action.objects.filter(order=order).count() == 20
    assert page.count("<code>reopen</code>") == 5, "the whole audit trail is on the page"
    assert many == few
