"""What the manager saw is what is decided: the pages.

Every decision form posts back what its page showed of the proposal (the target's version, the
amount and the payload hash). A form without them is refused with 400, naming the missing
field. A decision on a card older than the order is refused with 409 in place: the card (or the
group) says what changed and offers to reload instead of its buttons. The rules themselves are
tested in test_shown_values.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from actions.engine.claim import ClaimOutcome, submission_begin
from actions.models import Action, ActionStatus, Order
from actions.services import Actor
from approvals.models import Approval, ApprovalGroup, PendingRejection
from approvals.services import approval_decide
from tests.approvals.test_views import HTMX, order_of, propose, row_html, shown_in, shown_in_group, shown_now
from tests.factories import make_order

pytestmark = pytest.mark.django_db

S = ActionStatus


@pytest.fixture(autouse=True)
def manual_decisions(settings: Any) -> None:
    settings.AUTO_APPROVAL_ENABLED = False


@pytest.fixture(autouse=True)
def published(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", calls.append)
    return calls


def another_refund_goes_ahead(order: Order, *, agent_actor: Actor, approver: Any, amount: str) -> Action:
    """Another refund on ``order`` is approved and reserved, as the worker would: the order's
    version moves on."""
    other = propose(agent_actor, amount=amount, order=order)
    approval_decide(action_pk=other.pk, user=approver, decision="approve")
    assert submission_begin(action_pk=other.pk).outcome == ClaimOutcome.CLAIMED
    return other


def nothing_decided(action: Action) -> None:
    assert not Approval.objects.filter(action=action).exists()
    assert not PendingRejection.objects.filter(action=action).exists()
    assert Action.objects.get(pk=action.pk).status == S.PROPOSED


@pytest.mark.parametrize("decision", ["approve", "reject"])
@pytest.mark.parametrize("missing", ["shown_version", "shown_amount", "shown_payload_hash"])
def test_a_decision_without_what_the_page_showed_is_a_400_naming_the_field(
    client: Client, manager: Any, agent_actor: Actor, published: list[int], decision: str, missing: str
) -> None:
    action = propose(agent_actor, amount="50.00")
    client.force_login(manager)
    data = {"decision": decision, "reason_code": "duplicate", **shown_now(action)}
    del data[missing]

    response = client.post(reverse("approvals-decide", args=[action.pk]), data, headers=HTMX)

    assert response.status_code == 400
    assert f"{missing}: missing: the page sends what it showed with every decision." in response.content.decode()
    nothing_decided(action)
    assert published == []


def test_approving_together_without_a_members_amount_is_a_400_naming_it(
    client: Client, manager: Any, agent_actor: Actor
) -> None:
    order = make_order(captured="400.00")
    a, b = propose(agent_actor, amount="40.00", order=order), propose(agent_actor, amount="60.00", order=order)
    client.force_login(manager)
    data = {
        "group": f"order-{order.pk}",
        "action": [a.pk, b.pk],
        **shown_in_group(client.get("/approvals/").content.decode(), f"order-{order.pk}"),
    }
    del data[f"shown_amount_{b.pk}"]

    response = client.post(reverse("approvals-decide-group"), data, headers=HTMX)

    assert response.status_code == 400
    assert f"shown_amount_{b.pk}: missing" in response.content.decode()
    assert not ApprovalGroup.objects.exists()


def test_an_approval_on_an_older_card_is_refused_in_place_and_offers_to_reload(
    client: Client, manager: Any, second_manager: Any, agent_actor: Actor, published: list[int]
) -> None:
    order = make_order(captured="300.00")
    action = propose(agent_actor, amount="50.00", order=order)
    client.force_login(manager)
    detail_url = reverse("approvals-detail", args=[action.pk])
    card = row_html(client.get(detail_url), action)
    another_refund_goes_ahead(order, agent_actor=agent_actor, approver=second_manager, amount="20.00")
    published.clear()

    response = client.post(
        reverse("approvals-decide", args=[action.pk]),
        {"decision": "approve", **shown_in(card)},
        headers={**HTMX, "HX-Current-URL": f"http://testserver{detail_url}"},
    )

    assert response.status_code == 409
    body = response.content.decode()
    assert body.lstrip().startswith(f'<article class="proposal proposal--error" id="action-{action.pk}"')
    assert "The order changed since you opened this page: another refund of 20.00 EUR went ahead." in body
    assert f'href="{detail_url}" data-testid="reload"' in body
    assert 'value="approve"' not in body, "the card offers a reload, not a decision on what she did not see"
    nothing_decided(action)
    assert published == []

    # Reloaded, the page shows the order as it is, and her approval of that goes through.
    fresh = row_html(client.get(detail_url), action)
    approved = client.post(
        reverse("approvals-decide", args=[action.pk]), {"decision": "approve", **shown_in(fresh)}, headers=HTMX
    )
    assert approved.status_code == 200
    assert Approval.objects.get(action=action).order_version == order_of(action).version


def test_without_javascript_the_refusal_is_a_409_page_with_a_reload_link(
    client: Client, manager: Any, second_manager: Any, agent_actor: Actor
) -> None:
    order = make_order(captured="300.00")
    action = propose(agent_actor, amount="50.00", order=order)
    client.force_login(manager)
    on_the_page = shown_now(action)
    another_refund_goes_ahead(order, agent_actor=agent_actor, approver=second_manager, amount="20.00")

    response = client.post(reverse("approvals-decide", args=[action.pk]), {"decision": "approve", **on_the_page})

    assert response.status_code == 409
    body = response.content.decode()
    assert "another refund of 20.00 EUR went ahead" in body
    assert 'href="/approvals/" data-testid="reload"' in body
    nothing_decided(action)


def test_approving_together_on_an_older_group_card_is_refused_in_the_group(
    client: Client, manager: Any, second_manager: Any, agent_actor: Actor
) -> None:
    order = make_order(captured="400.00")
    a, b = propose(agent_actor, amount="40.00", order=order), propose(agent_actor, amount="60.00", order=order)
    client.force_login(manager)
    key = f"order-{order.pk}"
    on_the_page = shown_in_group(client.get("/approvals/").content.decode(), key)
    another_refund_goes_ahead(order, agent_actor=agent_actor, approver=second_manager, amount="20.00")

    response = client.post(
        reverse("approvals-decide-group"),
        {"group": key, "action": [a.pk, b.pk], **on_the_page},
        headers={**HTMX, "HX-Current-URL": "http://testserver/approvals/"},
    )

    assert response.status_code == 409
    body = response.content.decode()
    assert body.lstrip().startswith(f'<section class="inbox-group card" id="group-{key}"')
    assert "another refund of 20.00 EUR went ahead" in body
    assert 'href="/approvals/" data-testid="reload"' in body
    assert not ApprovalGroup.objects.exists()


def test_a_card_drawn_again_after_a_refusal_keeps_the_version_its_page_showed(
    client: Client, manager: Any, second_manager: Any, agent_actor: Actor
) -> None:
    """Only the card is drawn again, not the order's money beside it: its forms must not start
    posting the order's version now, or her next click would approve what she did not see."""
    order = make_order(captured="300.00")
    action = propose(agent_actor, amount="50.00", order=order)
    client.force_login(manager)
    card = row_html(client.get(reverse("approvals-detail", args=[action.pk])), action)
    another_refund_goes_ahead(order, agent_actor=agent_actor, approver=second_manager, amount="20.00")

    # A rejection without a reason is refused; the answer is the card, drawn again.
    refused = client.post(
        reverse("approvals-decide", args=[action.pk]), {"decision": "reject", **shown_in(card)}, headers=HTMX
    )
    assert refused.status_code == 400
    redrawn = refused.content.decode()
    assert shown_in(redrawn) == shown_in(card)
    assert shown_in(redrawn) != shown_now(action)

    approved = client.post(
        reverse("approvals-decide", args=[action.pk]), {"decision": "approve", **shown_in(redrawn)}, headers=HTMX
    )
    assert approved.status_code == 409
    assert "another refund of 20.00 EUR went ahead" in approved.content.decode()
    nothing_decided(action)


def test_a_cards_poll_and_its_undo_keep_the_version_its_page_showed(
    client: Client, manager: Any, second_manager: Any, agent_actor: Actor
) -> None:
    order = make_order(captured="300.00")
    action = propose(agent_actor, amount="50.00", order=order)
    client.force_login(manager)
    on_the_page = shown_now(action)
    page_version = on_the_page["shown_version"]
    pending = client.post(
        reverse("approvals-decide", args=[action.pk]),
        {"decision": "reject", "reason_code": "duplicate", **on_the_page},
        headers=HTMX,
    ).content.decode()
    # Meanwhile the order moves on; the page around the pending card does not.
    another_refund_goes_ahead(order, agent_actor=agent_actor, approver=second_manager, amount="20.00")
    assert shown_now(action)["shown_version"] != page_version
    assert f'name="shown_version" value="{page_version}"' in pending, "the undo form keeps it"
    assert f"shown_version={page_version}" in pending, "so does the poll"

    polled = client.get(
        reverse("approvals-row", args=[action.pk]) + f"?was=PROPOSED&shown_version={page_version}", headers=HTMX
    ).content.decode()
    assert f'name="shown_version" value="{page_version}"' in polled

    undone = client.post(
        reverse("approvals-undo-reject", args=[action.pk]), {"shown_version": page_version}, headers=HTMX
    ).content.decode()
    assert shown_in(undone)["shown_version"] == page_version
    approved = client.post(
        reverse("approvals-decide", args=[action.pk]), {"decision": "approve", **shown_in(undone)}, headers=HTMX
    )
    assert approved.status_code == 409

    # An undo from a form that does not say which version its page showed cannot be followed by
    # a decision on that card: it offers a reload instead.
    client.post(
        reverse("approvals-decide", args=[action.pk]),
        {"decision": "reject", "reason_code": "duplicate", **shown_now(action)},
        headers=HTMX,
    )
    blind = client.post(reverse("approvals-undo-reject", args=[action.pk]), headers=HTMX).content.decode()
    assert 'data-testid="reload"' in blind
    assert 'value="approve"' not in blind
