"""The review queue is paged by a cursor (keyset), not capped: every item is reachable, none is
shown twice, and an item that arrives meanwhile does not shift the page a person is reading."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from actions.review.selectors.queue import review_queue_get
from actions.services import Actor
from tests.actions.test_finance_services import escalated, unknown

pytestmark = pytest.mark.django_db


def test_the_pages_follow_each_other_by_cursor_and_reach_every_item(finance: Any, agent_actor: Actor) -> None:
    items = [unknown(agent_actor) for _ in range(5)]
    everything = [row.pk for row in review_queue_get(user=finance, page_size=100).rows]
    assert sorted(everything) == sorted(a.pk for a in items)

    first = review_queue_get(user=finance, page_size=2)
    assert [row.pk for row in first.rows] == everything[:2] and first.next_after
    # A more urgent item arrives (needs review sorts before unknown): an offset would now repeat
    # a row on page two; the cursor carries on after the last row shown.
    escalated(agent_actor, owner=finance)
    second = review_queue_get(user=finance, page_size=2, after=first.next_after)
    assert [row.pk for row in second.rows] == everything[2:4]
    assert second.position == 3  # the newcomer and the first page come before it
    third = review_queue_get(user=finance, page_size=2, after=second.next_after)
    assert [row.pk for row in third.rows] == everything[4:]
    assert third.next_after == ""


def test_the_queue_page_links_to_the_next_page_and_shows_it(
    client: Client, finance: Any, agent_actor: Actor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("actions.review.selectors.queue.QUEUE_PAGE_SIZE", 2)
    items = [unknown(agent_actor) for _ in range(3)]
    client.force_login(finance)
    first = client.get(reverse("review-queue"))
    assert first.status_code == 200
    html = first.content.decode()
    assert "Items 1 to 2 of 3, most urgent first" in html
    next_after = first.context["queue"].next_after
    assert f"?after={next_after}" in html
    second = client.get(reverse("review-queue"), {"after": next_after})
    shown = {row.pk for row in first.context["queue"].rows} | {row.pk for row in second.context["queue"].rows}
    assert shown == {a.pk for a in items}
    assert "First page" in second.content.decode()


@pytest.mark.parametrize("after", ["garbage", "1.2.3", "1.2.3.4.x", "9" * 30 + ".1.1.1.1"])
def test_a_mangled_cursor_shows_the_first_page_with_400_and_says_why(
    client: Client, finance: Any, agent_actor: Actor, after: str
) -> None:
    action = unknown(agent_actor)
    client.force_login(finance)
    response = client.get(reverse("review-queue"), {"after": after})
    assert response.status_code == 400
    assert "not a page of this queue" in response.content.decode()
    assert [row.pk for row in response.context["queue"].rows] == [action.pk]
