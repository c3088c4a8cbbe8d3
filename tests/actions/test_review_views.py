"""Finance's pages: the review queue, an action's detail, the follow-ups, the dashboard, and who
may open or post to them.

The rules themselves are tested in test_finance_services.py. These tests check what a person
sees and what one click does: exactly the right items in the queue, in the right order, with
filters that survive a refresh; changes swapped in place with htmx; refusals with their own
status code that leave nothing behind (invariants 10 and 11).
"""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from actions.agents.services import agent_token_issue
from actions.engine.claim import submission_begin
from actions.models import (
    Action,
    ActionEvent,
    ActionStatus,
    Attempt,
    Discrepancy,
    DiscrepancyKind,
    DiscrepancyStatus,
    FollowUpStatus,
    LedgerAuditRun,
    Order,
    Remedy,
)
from actions.services import Actor, action_cancel
from approvals.models import Approval
from approvals.services import approval_decide
from tests.actions.test_finance_services import (
    escalated,
    failed,
    settling,
    snapshot,
    stuck_submitting,
    submitting,
    succeeded,
    unknown,
)
from tests.actions.test_reconciliation import authorized_refund
from tests.approvals.test_views import propose
from tests.factories import make_user
from tests.providers.sandbox_client import SandboxClient

pytestmark = pytest.mark.django_db

S = ActionStatus
QUEUE = "/review/"
HTMX = {"HX-Request": "true"}


@pytest.fixture(autouse=True)
def no_broker(dispatched: list[int]) -> list[int]:
    return dispatched


@pytest.fixture
def felix(db: Any) -> Any:
    return make_user("felix.finance", "finance")


def detail_url(action: Action) -> str:
    return reverse("review-action", args=[action.pk])


def row_html(response: Any, kind: str, pk: int) -> str:
    found = re.search(rf'<tr id="queue-{kind}-{pk}".*?</tr>', response.content.decode(), flags=re.DOTALL)
    return found.group(0) if found else ""


def listed(response: Any) -> list[tuple[str, int]]:
    """(kind, pk) of every row in the queue, in page order."""
    return [(kind, int(pk)) for kind, pk in re.findall(r'<tr id="queue-(\w+)-(\d+)"', response.content.decode())]


# --- the queue: exactly the right items ------------------------------------------------------------


def test_the_queue_shows_exactly_the_items_that_need_finance_across_every_state(
    client: Client, finance: Any, manager: Any, agent_actor: Actor, settings: Any
) -> None:
    """Invariant 8: nothing unresolved is hidden from finance, and nothing resolved clutters it.

    One action in every state, seeded deliberately: only NEEDS_REVIEW, UNKNOWN, SETTLING and
    SUBMITTING past its lease are listed, plus the open remedy and the open discrepancy. A
    SUBMITTING action within its lease belongs to its worker and is not listed.
    """
    settings.AUTO_APPROVAL_ENABLED = False
    proposed = propose(agent_actor)
    rejected = propose(agent_actor)
    approval_decide(action_pk=rejected.pk, user=manager, decision="reject", note="No.")
    cancelled = propose(agent_actor)
    action_cancel(action_pk=cancelled.pk, actor=Actor.for_user(manager), reason="Duplicate ticket.")
    stale = propose(agent_actor)
    approval_decide(action_pk=stale.pk, user=manager, decision="approve")
    assert submission_begin(action_pk=stale.pk, now=timezone.now() + timedelta(days=2)).outcome.value == "stale"
    settings.AUTO_APPROVAL_ENABLED = True
    authorized = authorized_refund(agent_actor)
    in_lease = submitting(agent_actor)
    past_lease = stuck_submitting(agent_actor)
    in_settlement = settling(agent_actor)
    done = succeeded(agent_actor)
    gone = failed(agent_actor)
    remedy = Remedy.objects.get(action=gone)
    closed_remedy = Remedy.objects.create(
        action=gone, amount=Decimal("1.00"), currency="EUR", status=FollowUpStatus.DONE
    )
    lost = unknown(agent_actor)
    review = escalated(agent_actor)
    discrepancy = Discrepancy.objects.create(
        kind=DiscrepancyKind.DUPLICATE_EFFECT, action=done, provider_reference="re_2"
    )
    explained = Discrepancy.objects.create(
        kind=DiscrepancyKind.EFFECT_WITHOUT_ACTION, provider_reference="re_x", status=DiscrepancyStatus.EXPLAINED
    )
    assert {a.status for a in Action.objects.all()} == set(S.values) - {S.NEW}
    client.force_login(finance)

    response = client.get(QUEUE)

    assert response.status_code == 200
    assert set(listed(response)) == {
        ("action", review.pk),
        ("action", lost.pk),
        ("action", past_lease.pk),
        ("action", in_settlement.pk),
        ("remedy", remedy.pk),
        ("discrepancy", discrepancy.pk),
    }
    for absent in (proposed, rejected, cancelled, stale, authorized, in_lease, done, gone):
        assert not row_html(response, "action", absent.pk), absent.status
    assert not row_html(response, "remedy", closed_remedy.pk)
    assert not row_html(response, "discrepancy", explained.pk)


def test_the_queue_is_sorted_by_urgency_overdue_first_then_by_state_oldest_first(
    client: Client, finance: Any, agent_actor: Actor
) -> None:
    """Invariant 8: what is overdue, then what only a person can resolve, comes first."""
    in_settlement = settling(agent_actor)
    stuck = stuck_submitting(agent_actor)
    lost = unknown(agent_actor)
    review_new = escalated(agent_actor, owner=finance)
    review_overdue = escalated(agent_actor, owner=finance, due_at=timezone.now() - timedelta(minutes=5))
    older_review = escalated(agent_actor, owner=finance)
    Action.objects.filter(pk=older_review.pk).update(status_changed_at=timezone.now() - timedelta(hours=3))
    client.force_login(finance)

    response = client.get(QUEUE)

    # The stuck SUBMITTING action is overdue too: its lease plus a sweep interval passed long ago.
    assert listed(response) == [
        ("action", review_overdue.pk),
        ("action", stuck.pk),
        ("action", older_review.pk),
        ("action", review_new.pk),
        ("action", lost.pk),
        ("action", in_settlement.pk),
    ]
    assert 'class="is-overdue"' in row_html(response, "action", review_overdue.pk)
    assert '<span class="flag">overdue</span>' in row_html(response, "action", review_overdue.pk)
    assert "overdue" not in row_html(response, "action", review_new.pk)


def test_each_row_shows_owner_age_due_amount_order_attempts_last_answer_and_next_reconciliation(
    client: Client, finance: Any, agent_actor: Actor
) -> None:
    """Invariants 8 and 9: each row names its owner and shows the receiver's last answer, the evidence to act on."""
    lost = unknown(agent_actor)
    review = escalated(agent_actor, owner=finance)
    client.force_login(finance)

    response = client.get(QUEUE)

    row = row_html(response, "action", lost.pk)
    order = Order.objects.get(actions=lost)
    assert "unassigned" in row
    assert '<span class="money">20.00 EUR</span>' in row
    assert f'<a href="/orders/{order.pk}">{order.number}</a><br>' in row and order.customer_name in row
    assert "1 sent" in row and "0 lookups" in row
    assert "AmbiguousError: read timed out (connection_error)" in row
    assert re.search(r"<time [^>]*>in \d+.seconds?</time>|<time [^>]*>now</time>", row), "next reconciliation is shown"
    assert 'badge--unknown">Unknown' in row
    review_row = row_html(response, "action", review.pk)
    assert f"<strong>{finance.username}</strong>" in review_row
    assert "stopped: a person decides" in review_row
    assert re.search(r"<time [^>]*>23.hours from now</time>", review_row), "the due time is shown"


# --- filters ------------------------------------------------------------------------------------


def test_the_filters_narrow_the_queue_and_travel_in_the_query_string(
    client: Client, finance: Any, felix: Any, agent_actor: Actor
) -> None:
    """Invariant 8: each owner can find their own items; the filters survive a refresh."""
    mine = escalated(agent_actor, owner=finance)
    theirs = escalated(agent_actor, owner=felix)
    overdue = escalated(agent_actor, owner=felix, due_at=timezone.now() - timedelta(hours=1))
    nobodys = unknown(agent_actor)
    in_settlement = settling(agent_actor)
    remedy = Remedy.objects.get(action=failed(agent_actor))
    # The worker gave the remedy to the least busy member of finance; here it waits for someone.
    Remedy.objects.filter(pk=remedy.pk).update(owner=None)
    client.force_login(finance)

    def rows(query: str) -> set[tuple[str, int]]:
        response = client.get(QUEUE + query)
        assert response.status_code == 200
        return set(listed(response))

    assert rows("?mine=1") == {("action", mine.pk)}
    assert rows("?unassigned=1") == {("action", nobodys.pk), ("action", in_settlement.pk), ("remedy", remedy.pk)}
    assert rows("?mine=1&unassigned=1") == {
        ("action", mine.pk),
        ("action", nobodys.pk),
        ("action", in_settlement.pk),
        ("remedy", remedy.pk),
    }
    assert rows("?overdue=1") == {("action", overdue.pk)}
    assert rows("?state=NEEDS_REVIEW") == {("action", mine.pk), ("action", theirs.pk), ("action", overdue.pk)}
    assert rows("?state=open") == {("remedy", remedy.pk)}
    assert rows("?kind=remedy") == {("remedy", remedy.pk)}
    assert rows("?kind=action&state=SETTLING") == {("action", in_settlement.pk)}

    page = client.get(QUEUE + "?mine=1&state=NEEDS_REVIEW").content.decode()
    # The form shows the filters in force, and the refresh sends the form's values along.
    assert '<input type="checkbox" name="mine" value="1" checked>' in page
    assert '<option value="NEEDS_REVIEW" selected>' in page
    assert 'hx-include="#queue-filters"' in page
    assert 'hx-trigger="every 5s' in page
    # Changing a filter puts the filters in force into the address bar, without the empty ones.
    changed = client.get(QUEUE + "?mine=1&state=&kind=", headers={**HTMX, "HX-Trigger": "queue-filters"})
    assert changed["HX-Push-Url"] == "/review/?mine=1"
    refreshed = client.get(QUEUE + "?mine=1&state=&kind=", headers={**HTMX, "HX-Trigger": "review-table"})
    assert "HX-Push-Url" not in refreshed


def test_a_bad_filter_is_ignored_with_a_message_not_an_error_page(
    client: Client, finance: Any, agent_actor: Actor
) -> None:
    """Invariant 11: bad input gets a clear message naming the field."""
    lost = unknown(agent_actor)
    client.force_login(finance)

    response = client.get(QUEUE + "?state=EXPLODED&kind=action")

    assert response.status_code == 400
    page = response.content.decode()
    assert "That filter was ignored. state: Select a valid choice." in page
    assert ("action", lost.pk) in listed(response)


def test_the_refresh_answers_with_the_table_alone(client: Client, finance: Any, agent_actor: Actor) -> None:
    """Invariant 8: the queue refreshes itself, so a newly stuck action shows up without a reload."""
    lost = unknown(agent_actor)
    client.force_login(finance)

    response = client.get(QUEUE + "?unassigned=1", headers=HTMX)

    body = response.content.decode()
    assert body.lstrip().startswith('<div id="review-table"')
    assert "<html" not in body
    assert "HX-Request" in response["Vary"]
    assert ("action", lost.pk) in listed(response)
    # The row forms come back to the same filters without JavaScript.
    assert '<input type="hidden" name="next" value="/review/?unassigned=1">' in body


# --- assigning ----------------------------------------------------------------------------------


def test_assign_to_me_from_the_queue_swaps_the_table_and_audits_the_owner(
    client: Client, finance: Any, agent_actor: Actor
) -> None:
    """Invariants 8 and 9: a named owner, recorded in the trail without changing the status."""
    lost = unknown(agent_actor)
    client.force_login(finance)
    assert "Assign to me" in row_html(client.get(QUEUE), "action", lost.pk)

    response = client.post(
        reverse("review-action-assign", args=[lost.pk]), {"origin": "queue", "mine": "1"}, headers=HTMX
    )

    assert response.status_code == 200
    body = response.content.decode()
    assert body.lstrip().startswith('<div id="review-table"')
    assert f"{lost.action_id} now belongs to {finance.username}." in body
    # The table came back with the filter posted along ("mine"): the item is now in it.
    assert listed(response) == [("action", lost.pk)]
    assert f"<strong>{finance.username}</strong>" in row_html(response, "action", lost.pk)
    event = ActionEvent.objects.filter(action=lost).latest("pk")
    assert (event.transition, event.from_state, event.to_state) == ("assign_owner", S.UNKNOWN, S.UNKNOWN)
    assert Action.objects.get(pk=lost.pk).status == S.UNKNOWN


def test_reassigning_without_javascript_redirects_back_to_the_filtered_queue(
    client: Client, finance: Any, felix: Any, agent_actor: Actor
) -> None:
    """Invariant 8: handing an item to a named colleague works without JavaScript too."""
    review = escalated(agent_actor, owner=finance)
    client.force_login(finance)

    response = client.post(
        reverse("review-action-assign", args=[review.pk]),
        {"origin": "queue", "owner": str(felix.pk), "next": "/review/?state=NEEDS_REVIEW"},
    )

    assert response.status_code == 302
    assert response["Location"] == "/review/?state=NEEDS_REVIEW"
    assert Action.objects.get(pk=review.pk).owner == felix
    followed = client.get(response["Location"])
    assert f"{review.action_id} now belongs to {felix.username}." in followed.content.decode()


def test_reassigning_to_someone_outside_finance_is_a_400_naming_the_field(
    client: Client, finance: Any, manager: Any, agent_actor: Actor
) -> None:
    """Invariants 8 and 11: the owner must be able to resolve it; bad input names the field and writes nothing."""
    review = escalated(agent_actor, owner=finance)
    before = snapshot(review)
    client.force_login(finance)

    response = client.post(
        reverse("review-action-assign", args=[review.pk]), {"origin": "queue", "owner": str(manager.pk)}, headers=HTMX
    )

    assert response.status_code == 400
    assert "owner: that person is not an active member of finance." in response.content.decode()
    assert snapshot(review) == before


# --- who may open and post ------------------------------------------------------------------------


@pytest.mark.parametrize("persona", ["manager", "agent_owner"])
def test_people_without_the_finance_role_get_a_friendly_403_and_change_nothing(
    client: Client, request: pytest.FixtureRequest, persona: str, agent_actor: Actor, finance: Any
) -> None:
    """Invariant 10: only finance resolves. A manager cannot see the queue, nor resolve by posting."""
    review = escalated(agent_actor, owner=finance)
    before = snapshot(review)
    client.force_login(request.getfixturevalue(persona))

    for url in (QUEUE, detail_url(review)):
        response = client.get(url)
        assert response.status_code == 403
        assert "the review queue is for finance" in response.content.decode()
    posts = {
        "review-action-resolve": {"resolution": "failed", "reason": "r", "remedy_kind": "cheque"},
        "review-action-assign": {},
        "review-action-lookup": {},
        "review-action-escalate": {},
    }
    for name, data in posts.items():
        assert client.post(reverse(name, args=[review.pk]), data).status_code == 403
    assert snapshot(review) == before


def test_finance_cannot_approve_a_proposal(client: Client, finance: Any, agent_actor: Actor, settings: Any) -> None:
    """Invariant 10: approvals are for managers; finance's role does not reach them."""
    settings.AUTO_APPROVAL_ENABLED = False
    action = propose(agent_actor)
    client.force_login(finance)

    response = client.post(reverse("approvals-decide", args=[action.pk]), {"decision": "approve"})

    assert response.status_code == 403
    assert Action.objects.get(pk=action.pk).status == S.PROPOSED
    assert not Approval.objects.filter(action=action).exists()


def test_an_agent_token_does_not_open_the_browser_console(agent: Any, agent_actor: Actor, finance: Any) -> None:
    """Invariant 10: agents use the API with their token; the console only knows sessions.
    A bearer token is sent to log in, and nothing changes."""
    token = agent_token_issue(agent=agent).plain
    review = escalated(agent_actor, owner=finance)
    before = snapshot(review)
    bearer = Client(headers={"Authorization": f"Bearer {token}"})

    for url in (QUEUE, detail_url(review)):
        response = bearer.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("login"))
    response = bearer.post(
        reverse("review-action-resolve", args=[review.pk]),
        {"resolution": "failed", "reason": "r", "remedy_kind": "cheque"},
    )
    assert response.status_code in (302, 403)
    assert snapshot(review) == before


def test_an_anonymous_visitor_is_sent_to_log_in(client: Client) -> None:
    """Invariant 10: no session, no queue."""
    response = client.get(QUEUE)
    assert response.status_code == 302
    assert response["Location"] == f"{reverse('login')}?next={QUEUE}"


def test_an_admin_can_read_the_queue_but_not_work_it(
    client: Client, console_admin: Any, agent_actor: Actor, finance: Any
) -> None:
    """Invariant 10: admins correct through the admin site; resolving stays with finance."""
    review = escalated(agent_actor, owner=finance)
    before = snapshot(review)
    client.force_login(console_admin)

    response = client.get(QUEUE)
    assert response.status_code == 200
    assert "Read only" in row_html(response, "action", review.pk)
    assert "Look up at the provider now" not in client.get(detail_url(review)).content.decode()
    response = client.post(reverse("review-action-assign", args=[review.pk]), {}, headers=HTMX)
    assert response.status_code == 403
    assert snapshot(review) == before


def test_with_review_owners_only_posting_to_a_colleagues_item_is_refused_and_writes_nothing(
    client: Client, finance: Any, felix: Any, agent_actor: Actor, settings: Any
) -> None:
    """Invariant 10 against an insecure direct object reference: changing the id in a form does
    not let finance act on another owner's item while REVIEW_OWNERS_ONLY is on."""
    settings.REVIEW_OWNERS_ONLY = True
    theirs = escalated(agent_actor, owner=felix)
    remedy = Remedy.objects.get(action=failed(agent_actor))
    remedy.owner = felix
    remedy.save(update_fields=["owner"])
    before = snapshot(theirs)
    client.force_login(finance)

    page = client.get(QUEUE).content.decode()
    assert f'title="This item belongs to {felix.username}.' in page
    detail = client.get(detail_url(theirs)).content.decode()
    assert "Record as succeeded" not in detail
    for name, data in {
        "review-action-resolve": {"resolution": "succeeded", "reason": "r", "provider_reference": "re_1"},
        "review-action-assign": {},
        "review-action-lookup": {},
    }.items():
        response = client.post(reverse(name, args=[theirs.pk]), data, headers=HTMX)
        assert response.status_code == 403, name
        assert f"This item belongs to {felix.username}." in response.content.decode()
    for name in ("review-remedy-assign", "review-remedy-advance"):
        response = client.post(reverse(name, args=[remedy.pk]), {"status": "in_progress"}, headers=HTMX)
        assert response.status_code == 403
    assert snapshot(theirs) == before
    remedy.refresh_from_db()
    assert (remedy.owner, remedy.status) == (felix, FollowUpStatus.OPEN)


# --- the detail page ----------------------------------------------------------------------------


def test_the_detail_page_tells_the_whole_story_with_the_idempotency_key(
    client: Client, finance: Any, agent_actor: Actor
) -> None:
    """Invariants 4, 6 and 9: the key, the approval's binding and every event and attempt are on one page."""
    review = escalated(agent_actor, owner=finance)
    client.force_login(finance)

    response = client.get(detail_url(review))

    assert response.status_code == 200
    page = response.content.decode()
    assert f'<code data-testid="idempotency-key">{review.idempotency_key}</code>' in page
    timeline = page.split('id="timeline"')[1]
    # Proposal and validation, the auto-approval with its binding, the reservation, the
    # submission with its request and error, and the escalation, in order.
    # Each step in words, with its code word behind "Technical details".
    order = [
        "<code>propose</code>",
        "<code>approve</code>",
        "on the order as it was then (version 1)",
        "<strong>Sent to the payment provider</strong>",
        "<code>begin_submission</code>",
        "<strong>Sent to the provider</strong>",
        "did not answer in time; we do not know yet whether the refund was made",
        "AmbiguousError: read timed out",
        "<strong>No clear answer from the payment provider</strong>",
        "<code>mark_unknown</code>",
        "<code>escalate</code>",
    ]
    positions = [timeline.index(text) for text in order]
    assert positions == sorted(positions)
    assert "&quot;idempotency_key&quot;: &quot;" + review.idempotency_key in timeline, "the request sent is shown"
    assert "Validation passed." in timeline
    # Resolutions for NEEDS_REVIEW; the retry waits for a fresh not-found lookup.
    assert "Record as succeeded" in page and "Record as failed" in page
    assert re.search(
        r'<button type="submit" class="button button--primary" disabled[^>]*>Retry with the same key', page
    )
    assert "Look the action up at the provider first" in page


def test_an_unknown_action_offers_the_lookup_and_escalate_to_me(
    client: Client, finance: Any, agent_actor: Actor
) -> None:
    """Invariants 7 and 8: an UNKNOWN action is looked up or taken over, never resolved blindly."""
    lost = unknown(agent_actor)
    client.force_login(finance)

    page = client.get(detail_url(lost)).content.decode()
    assert "Look up at the provider now" in page
    assert "Escalate to me now" in page
    assert "Record as succeeded" not in page

    response = client.post(reverse("review-action-escalate", args=[lost.pk]), {"reason": "On the phone."}, headers=HTMX)

    assert response.status_code == 200
    body = response.content.decode()
    assert body.lstrip().startswith('<div id="review-detail" data-status="NEEDS_REVIEW"')
    assert "belongs to you" in body
    assert "Record as succeeded" in body
    assert Action.objects.get(pk=lost.pk).owner == finance


def test_a_resolution_without_a_reason_is_a_400_naming_the_field_and_changes_nothing(
    client: Client, finance: Any, agent_actor: Actor
) -> None:
    """Invariant 11, through the page: a clear message, nothing written, nobody asked."""
    review = escalated(agent_actor, owner=finance)
    before = snapshot(review)
    client.force_login(finance)

    response = client.post(
        reverse("review-action-resolve", args=[review.pk]),
        {"resolution": "succeeded", "provider_reference": "re_1", "reason": ""},
        headers=HTMX,
    )

    assert response.status_code == 400
    assert "<strong>Not done.</strong> reason: Give a reason for the audit trail. Nothing was changed." in (
        response.content.decode()
    )
    assert snapshot(review) == before
    assert not Attempt.objects.filter(action=review, kind="lookup").exists()
    response = client.post(reverse("review-action-resolve", args=[review.pk]), {"resolution": "maybe"})
    assert response.status_code == 400
    assert "resolution: choose one of succeeded, retry, failed, resend." in response.content.decode()


def test_pages_and_posts_for_missing_items_are_404s(client: Client, finance: Any) -> None:
    """Invariant 11: a bad address is a clear 404 (and a GET to a change is a 405), never a 500."""
    client.force_login(finance)
    for url in ("/review/actions/999999/", "/review/remedies/999999/", "/review/discrepancies/999999/"):
        assert client.get(url).status_code == 404
    assert client.post("/review/actions/999999/assign", {}).status_code == 404
    assert client.get(reverse("review-action-assign", args=[1])).status_code == 405


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_looking_up_and_resolving_from_the_page_swaps_the_detail_in_place(
    client: Client, live_sandbox: SandboxClient, finance: Any, agent_actor: Actor
) -> None:
    """Invariants 2 and 5 through the page: the lookup shows the provider's refund; confirming it
    records SUCCEEDED and books the order's money."""
    review = escalated(agent_actor, owner=finance)
    live_sandbox.seed_charge(review.payload["charge"], 10000, "eur")
    reference = live_sandbox.plant_refund(
        charge=review.payload["charge"], amount=2000, metadata={"action_id": review.action_id}
    )["id"]
    client.force_login(finance)

    looked = client.post(reverse("review-action-lookup", args=[review.pk]), {"origin": "detail"}, headers=HTMX)

    assert looked.status_code == 200
    body = looked.content.decode()
    assert f"The provider answered: Lookup found refund {reference} succeeded (20.00 EUR)." in body
    assert f'name="provider_reference" maxlength="255" value="{reference}"' in body

    resolved = client.post(
        reverse("review-action-resolve", args=[review.pk]),
        {"origin": "detail", "resolution": "succeeded", "provider_reference": reference, "reason": "Found it."},
        headers=HTMX,
    )

    assert resolved.status_code == 200
    body = resolved.content.decode()
    assert 'data-status="SUCCEEDED"' in body
    assert 'data-testid="order-refunded"><span class="money">20.00 EUR</span>' in body
    assert Action.objects.get(pk=review.pk).status == S.SUCCEEDED


# --- follow-ups -------------------------------------------------------------------------------------


def test_a_remedy_is_worked_from_its_page(client: Client, finance: Any, agent_actor: Actor) -> None:
    """Invariant 8 for the customer's money: the remedy is worked to done; a bad kind is a 400 naming the field."""
    remedy = Remedy.objects.get(action=failed(agent_actor))
    url = reverse("review-remedy", args=[remedy.pk])
    client.force_login(finance)
    assert "Start work" in client.get(url).content.decode()

    started = client.post(
        reverse("review-remedy-advance", args=[remedy.pk]), {"status": "in_progress", "note": "Called."}
    )
    assert started.status_code == 302 and started["Location"] == url
    refused = client.post(
        reverse("review-remedy-advance", args=[remedy.pk]), {"status": "done", "remedy_kind": "undecided", "note": "x"}
    )
    assert refused.status_code == 400
    assert "remedy_kind: choose how the customer gets the money" in refused.content.decode()
    done = client.post(
        reverse("review-remedy-advance", args=[remedy.pk]),
        {"status": "done", "remedy_kind": "cheque", "note": "Cheque 1042 posted."},
        headers=HTMX,
    )

    assert done.status_code == 200
    assert 'data-testid="follow-up-status">Done' in done.content.decode()
    remedy.refresh_from_db()
    assert (remedy.status, remedy.kind, remedy.owner) == ("done", "cheque", finance)
    assert "Cheque 1042 posted." in remedy.note


def test_a_discrepancy_is_taken_and_explained_from_its_page(client: Client, finance: Any) -> None:
    """Invariants 1 and 8: a discrepancy found by the audit gets a named owner and an explanation."""
    discrepancy = Discrepancy.objects.create(kind=DiscrepancyKind.EFFECT_WITHOUT_ACTION, provider_reference="re_stray")
    client.force_login(finance)

    client.post(reverse("review-discrepancy-assign", args=[discrepancy.pk]), {})
    client.post(reverse("review-discrepancy-advance", args=[discrepancy.pk]), {"status": "in_progress"})
    no_note = client.post(reverse("review-discrepancy-advance", args=[discrepancy.pk]), {"status": "explained"})
    assert no_note.status_code == 400
    client.post(
        reverse("review-discrepancy-advance", args=[discrepancy.pk]),
        {"status": "explained", "note": "Refunded by hand in the provider's dashboard."},
    )

    discrepancy.refresh_from_db()
    assert (discrepancy.status, discrepancy.owner) == ("explained", finance)
    page = client.get(reverse("review-discrepancy", args=[discrepancy.pk])).content.decode()
    assert "Refunded by hand in the provider&#x27;s dashboard." in page
    assert "Work on it" not in page


# --- the home page ----------------------------------------------------------------------------------


def test_finance_sees_open_items_by_state_and_a_chart_of_stuck_actions_by_age(
    client: Client, finance: Any, agent_actor: Actor
) -> None:
    """Invariant 8 at a glance: nothing stuck goes unnoticed; the chart is server-side SVG, no script."""
    escalated(agent_actor, owner=finance)
    old = unknown(agent_actor)
    Action.objects.filter(pk=old.pk).update(status_changed_at=timezone.now() - timedelta(hours=30))
    middle = settling(agent_actor)
    Action.objects.filter(pk=middle.pk).update(status_changed_at=timezone.now() - timedelta(hours=2))
    failed(agent_actor)
    client.force_login(finance)

    page = client.get("/").content.decode()

    assert re.search(r'data-testid="open-needs_review">\s*<span class="tile__number">1</span>', page)
    assert re.search(r'data-testid="open-unknown">\s*<span class="tile__number">1</span>', page)
    assert re.search(r'data-testid="open-remedy">\s*<span class="tile__number">1</span>', page)
    assert 'data-testid="stuck-total">3</span>' in page
    chart = page.split('data-testid="stuck-chart"')[1].split("</svg>")[0]
    assert re.findall(r'data-bucket="([^"]+)" data-count="(\d+)"', chart) == [
        ("&lt; 1 h", "1"),
        ("1-4 h", "1"),
        ("4-24 h", "0"),
        ("&gt; 24 h", "1"),
    ]
    assert "<script" not in chart
    # Fiona's: the action escalated to her, and the remedy the worker gave her (the only member).
    assert 'data-testid="mine-count">Yours: 2</a>' in page


def test_a_manager_keeps_the_approvals_summary_and_everyone_sees_the_ledger_audit(
    client: Client, manager: Any, agent_actor: Actor
) -> None:
    """Invariant 1 in public: everyone sees whether the ledger audit found effects that do not add up."""
    run = LedgerAuditRun.objects.create(
        started_at=timezone.now() - timedelta(minutes=5),
        finished_at=timezone.now() - timedelta(minutes=4),
        effects_seen=12,
        actions_checked=10,
        discrepancies_found=2,
        discrepancies_new=1,
    )
    statuses = {"re_a": DiscrepancyStatus.OPEN, "re_b": DiscrepancyStatus.OPEN, "re_c": DiscrepancyStatus.EXPLAINED}
    for reference, status in statuses.items():
        Discrepancy.objects.create(
            kind=DiscrepancyKind.EFFECT_WITHOUT_ACTION, provider_reference=reference, status=status
        )
    client.force_login(manager)

    page = client.get("/").content.decode()

    assert 'data-testid="inbox-size"' in page
    assert "Stuck actions by age" not in page
    audit = page.split('data-testid="ledger-audit"')[1]
    assert "2 open discrepancies" in audit and "Ledgers agree" not in audit
    assert "12 effects at the receivers compared with 10 actions; 1 new discrepancy." in audit
    nobody = make_user("nora.nobody")
    client.force_login(nobody)
    assert "12 effects at the receivers" in client.get("/").content.decode()
    assert run.ok is False


def test_the_ledgers_agree_only_once_no_discrepancy_is_open_whichever_run_found_it(
    client: Client, finance: Any
) -> None:
    """The audit reads only what is new since its last run: a clean latest run says nothing of
    an earlier run's finding that nobody has closed."""
    earlier = Discrepancy.objects.create(kind=DiscrepancyKind.EFFECT_WITHOUT_ACTION, provider_reference="re_old")
    LedgerAuditRun.objects.create(
        started_at=timezone.now() - timedelta(minutes=5), finished_at=timezone.now() - timedelta(minutes=4)
    )
    client.force_login(finance)
    audit = client.get("/").content.decode().split('data-testid="ledger-audit"')[1]
    assert "1 open discrepancy" in audit and "Ledgers agree" not in audit

    # A run that could not finish says so, and the open finding of an earlier run still shows.
    LedgerAuditRun.objects.create(started_at=timezone.now(), error="the receiver did not answer")
    audit = client.get("/").content.decode().split('data-testid="ledger-audit"')[1]
    assert "could not finish: the receiver did not answer" in audit
    assert "1 open discrepancy</span> from earlier runs" in audit and "Ledgers agree" not in audit

    Discrepancy.objects.filter(pk=earlier.pk).update(status=DiscrepancyStatus.EXPLAINED)
    LedgerAuditRun.objects.create(started_at=timezone.now(), finished_at=timezone.now())
    audit = client.get("/").content.decode().split('data-testid="ledger-audit"')[1]
    assert "Ledgers agree" in audit and "open discrepanc" not in audit


def test_the_ledger_audit_says_when_it_never_ran(client: Client, finance: Any) -> None:
    """Invariant 1: an audit that never ran is said so, not shown as clean."""
    client.force_login(finance)
    assert "The ledger audit has not run yet." in client.get("/").content.decode()


# --- the demo seed --------------------------------------------------------------------------------


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_the_demo_seed_puts_actions_in_every_state_and_running_it_again_changes_nothing(
    live_sandbox: SandboxClient, settings: Any
) -> None:
    """Invariants 5 and 8 hold for the demo data: every state is shown, built through the services."""
    settings.DEBUG = True  # seed_demo refuses to run in production
    call_command("seed_demo", "--sandbox", live_sandbox.url, stdout=_Sink(), stderr=_Sink())

    statuses = set(Action.objects.values_list("status", flat=True))
    assert statuses >= {
        S.PROPOSED,
        S.REJECTED,
        S.STALE,
        S.CANCELLED,
        S.SUBMITTING,
        S.SETTLING,
        S.SUCCEEDED,
        S.FAILED_FINAL,
        S.UNKNOWN,
        S.NEEDS_REVIEW,
    }
    review = Action.objects.get(status=S.NEEDS_REVIEW)
    assert review.owner is not None and review.owner.username == "fiona"
    assert Remedy.objects.filter(action__status=S.FAILED_FINAL, status="open").exists()
    assert Discrepancy.objects.filter(status="open").exists()
    for order in Order.objects.all():
        from tests.approvals.test_reservation import assert_order_money_adds_up

        assert_order_money_adds_up(order)
    counts = (Action.objects.count(), ActionEvent.objects.count(), Discrepancy.objects.count())

    call_command("seed_demo", "--sandbox", live_sandbox.url, stdout=_Sink(), stderr=_Sink())

    assert (Action.objects.count(), ActionEvent.objects.count(), Discrepancy.objects.count()) == counts


class _Sink:
    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass
