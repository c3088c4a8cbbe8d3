"""Reassigning in the review queue: the "Reassign to" list offers only active
members of finance, and the server accepts only those people, whatever a forged form names.

A superuser holds every permission and accounts payable holds the permission to resolve; neither
is in the list, so neither may be handed an item from the queue by a crafted POST either.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from actions.models import Action
from actions.services import Actor
from tests.actions.test_finance_services import escalated
from tests.factories import make_user

pytestmark = pytest.mark.django_db

HTMX = {"HX-Request": "true"}


@pytest.fixture(autouse=True)
def no_broker(dispatched: list[int]) -> list[int]:
    return dispatched


@pytest.fixture
def people(db: Any) -> dict[str, Any]:
    return {
        "felix": make_user("felix.finance", "finance"),
        "gone": make_user("gina.finance", "finance", is_active=False),
        "payable": make_user("alex.payable", "accounts payable"),
        "root": make_user("root.super", is_superuser=True, is_staff=True),
        "admin": make_user("ada.admin", "admin", is_staff=True),
        "manager": make_user("max.manager", "manager"),
    }


def reassign_options(page: str) -> set[str]:
    select = re.search(r'<select name="owner"[^>]*>(.*?)</select>', page, flags=re.DOTALL)
    assert select is not None, "the page offers no Reassign list"
    # The people offered: every option but the blank "Choose a person…" that comes first.
    return set(re.findall(r'<option value="\d+"[^>]*>([^<]+)</option>', select.group(1)))


def test_the_reassign_list_starts_with_a_blank_choice_that_cannot_be_sent(
    client: Client, finance: Any, people: dict[str, Any], agent_actor: Actor
) -> None:
    escalated(agent_actor, owner=finance)
    client.force_login(finance)

    page = client.get("/review/").content.decode()

    first = re.search(r'<select name="owner" required>\s*(<option[^>]*>[^<]*</option>)', page)
    assert first is not None
    # Not disabled: a disabled option is left out of the form, and a form with no owner means
    # "assign to me". Blank and required, the browser asks for a choice and the server refuses "".
    assert first.group(1) == '<option value="" selected>Choose a person…</option>'


@pytest.mark.parametrize("origin", ["queue", "detail"])
def test_a_reassignment_with_nobody_chosen_is_refused_with_a_reason(
    client: Client, finance: Any, people: dict[str, Any], agent_actor: Actor, origin: str
) -> None:
    review = escalated(agent_actor, owner=people["felix"])
    client.force_login(finance)

    response = client.post(
        reverse("review-action-assign", args=[review.pk]), {"origin": origin, "owner": ""}, headers=HTMX
    )

    assert response.status_code == 400
    assert "choose whom to reassign it to, a member of finance." in response.content.decode()
    # A blank choice is not "Assign to me": the item stays where it was.
    assert Action.objects.get(pk=review.pk).owner == people["felix"]


def test_assign_to_me_sends_no_owner_and_takes_the_item(
    client: Client, finance: Any, people: dict[str, Any], agent_actor: Actor
) -> None:
    review = escalated(agent_actor, owner=people["felix"])
    client.force_login(finance)

    response = client.post(reverse("review-action-assign", args=[review.pk]), {"origin": "queue"}, headers=HTMX)

    assert response.status_code == 200
    assert Action.objects.get(pk=review.pk).owner == finance


def test_the_reassign_list_offers_only_active_members_of_finance(
    client: Client, finance: Any, people: dict[str, Any], agent_actor: Actor
) -> None:
    escalated(agent_actor, owner=finance)
    client.force_login(finance)

    options = reassign_options(client.get("/review/").content.decode())

    # The current owner is left out of its own list; every other active finance member is in.
    assert options == {"felix.finance"}


@pytest.mark.parametrize("who", ["payable", "root", "admin", "manager", "gone"])
def test_a_forged_reassignment_to_someone_the_list_does_not_offer_is_refused(
    client: Client, finance: Any, people: dict[str, Any], agent_actor: Actor, who: str
) -> None:
    review = escalated(agent_actor, owner=finance)
    client.force_login(finance)

    response = client.post(
        reverse("review-action-assign", args=[review.pk]),
        {"origin": "queue", "owner": str(people[who].pk)},
        headers=HTMX,
    )

    assert response.status_code == 400
    assert "owner: that person is not an active member of finance." in response.content.decode()
    assert Action.objects.get(pk=review.pk).owner == finance


def test_a_member_of_finance_from_the_list_is_accepted(
    client: Client, finance: Any, people: dict[str, Any], agent_actor: Actor
) -> None:
    review = escalated(agent_actor, owner=finance)
    client.force_login(finance)

    response = client.post(
        reverse("review-action-assign", args=[review.pk]),
        {"origin": "queue", "owner": str(people["felix"].pk)},
        headers=HTMX,
    )

    assert response.status_code == 200
    assert Action.objects.get(pk=review.pk).owner == people["felix"]
