"""The admin site for corrections (docs/architecture.md section 1: "Admins: the Django admin
site for corrections ... Corrections go through the same services as everything else").

Everything here goes through the admin's pages as a browser would: change lists, change forms,
the FSM transition forms and the admin actions.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from itertools import count
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from actions.admin.base import EstimatedCountPaginator
from actions.agents.services import AgentAuthenticationFailed, agent_authenticate, agent_token_issue, token_hash
from actions.engine.claim import ClaimOutcome, submission_begin
from actions.models import (
    Action,
    ActionEvent,
    ActionKind,
    ActionStatus,
    AgentToken,
    Attempt,
    AttemptKind,
    Discrepancy,
    DiscrepancyKind,
    DiscrepancyStatus,
    LedgerAuditRun,
    OwnerGroup,
    Remedy,
)
from actions.review.corrections import discrepancy_compensate
from actions.services import Actor
from approvals.models import Decision
from approvals.services import approval_decide
from tests.actions.test_corrections import duplicate_found, needs_review, refund_of, succeeded_refund
from tests.approvals.test_decisions import make_stale
from tests.factories import make_agent, make_user

pytestmark = pytest.mark.django_db

S = ActionStatus
_names = count(1)


@pytest.fixture(autouse=True)
def manual_decisions(settings: Any) -> None:
    settings.AUTO_APPROVAL_ENABLED = False


@pytest.fixture(autouse=True)
def published(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The dispatches published on commit, by action pk, instead of publishing to the broker."""
    calls: list[int] = []
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", calls.append)
    return calls


@pytest.fixture
def admin_client(client: Client, console_admin: User) -> Client:
    # The admin role does not grant the ledger audit runs yet (see the report for console/roles.py).
    console_admin.user_permissions.add(Permission.objects.get(codename="view_ledgerauditrun"))
    client.force_login(console_admin)
    return client


@pytest.fixture
def admin_and_manager(db: Any) -> User:
    """An admin who also holds the manager's role, and so may ask for a new decision."""
    return make_user("max.admin", "admin", "manager", limits={"EUR": "500"}, is_staff=True)


def login(client: Client, user: User) -> Client:
    client.force_login(user)
    return client


def change_url(action: Action) -> str:
    return f"/admin/actions/action/{action.pk}/change/"


def transition_url(action: Action, name: str) -> str:
    return f"/admin/actions/action/{action.pk}/transition/{name}/"


def offered(client: Client, action: Action) -> set[str]:
    """The corrections the action's admin page offers this person."""
    response = client.get(change_url(action))
    assert response.status_code == 200
    page = response.content.decode()
    return set(re.findall(r'data-transition="([a-z_]+)"', page)) | set(re.findall(r'data-correction="([a-z_]+)"', page))


class _FormInputs(HTMLParser):
    """The fields a browser would submit with a page's first POST form."""

    def __init__(self) -> None:
        super().__init__()
        self.fields: dict[str, str] = {}
        self._in_form = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "form" and (values.get("method") or "").lower() == "post":
            self._in_form = True
        elif (
            self._in_form
            and tag in ("input", "textarea", "select")
            and values.get("name")
            and values.get("type") not in ("submit", "checkbox")
        ):
            self.fields[values["name"] or ""] = values.get("value") or ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._in_form = False


def form_inputs(page: str) -> dict[str, str]:
    parser = _FormInputs()
    parser.feed(page)
    return parser.fields


def messages_of(response: Any) -> list[str]:
    return [str(message) for message in response.context["messages"]]


# --- the change lists ------------------------------------------------------------------------

CHANGE_LISTS = [
    "/admin/actions/order/",
    "/admin/actions/refundrequest/",
    "/admin/actions/action/",
    "/admin/actions/actionevent/",
    "/admin/actions/attempt/",
    "/admin/actions/remedy/",
    "/admin/actions/discrepancy/",
    "/admin/actions/ledgerauditrun/",
    "/admin/actions/ownergroup/",
    "/admin/actions/agent/",
    "/admin/actions/agenttoken/",
    "/admin/approvals/approval/",
    "/admin/approvals/approvallimit/",
]

# The tables that grow without bound: their lists use the estimating paginator.
BIG_TABLE_LISTS = [
    url for url in CHANGE_LISTS if url.rsplit("/", 2)[-2] not in ("ownergroup", "agent", "approvallimit")
]


def add_rows(*, rounds: int, proposer: Actor, approver: User) -> None:
    """Rows in every table the admin lists, each with the related rows its list shows."""
    finance = User.objects.get(username="fiona.finance")
    for number in range(rounds):
        authorized = refund_of(proposer)
        approval_decide(action_pk=authorized.pk, user=approver, decision=Decision.APPROVE)
        escalated = needs_review(proposer, approver)  # owned by a named person
        Attempt.objects.create(action=authorized, kind=AttemptKind.LOOKUP, started_at=timezone.now())
        Remedy.objects.create(action=escalated, amount=escalated.amount, currency="EUR", owner=finance)
        Discrepancy.objects.create(
            kind=DiscrepancyKind.DUPLICATE_EFFECT,
            action=escalated,
            provider_reference=f"re_{next(_names)}",
            details={"refunds": [], "count": 2},
            owner=finance,
        )
        LedgerAuditRun.objects.create(started_at=timezone.now())
        agent = make_agent(make_user(f"owner.{next(_names)}", "agent"), name=f"bot-{next(_names)}")
        agent_token_issue(agent=agent)
        make_user(f"manager.{next(_names)}", "manager", limits={"EUR": "100", "USD": "100"})
        OwnerGroup.objects.get_or_create(
            kind=list(ActionKind.values)[number % 2],
            defaults={"group_id": finance.groups.get().pk},
        )


def test_every_change_list_runs_as_many_queries_for_many_rows_as_for_few(
    admin_client: Client, agent_actor: Actor, manager: Any, finance: Any
) -> None:
    """An admin's change lists stay fast as the tables grow: no query per row."""

    def queries() -> dict[str, int]:
        counts = {}
        for url in CHANGE_LISTS:
            with CaptureQueriesContext(connection) as captured:
                response = admin_client.get(url)
            assert response.status_code == 200, url
            counts[url] = len(captured.captured_queries)
        return counts

    add_rows(rounds=1, proposer=agent_actor, approver=manager)
    few = queries()
    add_rows(rounds=6, proposer=agent_actor, approver=manager)
    many = queries()

    assert admin_client.get("/admin/actions/action/").content.decode().count('class="field-action_id"') == 14
    assert many == few


@pytest.mark.postgres
@pytest.mark.parametrize("url", [*BIG_TABLE_LISTS, "/admin/actions/action/?status__exact=PROPOSED&q=x"])
def test_no_list_page_counts_a_whole_table(admin_client: Client, agent_actor: Actor, url: str) -> None:
    """A COUNT(*) over millions of rows takes seconds; every count here stops at a LIMIT. Nor do the
    filters list their choices with a SELECT DISTINCT over the whole table."""
    refund_of(agent_actor)

    with CaptureQueriesContext(connection) as captured:
        response = admin_client.get(url)

    assert response.status_code == 200
    queries = [query["sql"].upper() for query in captured.captured_queries]
    assert [sql for sql in queries if "COUNT(" in sql and "LIMIT" not in sql] == []
    assert [sql for sql in queries if "SELECT DISTINCT" in sql and "WHERE" not in sql] == []


@pytest.mark.postgres
def test_a_big_unfiltered_list_shows_the_planners_estimate_and_a_filtered_one_a_capped_count(
    admin_client: Client, agent_actor: Actor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(EstimatedCountPaginator, "count_cap", 3)
    for _ in range(5):
        refund_of(agent_actor)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE actions_action")

    with CaptureQueriesContext(connection) as captured:
        unfiltered = admin_client.get("/admin/actions/action/")
    filtered = admin_client.get("/admin/actions/action/?status__exact=PROPOSED")

    assert "about 5 actions" in unfiltered.content.decode()
    assert not [q for q in captured.captured_queries if "COUNT(" in q["sql"] and '"actions_action"' in q["sql"]]
    assert "more than 3 actions" in filtered.content.decode()


def test_the_action_list_finds_an_action_by_its_id_its_order_or_the_receivers_reference(
    admin_client: Client, agent_actor: Actor, manager: Any
) -> None:
    found = succeeded_refund(agent_actor, manager, reference="re_found")
    other = refund_of(agent_actor)
    assert found.order is not None

    for term in (found.action_id, found.order.number, "re_found"):
        page = admin_client.get("/admin/actions/action/", {"q": term}).content.decode()
        assert found.action_id in page, term
        assert other.action_id not in page, term


# --- material fields and the audit trail are read-only ---------------------------------------


def test_the_change_form_cannot_change_an_actions_material_fields(admin_client: Client, agent_actor: Actor) -> None:
    """Invariant 4: a POST of the change form with another amount, payload or status changes nothing."""
    action = refund_of(agent_actor)
    before = Action.objects.values().get(pk=action.pk)
    events_before = ActionEvent.objects.filter(action=action).count()
    page = admin_client.get(change_url(action)).content.decode()
    assert 'name="_save"' not in page, "there is nothing to save"
    data = form_inputs(page)
    data.update(
        {
            "amount": "999.00",
            "currency": "USD",
            "payload": '{"amount": "999.00"}',
            "action_id": "refund:order-1:request-9",
            "status": "SUCCEEDED",
            "owner": str(User.objects.get(username="adam.admin").pk),
            "_save": "Save",
        }
    )

    response = admin_client.post(change_url(action), data, follow=True)

    assert response.status_code == 200
    assert Action.objects.values().get(pk=action.pk) == before
    assert ActionEvent.objects.filter(action=action).count() == events_before
    assert any("Nothing on an action is edited" in message for message in messages_of(response))


def test_actions_cannot_be_added_or_deleted_in_the_admin(admin_client: Client, agent_actor: Actor) -> None:
    """Invariants 4 and 9: actions come from the intent log and stay, with their trail."""
    action = refund_of(agent_actor)

    assert admin_client.get("/admin/actions/action/add/").status_code == 403
    assert admin_client.post(f"/admin/actions/action/{action.pk}/delete/", {"post": "yes"}).status_code == 403
    assert Action.objects.filter(pk=action.pk).exists()


def test_audit_events_cannot_be_added_changed_or_deleted_in_the_admin(admin_client: Client, agent_actor: Actor) -> None:
    """Invariant 9: the audit trail is append-only, in the admin as everywhere."""
    action = refund_of(agent_actor)
    event = ActionEvent.objects.get(action=action)
    before = ActionEvent.objects.values().get(pk=event.pk)
    url = f"/admin/actions/actionevent/{event.pk}/"

    view = admin_client.get(url + "change/")
    assert view.status_code == 200, "an admin reads the trail"
    assert 'name="_save"' not in view.content.decode()
    assert admin_client.get("/admin/actions/actionevent/add/").status_code == 403
    changed = {"transition": "approve", "to_state": "AUTHORIZED", "reason": "rewritten", "actor_label": "someone"}
    assert admin_client.post(url + "change/", changed).status_code == 403
    assert admin_client.post(url + "delete/", {"post": "yes"}).status_code == 403
    bulk = admin_client.post(
        "/admin/actions/actionevent/", {"action": "delete_selected", "_selected_action": [event.pk], "post": "yes"}
    )
    assert bulk.status_code in (200, 302)

    assert ActionEvent.objects.values().get(pk=event.pk) == before


# --- state changes through the FSM admin and the services -------------------------------------


def test_the_admin_offers_an_admin_only_the_transitions_their_role_permits(
    client: Client, console_admin: User, admin_and_manager: User, agent_actor: Actor, manager: Any
) -> None:
    """Invariant 10: cancelling is an admin's; asking for a new decision is a manager's."""
    proposed = refund_of(agent_actor)
    stale = make_stale(refund_of(agent_actor), manager)

    login(client, console_admin)
    assert offered(client, proposed) == {"cancel"}
    assert offered(client, stale) == {"cancel"}
    login(client, admin_and_manager)
    assert offered(client, stale) == {"cancel", "reopen"}
    # Approving is a manager's decision in the inbox, where the binding is shown: never here.
    assert offered(client, proposed) == {"cancel"}


def test_worker_transitions_are_never_offered_even_to_a_superuser(
    client: Client, agent_actor: Actor, manager: Any
) -> None:
    """Invariants 3 and 9: record_success, mark_unknown, begin_submission... belong to the worker."""
    superuser = User.objects.create_superuser("root", "root@example.com", "x")
    submitting = refund_of(agent_actor)
    approval_decide(action_pk=submitting.pk, user=manager, decision=Decision.APPROVE)
    assert submission_begin(action_pk=submitting.pk).outcome == ClaimOutcome.CLAIMED
    login(client, superuser)

    assert offered(client, Action.objects.get(pk=submitting.pk)) == {"assign_owner"}
    for name in ("record_success", "mark_unknown", "begin_submission", "escalate", "resolve_succeeded", "save"):
        assert client.get(transition_url(submitting, name)).status_code == 404, name
    page = client.get(change_url(submitting)).content.decode()
    response = client.post(change_url(submitting), {**form_inputs(page), "_fsm_transition_to": "record_success"})
    assert response.status_code == 302
    assert Action.objects.get(pk=submitting.pk).status == S.SUBMITTING


def test_cancelling_in_the_admin_runs_the_cancel_service_and_writes_the_audit_event(
    admin_client: Client, console_admin: User, agent_actor: Actor
) -> None:
    """Invariant 9: the admin's cancel is the service's cancel, with its event in the same transaction."""
    action = refund_of(agent_actor)
    form = admin_client.get(transition_url(action, "cancel"))
    assert form.status_code == 200
    assert 'name="reason"' in form.content.decode()

    response = admin_client.post(transition_url(action, "cancel"), {"reason": "The customer withdrew the request."})

    assert response.status_code == 302
    assert response["Location"] == change_url(action)
    assert Action.objects.get(pk=action.pk).status == S.CANCELLED
    event = ActionEvent.objects.filter(action=action).last()
    assert event is not None
    assert (event.transition, event.from_state, event.to_state) == ("cancel", S.PROPOSED, S.CANCELLED)
    assert event.actor_user == console_admin
    assert event.reason == "The customer withdrew the request."


def test_the_change_forms_transition_button_leads_to_the_reason_form(admin_client: Client, agent_actor: Actor) -> None:
    action = refund_of(agent_actor)

    response = admin_client.post(
        change_url(action),
        {**form_inputs(admin_client.get(change_url(action)).content.decode()), "_fsm_transition_to": "cancel"},
    )

    assert response.status_code == 302
    assert response["Location"] == transition_url(action, "cancel")
    assert Action.objects.get(pk=action.pk).status == S.PROPOSED


def test_reopening_in_the_admin_runs_the_reopen_service_and_writes_the_audit_event(
    client: Client, admin_and_manager: User, agent_actor: Actor, manager: Any
) -> None:
    stale = make_stale(refund_of(agent_actor), manager)
    login(client, admin_and_manager)

    response = client.post(transition_url(stale, "reopen"), {"reason": "The order changed; look again."})

    assert response.status_code == 302
    assert Action.objects.get(pk=stale.pk).status == S.PROPOSED
    event = ActionEvent.objects.filter(action=stale).last()
    assert event is not None
    assert (event.transition, event.from_state, event.to_state) == ("reopen", S.STALE, S.PROPOSED)
    assert event.actor_user == admin_and_manager
    assert event.reason == "The order changed; look again."


def test_a_transition_the_person_may_not_run_is_refused_and_changes_nothing(
    admin_client: Client, agent_actor: Actor, manager: Any
) -> None:
    """Invariant 10: a pure admin is no manager; a finished action cannot be cancelled."""
    stale = make_stale(refund_of(agent_actor), manager)
    done = succeeded_refund(agent_actor, manager)

    reopen = admin_client.post(transition_url(stale, "reopen"), {"reason": "Let me."}, follow=True)
    cancel = admin_client.post(transition_url(done, "cancel"), {"reason": "Too late."}, follow=True)

    assert Action.objects.get(pk=stale.pk).status == S.STALE
    assert Action.objects.get(pk=done.pk).status == S.SUCCEEDED
    assert any("not possible now, or not yours" in message for message in messages_of(reopen))
    assert any("not possible now, or not yours" in message for message in messages_of(cancel))
    assert not ActionEvent.objects.filter(transition__in=["reopen", "cancel"]).exists()


@pytest.mark.parametrize("role", ["manager", "finance"])
def test_staff_without_the_admin_role_cannot_correct_an_action(
    client: Client, role: str, agent_actor: Actor, finance: Any
) -> None:
    """Invariant 10: only admins correct, even a manager who may cancel in the console."""
    staff = make_user(f"staff.{role}", role, limits={"EUR": "500"}, is_staff=True)
    action = refund_of(agent_actor)
    login(client, staff)

    assert offered(client, action) == set()
    assert client.get(transition_url(action, "cancel")).status_code == 403
    assert client.post(transition_url(action, "cancel"), {"reason": "Mine now."}).status_code == 403
    assert client.get(f"/admin/actions/action/{action.pk}/assign-owner/").status_code == 403
    owner = {"owner": str(finance.pk), "reason": "Mine now."}
    assert client.post(f"/admin/actions/action/{action.pk}/assign-owner/", owner).status_code == 403

    fresh = Action.objects.get(pk=action.pk)
    assert (fresh.status, fresh.owner) == (S.PROPOSED, None)
    assert ActionEvent.objects.filter(action=action).count() == 1


def test_reassigning_an_owner_in_the_admin_writes_an_audit_event(
    admin_client: Client, console_admin: User, agent_actor: Actor, manager: Any, finance: Any
) -> None:
    """Invariant 9: a new owner is an audited correction, not a plain field save."""
    action = needs_review(agent_actor, manager)
    fred = make_user("fred.finance", "finance")
    url = f"/admin/actions/action/{action.pk}/assign-owner/"
    page = admin_client.get(url).content.decode()
    assert "fred.finance" in page
    assert "maria.manager" not in page, "only people who may resolve can own an action"

    refused = admin_client.post(url, {"owner": str(manager.pk), "reason": "Maria knows it."})
    response = admin_client.post(url, {"owner": str(fred.pk), "reason": "Fiona is on leave."})

    assert refused.status_code == 200, "the form shows the error"
    assert response.status_code == 302
    fresh = Action.objects.get(pk=action.pk)
    assert (fresh.owner, fresh.status) == (fred, S.NEEDS_REVIEW)
    events = ActionEvent.objects.filter(action=action, transition="assign_owner")
    assert [(e.from_state, e.to_state, e.actor_user, e.reason) for e in events] == [
        (S.NEEDS_REVIEW, S.NEEDS_REVIEW, console_admin, "Fiona is on leave.")
    ]


# --- compensating a duplicate effect from the discrepancy list ---------------------------------


def test_an_admin_starts_a_compensating_action_from_the_discrepancy_list(
    admin_client: Client, agent_actor: Actor, manager: Any
) -> None:
    """The list action asks for a reason, then proposes one compensation, however often it is used."""
    original = succeeded_refund(agent_actor, manager)
    discrepancy = duplicate_found(original, "re_second")
    choose = {"action": "start_compensation", "_selected_action": [discrepancy.pk]}

    confirmation = admin_client.post("/admin/actions/discrepancy/", choose)
    assert confirmation.status_code == 200
    assert 'name="note"' in confirmation.content.decode()
    assert not Action.objects.filter(kind=ActionKind.COMPENSATION).exists(), "nothing before the confirmation"

    confirm = {**choose, "confirm": "yes", "note": "Invoice the customer for re_second."}
    done = admin_client.post("/admin/actions/discrepancy/", confirm, follow=True)
    again = admin_client.post("/admin/actions/discrepancy/", confirm, follow=True)

    compensation = Action.objects.get(kind=ActionKind.COMPENSATION)
    assert compensation.action_id == "compensation:re_second"
    assert compensation.status == S.PROPOSED
    assert any("waits for a manager's approval" in message for message in messages_of(done))
    assert any("compensation:re_second" in message for message in messages_of(again))
    assert Action.objects.filter(kind=ActionKind.COMPENSATION).count() == 1
    discrepancy.refresh_from_db()
    assert discrepancy.status == DiscrepancyStatus.IN_PROGRESS
    detail = admin_client.get(f"/admin/actions/discrepancy/{discrepancy.pk}/change/").content.decode()
    assert f'href="{change_url(compensation)}"' in detail


@pytest.mark.parametrize("role", ["manager", "finance"])
def test_staff_without_the_admin_role_are_not_offered_the_compensation(
    client: Client, role: str, agent_actor: Actor, manager: Any
) -> None:
    """Invariant 10: finance works discrepancies, but a compensation is an admin's correction."""
    discrepancy = duplicate_found(succeeded_refund(agent_actor, manager), "re_second")
    staff = make_user(f"staff.{role}", role, is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_discrepancy"))
    login(client, staff)

    page = client.get("/admin/actions/discrepancy/")
    client.post(
        "/admin/actions/discrepancy/",
        {"action": "start_compensation", "_selected_action": [discrepancy.pk], "confirm": "yes", "note": "Mine."},
    )

    assert page.status_code == 200
    assert "start_compensation" not in page.content.decode()
    assert not Action.objects.filter(kind=ActionKind.COMPENSATION).exists()
    discrepancy.refresh_from_db()
    assert discrepancy.status == DiscrepancyStatus.OPEN


def test_the_compensation_is_listed_and_the_original_keeps_its_trail(
    admin_client: Client, console_admin: User, agent_actor: Actor, manager: Any
) -> None:
    original = succeeded_refund(agent_actor, manager)
    events = list(ActionEvent.objects.filter(action=original).values_list("pk", flat=True))
    discrepancy = duplicate_found(original, "re_second")
    discrepancy_compensate(discrepancy_pk=discrepancy.pk, user=console_admin, note="Invoice it.")

    listed = admin_client.get("/admin/actions/action/?kind__exact=compensation").content.decode()

    assert "compensation:re_second" in listed
    assert original.action_id not in listed
    assert list(ActionEvent.objects.filter(action=original).values_list("pk", flat=True)) == events


# --- agents and their tokens -----------------------------------------------------------------


def test_issuing_a_token_shows_it_once_and_stores_only_its_hash(
    admin_client: Client, agent: Any, agent_owner: Any
) -> None:
    """Issued by the agent's owner on the account page: the admin site no longer issues tokens
    (tests/security/test_separation_of_duties.py)."""
    owner = Client()
    owner.force_login(agent_owner)
    response = owner.post(f"/account/agents/{agent.pk}/tokens", {"label": "production"})

    shown = re.findall(r">(ect_[A-Za-z0-9_\-]+)</code>", response.content.decode())
    assert len(shown) == 1
    plain = shown[0]
    token = AgentToken.objects.get(agent=agent)
    assert token.token_hash == token_hash(plain)
    assert plain not in str(AgentToken.objects.values().get(pk=token.pk))
    assert agent_authenticate(plain=plain).pk == token.pk
    assert plain not in owner.get("/account/").content.decode(), "shown once"
    assert plain not in admin_client.get("/admin/actions/agent/").content.decode()
    assert plain not in admin_client.get(f"/admin/actions/agent/{agent.pk}/change/").content.decode()


def test_revoking_a_token_in_the_admin_stops_it_at_once(admin_client: Client, agent: Any) -> None:
    issued = agent_token_issue(agent=agent)

    admin_client.post("/admin/actions/agenttoken/", {"action": "revoke", "_selected_action": [issued.token.pk]})

    assert AgentToken.objects.get(pk=issued.token.pk).revoked_at is not None
    with pytest.raises(AgentAuthenticationFailed):
        agent_authenticate(plain=issued.plain)


def test_tokens_cannot_be_typed_in_or_unrevoked_in_the_admin(admin_client: Client, agent: Any) -> None:
    issued = agent_token_issue(agent=agent)
    admin_client.post("/admin/actions/agenttoken/", {"action": "revoke", "_selected_action": [issued.token.pk]})
    url = f"/admin/actions/agenttoken/{issued.token.pk}/change/"

    assert admin_client.get("/admin/actions/agenttoken/add/").status_code == 403
    admin_client.post(url, {**form_inputs(admin_client.get(url).content.decode()), "revoked_at": ""})

    assert AgentToken.objects.get(pk=issued.token.pk).revoked_at is not None
    with pytest.raises(AgentAuthenticationFailed):
        agent_authenticate(plain=issued.plain)


# --- remedies and discrepancies: worked by finance, reassigned by admins ------------------------


def test_remedies_and_discrepancies_are_read_only_in_the_admin(
    admin_client: Client, agent_actor: Actor, manager: Any
) -> None:
    """Finance works them through the review queue's services, which keep their status flow and trail."""
    discrepancy = duplicate_found(succeeded_refund(agent_actor, manager), "re_second")
    url = f"/admin/actions/discrepancy/{discrepancy.pk}/change/"

    response = admin_client.post(url, {"status": "corrected", "note": "Done.", "owner": ""})

    assert response.status_code == 403
    discrepancy.refresh_from_db()
    assert (discrepancy.status, discrepancy.note) == (DiscrepancyStatus.OPEN, "")


def test_an_admin_reassigns_a_discrepancy_with_a_note_and_an_event_on_its_action(
    admin_client: Client, console_admin: User, agent_actor: Actor, manager: Any, finance: Any
) -> None:
    """Invariant 9: the reassignment shows in the item's note and its action's trail."""
    original = succeeded_refund(agent_actor, manager)
    discrepancy = duplicate_found(original, "re_second")
    choose = {"action": "assign_owner", "_selected_action": [discrepancy.pk]}

    form = admin_client.post("/admin/actions/discrepancy/", choose)
    admin_client.post(
        "/admin/actions/discrepancy/", {**choose, "confirm": "yes", "owner": finance.pk, "reason": "Fiona knows it."}
    )

    assert form.status_code == 200
    discrepancy.refresh_from_db()
    assert discrepancy.owner == finance
    assert "assigned to fiona.finance: Fiona knows it." in discrepancy.note
    event = ActionEvent.objects.filter(action=original).last()
    assert event is not None
    assert (event.transition, event.from_state, event.to_state) == (
        "discrepancy_assign_owner",
        S.SUCCEEDED,
        S.SUCCEEDED,
    )
    assert (event.actor_user, event.evidence["owner"]) == (console_admin, "fiona.finance")


def test_finance_staff_cannot_reassign_in_the_admin(client: Client, agent_actor: Actor, manager: Any) -> None:
    """Invariant 10: moving work between people through the admin is a correction."""
    discrepancy = duplicate_found(succeeded_refund(agent_actor, manager), "re_second")
    staff = make_user("staff.finance", "finance", is_staff=True)
    login(client, staff)

    client.post(
        "/admin/actions/discrepancy/",
        {
            "action": "assign_owner",
            "_selected_action": [discrepancy.pk],
            "confirm": "yes",
            "owner": staff.pk,
            "reason": "Mine.",
        },
    )

    discrepancy.refresh_from_db()
    assert discrepancy.owner is None


def test_the_action_page_is_titled_for_the_action_and_its_corrections_are_the_main_buttons(
    admin_client: Client, agent_actor: Actor
) -> None:
    """Every field is read-only, so the page is not "Change action": it names the action and its
    state, and the corrections are buttons at the top of the form, not only small links."""
    action = refund_of(agent_actor)
    assert action.status == S.PROPOSED
    page = admin_client.get(change_url(action)).content.decode()
    assert "Change action" not in page
    assert f"<title>Action {action.action_id} · Proposed" in page
    button = r'<a class="button default" href="[^"]+/transition/cancel/" data-correction-button="cancel">'
    assert re.search(button, page)
    assert set(re.findall(r'data-correction-button="([a-z_]+)"', page)) == offered(admin_client, action)
