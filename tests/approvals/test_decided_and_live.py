"""The manager's "Decided" tab, the live card and outcome endpoints, the grouped approval's form,
the dashboard's tile, and each person's time zone."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from actions.models import Action, ActionStatus, UserSettings
from actions.services import Actor
from approvals.models import Approval, ApprovalGroup
from approvals.services import approval_decide
from tests.approvals.test_views import make_stale, make_succeeded, propose, shown_in_group
from tests.factories import make_order, make_user

pytestmark = pytest.mark.django_db

S = ActionStatus
HTMX = {"HX-Request": "true"}
DECIDED = "/approvals/decided/"


@pytest.fixture(autouse=True)
def manual_decisions(settings: Any) -> None:
    settings.AUTO_APPROVAL_ENABLED = False


@pytest.fixture(autouse=True)
def published(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", calls.append)
    monkeypatch.setattr("actions.foundation.publish.rejection_commit_enqueue", lambda pk, countdown: None)
    return calls


# --- the Decided tab --------------------------------------------------------------------------------


def test_the_decided_tab_lists_only_her_own_decisions_with_their_outcome(
    client: Client, manager: Any, second_manager: Any, agent_actor: Actor
) -> None:
    mine = make_succeeded(propose(agent_actor, amount="45.00"), approver=manager, reference="re_mine")
    theirs = make_succeeded(propose(agent_actor, amount="46.00"), approver=second_manager, reference="re_theirs")
    client.force_login(manager)

    page = client.get(DECIDED).content.decode()

    assert mine.action_id in page and "Succeeded: re_mine." in page
    assert theirs.action_id not in page and "re_theirs" not in page


def test_the_decided_tab_filters_by_today_status_kind_and_decision(
    client: Client, manager: Any, agent_actor: Actor
) -> None:
    succeeded = make_succeeded(propose(agent_actor, amount="45.00"), approver=manager, reference="re_1")
    stale = make_stale(propose(agent_actor, amount="46.00"), approver=manager)
    on_its_way = propose(agent_actor, amount="47.00")
    approval_decide(action_pk=on_its_way.pk, user=manager, decision="approve")
    rejected = propose(agent_actor, amount="48.00")
    approval_decide(action_pk=rejected.pk, user=manager, decision="reject", reason_code="duplicate")
    yesterday = propose(agent_actor, amount="49.00")
    approval_decide(action_pk=yesterday.pk, user=manager, decision="approve", now=timezone.now() - timedelta(days=2))
    client.force_login(manager)

    def listed(query: str) -> set[str]:
        page = client.get(DECIDED + query).content.decode()
        return {a.action_id for a in (succeeded, stale, on_its_way, rejected, yesterday) if a.action_id in page}

    assert listed("") == {
        succeeded.action_id,
        stale.action_id,
        on_its_way.action_id,
        rejected.action_id,
        yesterday.action_id,
    }
    assert yesterday.action_id not in listed("?today=1")
    assert listed("?status=succeeded") == {succeeded.action_id}
    assert listed("?status=stale") == {stale.action_id}
    assert listed("?status=in_progress") == {on_its_way.action_id, yesterday.action_id}
    assert listed("?decision=reject") == {rejected.action_id}
    assert listed("?kind=supplier_email") == set()
    assert listed("?kind=refund&status=succeeded&today=1") == {succeeded.action_id}
    # Nonsense filters are ignored, never a 500.
    assert client.get(DECIDED + "?status=<script>&page=abc&today=yes").status_code == 200


@pytest.mark.parametrize("who", ["finance", "agent_owner"])
def test_only_managers_see_the_decided_tab(client: Client, who: str, request: pytest.FixtureRequest) -> None:
    client.force_login(request.getfixturevalue(who))
    assert client.get(DECIDED).status_code == 403


def test_the_dashboard_tile_links_to_todays_approvals(client: Client, manager: Any, agent_actor: Actor) -> None:
    approval_decide(action_pk=propose(agent_actor).pk, user=manager, decision="approve")
    client.force_login(manager)

    page = client.get("/").content.decode()

    assert 'href="/approvals/decided/?today=1&amp;decision=approve" data-testid="approved-today-link"' in page


# --- the live card ------------------------------------------------------------------------------------


def test_a_card_polls_while_its_action_is_on_its_way_and_stops_when_final(
    client: Client, manager: Any, agent_actor: Actor
) -> None:
    action = propose(agent_actor)
    approval_decide(action_pk=action.pk, user=manager, decision="approve")
    client.force_login(manager)
    url = reverse("approvals-row", args=[action.pk])

    on_its_way = client.get(url + "?was=PROPOSED", headers=HTMX)
    assert 'hx-trigger="every ' in on_its_way.content.decode()
    assert "HX-Trigger" not in on_its_way, "no toast before the action is final"

    Action.objects.filter(pk=action.pk).update(status=S.SUCCEEDED, provider_reference="re_9")
    final = client.get(url + "?was=SUBMITTING", headers=HTMX)

    body = final.content.decode()
    assert "hx-trigger" not in body, "polling stops at a final state"
    assert "Succeeded: re_9." in body
    # The toast names the action in a clerk's words; the provider's reference is on the card.
    toast = json.loads(final["HX-Trigger"])["consoleToast"]
    assert toast["level"] == "success" and toast["text"].endswith(": succeeded."), toast
    assert toast["text"].startswith("Refund · "), toast


def test_the_outcome_timeline_shows_approved_sent_and_what_it_waits_for(
    client: Client, manager: Any, second_manager: Any, agent_actor: Actor
) -> None:
    succeeded = make_succeeded(propose(agent_actor, amount="45.00"), approver=second_manager, reference="re_77")
    client.force_login(manager)

    page = client.get(reverse("approvals-outcome", args=[succeeded.pk])).content.decode()

    steps = [
        "<strong>Proposed</strong>",
        "<strong>Approved</strong>",
        "<strong>Sent to the provider</strong>",
        "<strong>Succeeded · re_77</strong>",
    ]
    positions = [page.index(step) for step in steps]
    assert positions == sorted(positions)
    assert "hx-trigger" not in page
    # A succeeded refund says nothing contradictory on its detail page.
    detail = client.get(reverse("approvals-detail", args=[succeeded.pk])).content.decode()
    assert "No refund has been made" not in detail
    assert "changed since" not in detail
    assert "Expires" not in detail


# --- approving together, through the page ----------------------------------------------------------


def test_approving_together_through_the_form_answers_with_the_group(
    client: Client, manager: Any, agent_actor: Actor, published: list[int], django_capture_on_commit_callbacks: Any
) -> None:
    order = make_order(captured="310.00")
    first, second = propose(agent_actor, amount="40.00", order=order), propose(agent_actor, amount="60.00", order=order)
    client.force_login(manager)
    inbox = client.get("/approvals/").content.decode()
    assert f'form="group-form-order-{order.pk}"' in inbox

    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(
            reverse("approvals-decide-group"),
            {
                "group": f"order-{order.pk}",
                "action": [first.pk, second.pk],
                "note": "Both damaged.",
                **shown_in_group(inbox, f"order-{order.pk}"),
            },
            headers=HTMX,
        )

    assert response.status_code == 200
    body = response.content.decode()
    assert body.lstrip().startswith(f'<section class="inbox-group card" id="group-order-{order.pk}"')
    assert "Approved 2 proposals together for 100.00 EUR" in body
    assert ApprovalGroup.objects.get().size == 2
    assert sorted(published) == sorted([first.pk, second.pk])


def test_approving_together_more_than_is_left_is_refused_in_words(
    client: Client, manager: Any, agent_actor: Actor
) -> None:
    order = make_order(captured="310.00")
    first, second = (
        propose(agent_actor, amount="200.00", order=order),
        propose(agent_actor, amount="200.00", order=order),
    )
    client.force_login(manager)

    inbox = client.get("/approvals/").content.decode()
    assert 'data-testid="over-balance"' in inbox and "These proposals ask for more than is left." in inbox
    response = client.post(
        reverse("approvals-decide-group"),
        {"group": f"order-{order.pk}", "action": [first.pk, second.pk], **shown_in_group(inbox, f"order-{order.pk}")},
        headers=HTMX,
    )

    assert response.status_code == 403
    body = response.content.decode()
    assert "Together these come to 400.00 EUR" in body and "Nothing was changed." in body
    assert "(403)" not in body
    assert not Approval.objects.exists()


def test_approving_together_without_ticks_is_a_clear_400(client: Client, manager: Any, agent_actor: Actor) -> None:
    order = make_order(captured="310.00")
    propose(agent_actor, amount="10.00", order=order)
    client.force_login(manager)
    response = client.post(reverse("approvals-decide-group"), {"group": f"order-{order.pk}"}, headers=HTMX)
    assert response.status_code == 400
    assert "Tick the proposals to approve together." in response.content.decode()


# --- the inbox: groups, sorting, pagination, what a card shows -------------------------------------


def test_the_inbox_is_grouped_paginated_and_sorted(client: Client, manager: Any, agent_actor: Actor) -> None:
    small = propose(agent_actor, amount="10.00")
    large = propose(agent_actor, amount="300.00")
    for _ in range(10):
        propose(agent_actor, amount="20.00")
    client.force_login(manager)

    oldest_first = client.get("/approvals/").content.decode()
    largest_first = client.get("/approvals/?sort=amount").content.decode()
    page_two = client.get("/approvals/?page=2").content.decode()

    assert oldest_first.count('class="inbox-group card') == 10 and "Page 1 of 2" in oldest_first
    assert small.action_id in oldest_first and small.action_id not in page_two
    assert small.action_id in oldest_first.split('class="inbox-group card')[1], "oldest group first"
    assert large.action_id in largest_first.split('class="inbox-group card')[1], "largest amount first"
    assert small.action_id not in largest_first, "the smallest is on the second page by amount"


def test_a_card_shows_the_payment_date_and_the_customers_refund_history(
    client: Client, manager: Any, second_manager: Any, agent_actor: Actor
) -> None:
    for amount in ("11.00", "12.00"):
        make_succeeded(propose(agent_actor, amount=amount), approver=second_manager, reference=f"re_{amount}")
    waiting = propose(agent_actor, amount="13.00")  # every factory order has ada@example.com
    client.force_login(manager)

    page = client.get("/approvals/").content.decode()

    card = page.split(f'id="action-{waiting.pk}"')[1].split("</article>")[0]
    assert "3rd refund in 90 days: 2 already refunded to this customer." in card
    assert 'data-testid="paid-at"' in card


# --- time zones -----------------------------------------------------------------------------------------


def test_a_person_chooses_a_time_zone_and_pages_follow_it(client: Client, manager: Any, agent_actor: Actor) -> None:
    action = propose(agent_actor)
    client.force_login(manager)

    response = client.post(reverse("account-time-zone"), {"time_zone": "Asia/Tokyo"})

    assert response.status_code == 302
    assert UserSettings.objects.get(user=manager).time_zone == "Asia/Tokyo"
    page = client.get(reverse("approvals-detail", args=[action.pk])).content.decode()
    local = timezone.localtime(action.created_at, timezone=timezone.get_fixed_timezone(9 * 60))
    assert f"({local:%-d %b %Y, %H:%M} JST)" in page, "absolute dates next to relative ones, in her zone"


def test_a_bad_time_zone_is_refused_naming_it_and_nothing_is_written(client: Client, manager: Any) -> None:
    client.force_login(manager)

    response = client.post(reverse("account-time-zone"), {"time_zone": "Mars/Olympus"})

    assert response.status_code == 400
    assert "Mars/Olympus is not a time zone name" in response.content.decode()
    assert not UserSettings.objects.filter(user=manager).exclude(time_zone="UTC").exists()


def test_the_zone_is_read_at_login(client: Client, agent_actor: Actor) -> None:
    person = make_user("tomo.manager", "manager", limits={"EUR": "100"})
    UserSettings.objects.create(user=person, time_zone="Pacific/Auckland")
    client.force_login(person)
    page = client.get(reverse("account")).content.decode()
    assert '<option value="Pacific/Auckland" selected>' in page
    assert "NZ" in page.split("It is now")[1][:40]
