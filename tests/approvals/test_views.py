"""The manager's pages: the inbox, the detail page, decisions posted from them, login and logout.

The decision rules themselves are tested in test_decisions.py. These tests check what a person
sees and what one click does: the row greyed out with the reason, the row replaced in place with
htmx, the redirect without JavaScript, and refusals that answer with their own status code and
leave nothing behind (invariant 10).
"""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.db import transaction
from django.db.models import F
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from actions.engine.claim import ClaimOutcome, submission_begin
from actions.kinds import kind_for
from actions.kinds.refund.proposal import action_propose_refund
from actions.models import Action, ActionEvent, ActionStatus, Order
from actions.services import Actor, action_transition
from approvals.models import Approval, ApprovalLimit, PendingRejection
from approvals.services import approval_decide
from tests.factories import PASSWORD, make_agent, make_order, make_request, make_user

pytestmark = pytest.mark.django_db

S = ActionStatus
INBOX = "/approvals/"
HTMX = {"HX-Request": "true"}


@pytest.fixture(autouse=True)
def manual_decisions(settings: Any) -> None:
    # Small proposals would otherwise be approved by policy and never reach the inbox.
    settings.AUTO_APPROVAL_ENABLED = False


@pytest.fixture(autouse=True)
def published(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The dispatches published after an approval, by action pk, instead of publishing them."""
    calls: list[int] = []
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", calls.append)
    return calls


# --- builders ---------------------------------------------------------------------------------


def propose(
    proposer: Actor,
    *,
    amount: str = "120.00",
    currency: str = "EUR",
    order: Order | None = None,
    captured: str = "1000.00",
    customer_name: str = "Ada Lovelace",
    evidence: str = "The parcel arrived crushed; photos attached to ticket 4411.",
) -> Action:
    """Propose a refund as ``proposer``, on a new order unless one is given."""
    order = order or make_order(currency=currency, captured=captured, customer_name=customer_name)
    request = make_request(order)
    return action_propose_refund(
        order_number=order.number,
        request_number=request.number,
        amount=amount,
        currency=currency,
        reason_code="damaged",
        evidence=evidence,
        proposer=proposer,
    ).action


def order_of(action: Action) -> Order:
    return Order.objects.get(actions=action)


def make_stale(action: Action, *, approver: Any) -> Action:
    """Approve ``action``, then change its order before the worker reserves, so it goes STALE."""
    approval_decide(action_pk=action.pk, user=approver, decision="approve")
    # A correction on the order (made through the admin, say) bumps its version: the approval
    # was given for the old version and must not be used for the new one.
    Order.objects.filter(actions=action).update(version=F("version") + 1)
    claim = submission_begin(action_pk=action.pk)
    assert claim.outcome == ClaimOutcome.STALE
    return Action.objects.get(pk=action.pk)


def make_succeeded(action: Action, *, approver: Any, reference: str) -> Action:
    """Take ``action`` through approval and reservation to SUCCEEDED, as the worker would."""
    approval_decide(action_pk=action.pk, user=approver, decision="approve")
    claim = submission_begin(action_pk=action.pk)
    assert claim.outcome == ClaimOutcome.CLAIMED
    # The worker's recording service is written elsewhere; this is the same change it makes:
    # the transition and the reservation turned into refunded money, in one transaction.
    with transaction.atomic():
        fresh = Action.objects.select_for_update().get(pk=action.pk)
        action_transition(
            action=fresh,
            transition="record_success",
            actor=Actor.system("test-worker"),
            provider_reference=reference,
        )
        Order.objects.filter(actions=action).update(
            reserved_amount=F("reserved_amount") - action.amount,
            refunded_amount=F("refunded_amount") + action.amount,
            version=F("version") + 1,
        )
    return Action.objects.get(pk=action.pk)


def make_manager_too(user: Any, *, limits: dict[str, str]) -> Any:
    user.groups.add(Group.objects.get(name="manager"))
    for currency, amount in limits.items():
        ApprovalLimit.objects.create(user=user, currency=currency, max_amount=Decimal(amount))
    return type(user).objects.get(pk=user.pk)


def row_html(response: Any, action: Action) -> str:
    """The inbox row of ``action`` in a response, or an empty string if it is not there."""
    found = re.search(
        rf'<article [^>]*id="action-{action.pk}".*?</article>', response.content.decode(), flags=re.DOTALL
    )
    return found.group(0) if found else ""


def button(row: str, decision: str) -> str:
    found = re.search(rf'<button [^>]*value="{decision}"[^>]*>', row)
    assert found, f"no {decision} button in the row"
    return found.group(0)


def shown_now(action: Action) -> dict[str, str]:
    """What a page opened now shows of ``action``, as its decision form posts it back."""
    fresh = Action.objects.select_related("order", "bill").get(pk=action.pk)
    version = kind_for(fresh.kind).target_version(fresh)
    return {
        "shown_version": "none" if version is None else str(version),
        "shown_amount": str(fresh.amount),
        "shown_payload_hash": fresh.payload_hash,
    }


def shown_in(row: str) -> dict[str, str]:
    """What the decision form in ``row`` (a card's HTML) posts back: what that page showed."""
    return dict(re.findall(r'<input type="hidden" name="(shown_[a-z_]+)" value="([^"]*)">', row))


def shown_in_group(page: str, key: str) -> dict[str, str]:
    """What "approve together" in group ``key`` of an inbox page posts back: the target's version
    its card showed, and the amount and payload hash of every card in it."""
    form = re.search(rf'id="group-form-{key}".*?</form>', page, flags=re.DOTALL)
    assert form, f"no 'approve together' form for {key}"
    version = re.search(r'<input type="hidden" name="shown_version" value="([^"]*)">', form.group(0))
    assert version, "the group form carries no version"
    members = re.findall(
        rf'<input type="hidden" name="(shown_(?:amount|payload_hash)_[0-9]+)" value="([^"]*)" form="group-form-{key}">',
        page,
    )
    return {"shown_version": version.group(1), **dict(members)}


def snapshot(action: Action) -> dict[str, Any]:
    """What a decision could write, read fresh from the database."""
    fresh = Action.objects.get(pk=action.pk)
    return {
        "status": fresh.status,
        "approvals": Approval.objects.count(),
        "events": ActionEvent.objects.count(),
        "order_version": order_of(action).version,
    }


# --- the inbox -----------------------------------------------------------------------------------


def test_the_inbox_lists_waiting_proposals_oldest_first_with_what_a_manager_needs(
    client: Client, manager: Any, agent_actor: Actor
) -> None:
    older = propose(agent_actor, amount="120.00", customer_name="Grace Hopper")
    newer = propose(agent_actor, amount="75.50", customer_name="Alan Turing", evidence="Order never arrived.")
    client.force_login(manager)

    response = client.get(INBOX)

    assert response.status_code == 200
    page = response.content.decode()
    assert page.index(f'id="action-{older.pk}"') < page.index(f'id="action-{newer.pk}"')
    first = row_html(response, older)
    assert f"Order {order_of(older).number}" in first
    assert "Grace Hopper" in first
    assert "120.00 EUR" in first
    assert "Damaged or defective" in first
    assert "The parcel arrived crushed; photos attached to ticket 4411." in first
    assert "agent <strong>support-bot</strong>" in first
    assert re.search(r"<time [^>]*>(now|a second ago|\d+.seconds ago)</time>", first), "the age is shown"
    assert "Order never arrived." in row_html(response, newer)
    # The manager's own limits, from the conftest persona.
    assert 'up to <span class="money">500.00 EUR</span>' in page
    assert 'up to <span class="money">50,000 JPY</span>' in page


def test_the_inbox_leaves_out_actions_that_are_decided(client: Client, manager: Any, agent_actor: Actor) -> None:
    waiting = propose(agent_actor)
    decided = propose(agent_actor)
    approval_decide(action_pk=decided.pk, user=manager, decision="reject", note="Not ours.")
    client.force_login(manager)

    response = client.get(INBOX)

    assert row_html(response, waiting)
    assert not row_html(response, decided)


def test_the_approve_button_is_greyed_out_with_the_reason_when_the_manager_may_not_approve(
    client: Client, manager: Any, agent_actor: Actor
) -> None:
    """Invariant 10: the page shows the same rule the service enforces (four eyes, limit).

    Rejecting stays possible: saying no moves no money, so it needs neither a limit nor a
    second pair of eyes, and the service accepts it from any manager.
    """
    allowed = propose(agent_actor, amount="120.00")
    over_limit = propose(agent_actor, amount="900.00")
    no_limit = propose(agent_actor, amount="60.00", currency="GBP")
    own_agent = make_agent(manager, name="maria-bot")
    own = propose(Actor.for_agent(own_agent), amount="30.00")
    client.force_login(manager)

    response = client.get(INBOX)

    ok_row = row_html(response, allowed)
    assert "disabled" not in button(ok_row, "approve")
    assert "disabled" not in button(ok_row, "reject")
    expectations = {
        over_limit.pk: ("over_limit", "900.00 EUR is above your approval limit of 500.00 EUR."),
        no_limit.pk: ("no_limit", "You have no approval limit in GBP."),
        own.pk: ("four_eyes", "You proposed this action (or own the agent that did): someone else must approve it."),
    }
    for action in (over_limit, no_limit):
        row = row_html(response, action)
        code, reason = expectations[action.pk]
        assert "disabled" in button(row, "approve")
        assert "disabled" not in button(row, "reject")
        assert f'data-code="{code}">You can\'t approve this one: {reason}</p>' in row
    # Who may not approve under four eyes may not reject either: no reason shown beside an
    # enabled Reject.
    row = row_html(response, own)
    code, reason = expectations[own.pk]
    assert "disabled" in button(row, "approve")
    assert "disabled" in button(row, "reject")
    assert f'data-code="{code}">You can\'t decide this one: {reason}</p>' in row


def test_stale_actions_say_which_binding_failed_and_offer_to_ask_for_a_new_decision(
    client: Client, manager: Any, second_manager: Any, agent_actor: Actor
) -> None:
    stale = make_stale(propose(agent_actor, amount="60.00"), approver=second_manager)
    client.force_login(manager)

    response = client.get(INBOX)

    row = row_html(response, stale)
    assert 'data-status="STALE"' in row
    # In words a clerk understands, with the code word behind "Technical details".
    assert "The order changed after the approval (for example, another refund on it went ahead first)" in row
    technical = row.split("Technical details")[1]
    assert "<code>order_version</code>" in technical
    assert "The order changed since the approval (approved at version 1, now 2)." in technical
    assert f'action="{reverse("approvals-reopen", args=[stale.pk])}"' in row
    assert "Ask for a new decision" in row
    # It is not listed among the proposals waiting for a decision.
    waiting_section = response.content.decode().split('id="stale-heading"')[0]
    assert f'id="action-{stale.pk}"' not in waiting_section


def test_the_inbox_refreshed_with_htmx_returns_only_its_lists(client: Client, manager: Any, agent_actor: Actor) -> None:
    action = propose(agent_actor)
    client.force_login(manager)

    response = client.get(INBOX, headers=HTMX)

    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith('<div id="inbox-lists">')
    assert "HX-Request" in response["Vary"]
    assert "<html" not in body
    assert row_html(response, action)


@pytest.mark.parametrize("persona", ["finance", "agent_owner"])
def test_people_without_the_manager_role_get_a_friendly_403_on_the_inbox_and_detail(
    client: Client, request: pytest.FixtureRequest, persona: str, agent_actor: Actor
) -> None:
    """Invariant 10: only managers see the proposals they would decide."""
    action = propose(agent_actor)
    client.force_login(request.getfixturevalue(persona))

    for url in (INBOX, reverse("approvals-detail", args=[action.pk])):
        response = client.get(url)
        assert response.status_code == 403
        page = response.content.decode()
        assert "You can't open this page" in page
        assert "Approvals are for managers" in page
        assert action.action_id not in page


def test_an_anonymous_visitor_is_sent_to_log_in(client: Client) -> None:
    response = client.get(INBOX)

    assert response.status_code == 302
    assert response["Location"] == f"{reverse('login')}?next={INBOX}"


# --- the detail page -------------------------------------------------------------------------------


def test_the_detail_page_shows_the_orders_money_its_other_actions_the_decisions_and_the_audit_trail(
    client: Client, manager: Any, second_manager: Any, agent_actor: Actor
) -> None:
    order = make_order(captured="300.00")
    earlier = make_succeeded(
        propose(agent_actor, amount="50.00", order=order), approver=second_manager, reference="re_1"
    )
    live = propose(agent_actor, amount="20.00", order=order)
    viewed = make_stale(propose(agent_actor, amount="60.00", order=order), approver=second_manager)
    order.refresh_from_db()
    # Reserving and refunding the earlier refund moved the order to version 3; the correction
    # that made the viewed action stale moved it to 4.
    assert order.version == 4
    client.force_login(manager)

    response = client.get(reverse("approvals-detail", args=[viewed.pk]))

    assert response.status_code == 200
    page = response.content.decode()
    # The order's money and version.
    assert re.search(r"<dt>Captured</dt><dd><span class=\"money\">300.00 EUR</span>", page)
    assert re.search(r"<dt>Refunded</dt><dd><span class=\"money\">50.00 EUR</span>", page)
    assert re.search(r"<dt>Reserved</dt><dd><span class=\"money\">0.00 EUR</span>", page)
    assert re.search(r"<dt>Refundable</dt><dd><span class=\"money\">250.00 EUR</span>", page)
    # What else happened on the order.
    refunds, live_section = page.split("<h3>Refunds already made</h3>")[1].split("<h3>Live actions</h3>")
    assert earlier.action_id in refunds and "re_1" in refunds
    assert live.action_id in live_section.split('id="approvals-heading"')[0]
    # The decision, with its binding, noticed as out of date, and its expiry.
    decisions = page.split('id="approvals-heading"')[1].split('id="trail-heading"')[0]
    assert "mark.manager" in decisions
    assert "order version 3 (now 4)" in decisions.split("Technical details")[1]
    assert viewed.payload_hash[:10] in decisions
    # The approval was never used and the action is stale: no expiry, no "changed since" pill.
    assert "from now" not in decisions and "changed since" not in decisions
    # The audit trail, in order, in words, with the code words behind "Technical details".
    trail = page.split('id="trail-heading"')[1]
    positions = [trail.index(f"<code>{name}</code>") for name in ("propose", "approve", "invalidate")]
    assert positions == sorted(positions)
    assert "<strong>The approval no longer applied</strong>" in trail
    assert "The approval no longer holds: The order changed since the approval" in trail


def test_the_detail_page_of_a_missing_action_is_a_404(client: Client, manager: Any) -> None:
    client.force_login(manager)

    response = client.get(reverse("approvals-detail", args=[999_999]))

    assert response.status_code == 404
    assert "Not found" in response.content.decode()


# --- deciding --------------------------------------------------------------------------------------


def decide_url(action: Action) -> str:
    return reverse("approvals-decide", args=[action.pk])


def test_approving_with_htmx_returns_only_the_updated_row(
    client: Client,
    manager: Any,
    agent_actor: Actor,
    published: list[int],
    django_capture_on_commit_callbacks: Any,
) -> None:
    action = propose(agent_actor)
    client.force_login(manager)

    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(
            decide_url(action),
            {"decision": "approve", "note": "Photos check out.", **shown_now(action)},
            headers=HTMX,
        )

    assert response.status_code == 200
    body = response.content.decode()
    assert body.lstrip().startswith(f'<article class="proposal proposal--success" id="action-{action.pk}"')
    assert "<html" not in body and "<nav" not in body
    assert 'data-status="AUTHORIZED"' in body
    assert "Approved: Refund · 120.00 EUR · Order" in body
    # The card follows the action until it is final.
    # It polls with the order's version its page showed, which its forms keep posting.
    row_url = reverse("approvals-row", args=[action.pk])
    assert f'hx-get="{row_url}?was=AUTHORIZED&amp;shown_version={shown_now(action)["shown_version"]}"' in body
    assert 'value="approve"' not in body, "a decided row offers no more buttons"
    assert Action.objects.get(pk=action.pk).status == S.AUTHORIZED
    approval = Approval.objects.get(action=action)
    assert (approval.approver, approval.note) == (manager, "Photos check out.")
    assert published == [action.pk]


def test_rejecting_with_htmx_replaces_the_row_with_the_rejected_one(
    client: Client, manager: Any, agent_actor: Actor, published: list[int], django_capture_on_commit_callbacks: Any
) -> None:
    action = propose(agent_actor)
    client.force_login(manager)

    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(
            decide_url(action),
            {"decision": "reject", "reason_code": "against_policy", "note": "Outside policy.", **shown_now(action)},
            headers=HTMX,
        )

    assert response.status_code == 200
    body = response.content.decode()
    # Pending: the card offers Undo and follows the rejection until it commits.
    assert 'data-pending="rejection"' in body
    assert "(against our policy). It takes effect in" in body
    assert "Undo the rejection" in body
    assert Action.objects.get(pk=action.pk).status == S.PROPOSED
    # After the window the card's next poll commits it.
    PendingRejection.objects.filter(action=action).update(commit_at=timezone.now() - timedelta(seconds=1))
    polled = client.get(reverse("approvals-row", args=[action.pk]) + "?was=PROPOSED", headers=HTMX)
    assert 'data-status="REJECTED"' in polled.content.decode()
    assert "consoleToast" in polled["HX-Trigger"]
    fresh = Action.objects.get(pk=action.pk)
    assert fresh.status == S.REJECTED
    assert fresh.rejection_reasons == [
        {"code": "rejected_by_manager", "message": "Against our policy. Outside policy."}
    ]
    assert published == []


def test_a_rejection_without_a_reason_is_refused_and_writes_nothing(
    client: Client, manager: Any, agent_actor: Actor
) -> None:
    action = propose(agent_actor)
    client.force_login(manager)

    response = client.post(decide_url(action), {"decision": "reject", "note": "No.", **shown_now(action)}, headers=HTMX)

    assert response.status_code == 400
    assert "Choose a reason for the rejection." in response.content.decode()
    assert not PendingRejection.objects.exists()
    assert Action.objects.get(pk=action.pk).status == S.PROPOSED


def test_approving_without_javascript_redirects_to_the_inbox_with_a_message(
    client: Client, manager: Any, agent_actor: Actor
) -> None:
    action = propose(agent_actor)
    client.force_login(manager)

    response = client.post(decide_url(action), {"decision": "approve", "note": "", **shown_now(action)})

    assert response.status_code == 302
    assert response["Location"] == INBOX
    inbox = client.get(INBOX)
    assert "Approved: Refund · 120.00 EUR · Order" in inbox.content.decode()
    assert not row_html(inbox, action), "the decided proposal left the inbox"
    assert Action.objects.get(pk=action.pk).status == S.AUTHORIZED


# --- refusals: each answers with its own status and writes nothing (invariant 10) --------------------


@pytest.mark.parametrize("htmx", [False, True], ids=["plain-post", "htmx"])
def test_the_owner_of_the_proposing_agent_cannot_approve_its_proposal_even_as_a_manager(
    client: Client, agent_owner: Any, agent_actor: Actor, published: list[int], htmx: bool
) -> None:
    """Invariant 10: approver != proposer (the agent acts for its owner)."""
    owner = make_manager_too(agent_owner, limits={"EUR": "1000"})
    action = propose(agent_actor)
    shown = shown_now(action)
    before = snapshot(action)
    client.force_login(owner)

    response = client.post(decide_url(action), {"decision": "approve", **shown}, headers=HTMX if htmx else {})

    assert response.status_code == 403
    assert "You proposed this action (or own the agent that did): someone else must approve it." in (
        response.content.decode()
    )
    assert "Nothing was changed." in response.content.decode()
    assert snapshot(action) == before
    assert published == []


@pytest.mark.parametrize("htmx", [False, True], ids=["plain-post", "htmx"])
def test_a_manager_cannot_approve_above_their_limit(
    client: Client, second_manager: Any, agent_actor: Actor, published: list[int], htmx: bool
) -> None:
    """Invariant 10: the amount must be within the approver's limit for its currency."""
    action = propose(agent_actor, amount="120.00")
    shown = shown_now(action)
    before = snapshot(action)
    client.force_login(second_manager)

    response = client.post(decide_url(action), {"decision": "approve", **shown}, headers=HTMX if htmx else {})

    assert response.status_code == 403
    assert "120.00 EUR is above your approval limit of 100.00 EUR." in response.content.decode()
    assert snapshot(action) == before
    assert published == []


def test_a_finance_user_cannot_decide_a_proposal(
    client: Client, finance: Any, agent_actor: Actor, published: list[int]
) -> None:
    """Invariant 10: only managers decide proposals."""
    action = propose(agent_actor)
    before = snapshot(action)
    client.force_login(finance)

    for decision in ("approve", "reject"):
        response = client.post(decide_url(action), {"decision": decision})
        assert response.status_code == 403
        assert "You can't open this page" in response.content.decode()
    assert snapshot(action) == before
    assert published == []


def test_a_decision_posted_without_a_csrf_token_is_refused(
    manager: Any, agent_actor: Actor, published: list[int]
) -> None:
    """Invariant 10: a decision only counts when the manager made it on the console's own page."""
    action = propose(agent_actor)
    before = snapshot(action)
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(manager)

    response = strict.post(decide_url(action), {"decision": "approve"})

    assert response.status_code == 403
    assert "This form could not be accepted" in response.content.decode()
    assert snapshot(action) == before
    assert published == []


@pytest.mark.parametrize("htmx", [False, True], ids=["plain-post", "htmx"])
def test_a_manager_who_sees_the_proposal_but_has_no_limit_in_its_currency_cannot_approve_it(
    client: Client, second_manager: Any, agent_actor: Actor, published: list[int], htmx: bool
) -> None:
    """Invariant 10: seeing the inbox is not the right to approve everything in it."""
    action = propose(agent_actor, amount="40.00", currency="USD")
    client.force_login(second_manager)
    page = client.get(INBOX)
    assert page.status_code == 200
    assert "disabled" in button(row_html(page, action), "approve")
    shown = shown_in(row_html(page, action))
    before = snapshot(action)

    response = client.post(decide_url(action), {"decision": "approve", **shown}, headers=HTMX if htmx else {})

    assert response.status_code == 403
    assert "You have no approval limit in USD." in response.content.decode()
    assert snapshot(action) == before
    assert published == []


@pytest.mark.parametrize("htmx", [False, True], ids=["plain-post", "htmx"])
def test_approving_an_action_that_changed_state_since_the_page_loaded_gives_a_clean_409(
    client: Client, manager: Any, second_manager: Any, agent_actor: Actor, published: list[int], htmx: bool
) -> None:
    action = propose(agent_actor, amount="60.00")
    client.force_login(manager)
    page = client.get(INBOX)
    assert "disabled" not in button(row_html(page, action), "approve")
    shown = shown_in(row_html(page, action))
    assert shown == shown_now(action), "the card posts back what it shows"
    # Meanwhile, another manager rejects it.
    approval_decide(action_pk=action.pk, user=second_manager, decision="reject", note="Duplicate ticket.")
    before = snapshot(action)

    response = client.post(decide_url(action), {"decision": "approve", **shown}, headers=HTMX if htmx else {})

    assert response.status_code == 409
    body = response.content.decode()
    assert f"{action.action_id} is rejected now, no longer waiting for a decision." in body
    assert body.count("Nothing was changed.") == 1
    assert snapshot(action) == before
    assert snapshot(action)["status"] == S.REJECTED
    assert published == []
    if htmx:
        assert body.lstrip().startswith("<article")
        assert 'data-status="REJECTED"' in body


def test_an_unknown_decision_is_refused_with_400_naming_the_field(
    client: Client, manager: Any, agent_actor: Actor
) -> None:
    action = propose(agent_actor)
    before = snapshot(action)
    client.force_login(manager)

    response = client.post(decide_url(action), {"decision": "maybe"}, headers=HTMX)

    assert response.status_code == 400
    assert "decision: Select a valid choice." in response.content.decode()
    assert snapshot(action) == before


def test_deciding_on_an_action_that_does_not_exist_is_a_404(client: Client, manager: Any) -> None:
    client.force_login(manager)

    response = client.post(
        reverse("approvals-decide", args=[999_999]),
        {"decision": "approve", "shown_version": "1", "shown_amount": "1.00", "shown_payload_hash": "x"},
    )

    assert response.status_code == 404


def test_the_decision_address_refuses_a_get(client: Client, manager: Any, agent_actor: Actor) -> None:
    action = propose(agent_actor)
    client.force_login(manager)

    response = client.get(decide_url(action) + "?decision=approve")

    assert response.status_code == 405
    assert Action.objects.get(pk=action.pk).status == S.PROPOSED


# --- asking for a new decision ------------------------------------------------------------------------


def test_asking_for_a_new_decision_with_htmx_puts_the_stale_action_back_up_for_decision(
    client: Client, manager: Any, second_manager: Any, agent_actor: Actor
) -> None:
    stale = make_stale(propose(agent_actor, amount="60.00"), approver=second_manager)
    client.force_login(manager)

    card = row_html(client.get(INBOX), stale)

    response = client.post(
        reverse("approvals-reopen", args=[stale.pk]),
        {"note": "Order corrected; please look again.", **shown_in(card)},
        headers=HTMX,
    )

    assert response.status_code == 200
    body = response.content.decode()
    assert "<html" not in body
    assert 'data-status="PROPOSED"' in body
    assert "Asked for a new decision on Refund · " in body
    assert "disabled" not in button(body, "approve")
    event = ActionEvent.objects.filter(action=stale).latest("created_at", "id")
    assert (event.transition, event.actor_user, event.reason) == (
        "reopen",
        manager,
        "Order corrected; please look again.",
    )


def test_asking_for_a_new_decision_without_javascript_redirects_to_the_inbox(
    client: Client, manager: Any, second_manager: Any, agent_actor: Actor
) -> None:
    stale = make_stale(propose(agent_actor, amount="60.00"), approver=second_manager)
    client.force_login(manager)

    response = client.post(reverse("approvals-reopen", args=[stale.pk]), {"note": ""})

    assert response.status_code == 302
    assert response["Location"] == INBOX
    inbox = client.get(INBOX)
    assert "Asked for a new decision on Refund · " in inbox.content.decode()
    waiting_section = inbox.content.decode().split('id="stale-heading"')[0]
    assert f'id="action-{stale.pk}"' in waiting_section


def test_asking_for_a_new_decision_on_an_action_that_is_not_stale_is_a_409(
    client: Client, manager: Any, agent_actor: Actor
) -> None:
    action = propose(agent_actor)
    before = snapshot(action)
    client.force_login(manager)

    response = client.post(reverse("approvals-reopen", args=[action.pk]), {}, headers=HTMX)

    assert response.status_code == 409
    assert f"{action.action_id} is proposed, not stale." in response.content.decode()
    assert snapshot(action) == before


# --- logging in and out, the home page, the navigation --------------------------------------------


def test_a_manager_logs_in_through_the_form_and_sees_their_inbox_size_and_approvals_today(
    client: Client, manager: Any, agent_actor: Actor
) -> None:
    propose(agent_actor)
    approved = propose(agent_actor)
    approval_decide(action_pk=approved.pk, user=manager, decision="approve")
    propose(agent_actor)
    login_page = client.get(reverse("login"))
    assert 'name="username"' in login_page.content.decode()

    response = client.post(reverse("login"), {"username": "maria.manager", "password": PASSWORD}, follow=True)

    assert response.redirect_chain == [(reverse("dashboard"), 302)]
    page = response.content.decode()
    assert '<span class="tile__number" data-testid="inbox-size">2</span>' in page
    assert '<span class="tile__number" data-testid="approved-today">1</span>' in page
    assert f'href="{INBOX}"' in page


def test_a_wrong_password_shows_the_login_form_again_with_an_error(client: Client, manager: Any) -> None:
    response = client.post(reverse("login"), {"username": "maria.manager", "password": "wrong"})

    assert response.status_code == 200
    assert "Please enter a correct username and password." in response.content.decode()
    assert "_auth_user_id" not in client.session


def test_logging_out_is_a_post_from_the_layout_and_ends_the_session(client: Client, manager: Any) -> None:
    client.force_login(manager)
    home = client.get(reverse("dashboard")).content.decode()
    assert re.search(r'<form method="post" action="/logout/"', home)
    assert client.get(reverse("logout")).status_code == 405

    response = client.post(reverse("logout"))

    assert response.status_code == 302
    assert response["Location"] == reverse("login")
    assert client.get(INBOX).status_code == 302


def test_the_navigation_offers_each_role_its_own_pages(
    client: Client, manager: Any, finance: Any, console_admin: Any
) -> None:
    client.force_login(manager)
    assert f'href="{INBOX}"' in client.get(reverse("dashboard")).content.decode()

    client.force_login(finance)
    page = client.get(reverse("dashboard")).content.decode()
    assert f'href="{INBOX}"' not in page
    assert "Finance works the review queue" in page

    client.force_login(console_admin)
    page = client.get(reverse("dashboard")).content.decode()
    assert f'href="{INBOX}"' not in page
    assert f'href="{reverse("admin:index")}"' in page


def test_someone_without_a_role_is_told_to_ask_for_one(client: Client) -> None:
    client.force_login(make_user("nora.nobody"))

    page = client.get(reverse("dashboard")).content.decode()

    assert "Your account has no role in the console yet" in page


def test_a_background_request_after_the_session_ended_says_so_in_the_row(client: Client, agent_actor: Actor) -> None:
    action = propose(agent_actor)

    response = client.post(decide_url(action), {"decision": "approve"}, headers=HTMX, follow=True)

    assert "Your session has ended, so nothing was changed." in response.content.decode()
    assert "<form" not in response.content.decode()
    assert Action.objects.get(pk=action.pk).status == S.PROPOSED


def test_the_inbox_explains_the_auto_approval_threshold_when_it_is_on(
    client: Client, manager: Any, settings: Any
) -> None:
    settings.AUTO_APPROVAL_ENABLED = True
    settings.AUTO_APPROVAL_THRESHOLDS = {"EUR": Decimal("25"), "JPY": Decimal("3000")}
    client.force_login(manager)

    page = client.get(INBOX).content.decode()

    assert '25.00 EUR</span>, <span class="money">3,000 JPY</span>' in page
    assert "are approved automatically and do not come here." in page
