"""The console's search (/search?q=), the order page (/orders/<id>) and the admin's search.

What people have in hand finds the action: a customer's email or name, an order number, a ticket,
an action id, a provider reference (re_..., ch_...), a bill or a supplier. Each role sees only
what it may: an agent's owner only their own proposals, no orders; nobody without a role anything.
On PostgreSQL the plan uses the trigram indexes (migration 0017_search_indexes).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse

from actions.kinds.refund.proposal import action_propose_refund
from actions.management.commands.search_bench import bulk_build, sample_terms
from actions.models import Action, ActionStatus
from actions.search import SECTION_LIMIT, exact_orders, found, lookup_containing, matching_orders, search_actions
from actions.services import Actor
from approvals.services import approval_decide
from tests.actions.test_finance_services import escalated, succeeded
from tests.factories import make_agent, make_bill, make_order, make_request, make_user

pytestmark = pytest.mark.django_db

S = ActionStatus


def _propose(order: Any, actor: Actor, *, amount: str = "40.00", ticket: str | None = None) -> Action:
    request = make_request(order, external_reference=ticket)
    return action_propose_refund(
        order_number=order.number,
        request_number=request.number,
        amount=amount,
        currency=order.currency,
        reason_code="damaged",
        evidence="Photo of the broken lid.",
        proposer=actor,
    ).action


@pytest.fixture
def world(agent_actor: Actor, dispatched: list[int]) -> dict[str, Any]:
    """Two customers' orders with proposals, one refund that succeeded at the provider, one
    action that needs finance, and a supplier bill."""
    grace = make_order(number="7301", customer_name="Grace Hopper", captured="300.00")
    grace.customer_email = "grace.hopper@navy.example"
    grace.save(update_fields=["customer_email"])
    alan = make_order(number="7302", customer_name="Alan Turing", captured="90.00")
    alan.customer_email = "alan@bletchley.example"
    alan.save(update_fields=["customer_email"])
    waiting = _propose(grace, agent_actor, amount="60.00", ticket="ZD-55012")
    other = _propose(alan, agent_actor, amount="45.00", ticket="ZD-55013")
    done = succeeded(agent_actor)
    review = escalated(agent_actor)
    bill = make_bill(number="BL-9981", supplier_name="Initech Supplies")
    return {"grace": grace, "alan": alan, "waiting": waiting, "other": other, "done": done, "review": review,
            "bill": bill}  # fmt: skip


def _search(client: Client, q: str) -> Any:
    return client.get(reverse("search"), {"q": q})


def _found_ids(response: Any) -> set[str]:
    return {hit.action.action_id for hit in response.context["results"].actions}


@pytest.mark.parametrize(
    ("term", "expected"),
    [
        ("grace.hopper@navy", "waiting"),  # part of the customer's email
        ("GRACE HOPPER", "waiting"),  # the customer's name, any case
        ("7301", "waiting"),  # the order number
        ("zd-55012", "waiting"),  # the ticket
        ("order-7302", "other"),  # part of the action id (and the order number)
        ("refund:order-7302:request-1", "other"),  # the whole action id
    ],
)
def test_search_finds_an_action_by_what_people_have_in_hand(
    client: Client, manager: Any, world: dict[str, Any], term: str, expected: str
) -> None:
    client.force_login(manager)
    response = _search(client, term)
    assert response.status_code == 200
    found = _found_ids(response)
    assert world[expected].action_id in found
    # The other customer's action is not a match.
    unexpected = "other" if expected == "waiting" else "waiting"
    assert world[unexpected].action_id not in found
    # A manager's link opens the manager's page for it.
    assert reverse("approvals-detail", args=[world[expected].pk]) in response.content.decode()


def test_search_finds_a_refund_by_its_provider_reference_and_its_charge(
    client: Client, finance: Any, world: dict[str, Any]
) -> None:
    done = world["done"]
    assert done.provider_reference.startswith("re_")
    client.force_login(finance)
    by_refund = _search(client, done.provider_reference)
    assert _found_ids(by_refund) == {done.action_id}
    # Finance's link opens finance's page.
    assert reverse("review-action", args=[done.pk]) in by_refund.content.decode()
    by_charge = _search(client, done.order.charge_reference)
    assert done.action_id in _found_ids(by_charge)
    assert [hit.order.pk for hit in by_charge.context["results"].orders] == [done.order_id]


def test_search_finds_bills_by_number_and_supplier(client: Client, manager: Any, world: dict[str, Any]) -> None:
    client.force_login(manager)
    for term in ("BL-9981", "initech"):
        response = _search(client, term)
        assert [bill.number for bill in response.context["results"].bills] == ["BL-9981"], term


def test_an_agents_owner_finds_only_their_own_proposals_and_no_orders(
    client: Client, world: dict[str, Any], dispatched: list[int]
) -> None:
    """Otto owns the support agent that proposed everything above; Olga owns another agent."""
    olga = make_user("olga.owner", "agent")
    hers = _propose(world["grace"], Actor.for_agent(make_agent(olga, name="olga-bot")), amount="10.00")
    client.force_login(olga)
    response = _search(client, "7301")
    assert response.status_code == 200
    assert _found_ids(response) == {hers.action_id}
    assert response.context["results"].orders == []
    assert world["waiting"].action_id not in response.content.decode()
    # She has no page for the order either.
    assert client.get(reverse("order-detail", args=[world["grace"].pk])).status_code == 403


def test_search_and_the_order_page_are_closed_to_people_without_a_role(client: Client, world: dict[str, Any]) -> None:
    nobody = make_user("nora.nobody")
    client.force_login(nobody)
    assert _search(client, "7301").status_code == 403
    assert client.get(reverse("order-detail", args=[world["grace"].pk])).status_code == 403
    client.logout()
    assert _search(client, "7301").status_code == 302  # to the login page


@pytest.mark.parametrize(
    ("q", "problem"),
    [("ab", "at least 3 characters"), ("x" * 201, "at most 200"), ("re_\x00abc", "control characters")],
)
def test_a_search_that_cannot_run_is_named_with_400_not_an_error_page(
    client: Client, manager: Any, q: str, problem: str
) -> None:
    client.force_login(manager)
    response = _search(client, q)
    assert response.status_code == 400
    assert problem in response.content.decode()


def test_a_short_number_finds_the_action_with_that_number(client: Client, manager: Any, world: dict[str, Any]) -> None:
    client.force_login(manager)
    action = world["waiting"]
    response = _search(client, str(action.pk))
    assert action.action_id in _found_ids(response)


def test_an_empty_search_shows_the_form_and_nothing_else(client: Client, manager: Any) -> None:
    client.force_login(manager)
    response = _search(client, "   ")
    assert response.status_code == 200
    assert not response.context["results"].searched


def test_many_matches_show_the_newest_page_and_say_there_are_more(
    client: Client, manager: Any, agent_actor: Actor, dispatched: list[int]
) -> None:
    order = make_order(number="7400", captured="10000.00")
    for _ in range(SECTION_LIMIT + 2):
        _propose(order, agent_actor, amount="30.00")
    client.force_login(manager)
    response = _search(client, "7400")
    results = response.context["results"]
    assert len(results.actions) == SECTION_LIMIT and results.more_actions
    assert "Only the newest" in response.content.decode()


# --- the order page ------------------------------------------------------------------------------


def test_the_order_page_lists_every_action_decision_and_the_money(
    client: Client, manager: Any, agent_actor: Actor, dispatched: list[int]
) -> None:
    order = make_order(number="7500", customer_name="Radia Perlman", captured="200.00")
    approved = _propose(order, agent_actor, amount="80.00")
    rejected = _propose(order, agent_actor, amount="50.00")
    waiting = _propose(order, agent_actor, amount="150.00")
    approval_decide(action_pk=approved.pk, user=manager, decision="approve", note="Photos check out.")
    approval_decide(action_pk=rejected.pk, user=manager, decision="reject", note="Outside the return window.")
    client.force_login(manager)

    response = client.get(reverse("order-detail", args=[order.pk]))

    assert response.status_code == 200
    page = response.context["page"]
    assert [line.action.pk for line in page.actions] == [waiting.pk, rejected.pk, approved.pk]
    assert {a.note for a in page.approvals} == {"Photos check out.", "Outside the return window."}
    money = page.money
    assert money.captured == Decimal("200.00")
    assert money.pending == Decimal("230.00")  # approved 80 (not sent yet) + waiting 150
    assert money.refundable == Decimal("200.00")
    assert money.pending_exceeds_refundable
    html = response.content.decode()
    for action in (approved, rejected, waiting):
        assert action.action_id in html
    assert "ask for more than is still refundable" in html
    assert "Outside the return window." in html


def test_the_order_page_sums_up_the_customers_refunds(
    client: Client, finance: Any, agent_actor: Actor, dispatched: list[int]
) -> None:
    # succeeded() makes a fresh order for Ada each time (ada@example.com): three refunds in 90 days.
    refunds = [succeeded(agent_actor) for _ in range(3)]
    client.force_login(finance)
    response = client.get(reverse("order-detail", args=[refunds[-1].order_id]))
    customer = response.context["page"].customer
    assert customer.refunds_in_window == 3
    assert "3rd refund in 90 days" in response.content.decode()
    assert refunds[-1].provider_reference in response.content.decode()


def test_a_missing_order_is_404(client: Client, manager: Any) -> None:
    client.force_login(manager)
    assert client.get(reverse("order-detail", args=[999999])).status_code == 404


def test_order_links_on_the_card_the_detail_and_the_queue_open_the_order_page(
    client: Client, manager: Any, finance: Any, world: dict[str, Any]
) -> None:
    waiting, review = world["waiting"], world["review"]
    client.force_login(manager)
    order_url = reverse("order-detail", args=[waiting.order_id])
    assert order_url in client.get(reverse("approvals-inbox")).content.decode()
    assert order_url in client.get(reverse("approvals-detail", args=[waiting.pk])).content.decode()
    client.force_login(finance)
    review_order_url = reverse("order-detail", args=[review.order_id])
    assert review_order_url in client.get(reverse("review-queue")).content.decode()
    assert review_order_url in client.get(reverse("review-action", args=[review.pk])).content.decode()


# --- the admin's search --------------------------------------------------------------------------


def test_the_admins_action_search_matches_part_of_an_email_or_reference(
    client: Client, world: dict[str, Any]
) -> None:
    admin = make_user("adam.admin", "admin", is_staff=True)
    client.force_login(admin)
    url = reverse("admin:actions_action_changelist")
    by_email = client.get(url, {"q": "navy.example"})
    assert [a.pk for a in by_email.context["cl"].result_list] == [world["waiting"].pk]
    by_reference = client.get(url, {"q": world["done"].provider_reference[:10]})
    assert world["done"].pk in [a.pk for a in by_reference.context["cl"].result_list]
    orders = client.get(reverse("admin:actions_order_changelist"), {"q": "bletchley"})
    assert [o.pk for o in orders.context["cl"].result_list] == [world["alan"].pk]


# --- the plan on PostgreSQL ----------------------------------------------------------------------


def _plan(queryset: Any) -> str:
    return str(queryset.explain())


def _containing(term: str) -> Any:
    """The actions the search finds by any part of ``term`` (its fallback when nothing holds the
    term exactly: tests/actions/test_search_exact.py)."""
    actions = found(lookup_containing(term), Action.objects.all()).actions
    assert actions is not None
    return actions


@pytest.mark.postgres
def test_each_part_search_query_is_served_by_its_trigram_indexes_on_postgresql() -> None:
    """The indexes match the SQL Django writes (UPPER(col::text) LIKE UPPER('%term%')): with
    sequential scans priced out, every part of each query is a scan of its trigram index. (On
    a table this small the planner rightly prefers reading it whole; the next test and
    ``manage.py search_bench`` show it choosing the indexes by itself at scale.)"""
    bulk_build(actions=2_000, orders=500, tag="t")
    terms = dict(sample_terms("t", order=322))
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
    # (term, the order indexes its order query reads, whether the actions' own indexes are read)
    cases = [
        ("customer name, common: many matches", ["order_number_trgm_idx", "order_customer_name_trgm_idx",
          "order_customer_email_trgm_idx", "order_charge_ref_trgm_idx"], True),
        ("action id", [], False),  # from its start, by the unique column's pattern-ops btree
        ("customer email", ["order_customer_email_trgm_idx"], False),
        ("charge reference (ch_...)", ["order_charge_ref_trgm_idx"], False),
        ("refund reference (re_...)", [], True),
    ]  # fmt: skip
    for what, order_indexes, own_indexes in cases:
        term = terms[what]
        orders = matching_orders(term).order_by().values_list("pk", flat=True)[:200]
        orders_plan = _plan(orders) if order_indexes else ""
        for index in order_indexes:
            assert index in orders_plan, (what, orders_plan)
        actions_plan = _plan(_containing(term).order_by("-created_at", "-pk")[: SECTION_LIMIT + 1])
        if own_indexes:
            assert "action_id_trgm_idx" in actions_plan, (what, actions_plan)
            assert "action_provider_ref_trgm_idx" in actions_plan, (what, actions_plan)
        if what == "action id":
            assert "_like" in actions_plan, actions_plan  # actions_action_action_id_..._like
        assert "Seq Scan" not in actions_plan + orders_plan, (what, actions_plan, orders_plan)
        assert search_actions(term).exists(), what


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_planner_chooses_the_trigram_indexes_by_itself_at_200000_actions() -> None:
    """No planner settings touched: at 200,000 actions on 50,000 orders, a search by a refund's
    reference and by a customer's email reads the indexes, not the tables: the btrees when the
    term is whole, the trigram indexes when it is a part.

    The rows are committed and the tables vacuumed, as a table in service is. Inside a test's
    transaction they were not: the index entries of every row earlier tests wrote and rolled
    back stayed in the trigram indexes, which the planner charges to every scan of them, and
    autovacuum could replace the statistics of the rows it cannot see while the test ran. The
    plan then depended on what ran before (seen once in CI, 430 tests in: a sequential
    scan of the orders for an email)."""
    bulk_build(actions=200_000, orders=50_000, tag="t")
    with connection.cursor() as cursor:
        cursor.execute("VACUUM (ANALYZE) actions_order")
        cursor.execute("VACUUM (ANALYZE) actions_action")
    terms = dict(sample_terms("t"))
    for what in ("refund reference (re_...)", "customer email"):
        term = terms[what]
        orders_plan = _plan(matching_orders(term).order_by().values_list("pk", flat=True)[:200])
        actions_plan = _plan(search_actions(term).order_by("-created_at", "-pk")[: SECTION_LIMIT + 1])
        assert "Seq Scan on actions_action" not in actions_plan, (what, actions_plan)
        assert "Seq Scan on actions_order" not in orders_plan, (what, orders_plan)
    assert "action_provider_ref_trgm_idx" in _plan(_containing(terms["refund reference (re_...)"])[:51])
    assert "order_customer_email_trgm_idx" in _plan(matching_orders(terms["customer email"])[:200])
    assert "action_provider_ref_idx" in _plan(search_actions(terms["refund reference (re_...)"])[:51])
    assert "order_email_upper_idx" in _plan(exact_orders(terms["customer email"])[:200])


@pytest.mark.parametrize("term", ["²", "7", "99999999999999999999"])
def test_the_admins_action_search_takes_a_short_or_odd_number_without_an_error(
    client: Client, world: dict[str, Any], term: str
) -> None:
    """Bad input gets a page, never a 500: "²" is a digit to isdigit() and not to int()."""
    client.force_login(make_user("adam.admin", "admin", is_staff=True))
    response = client.get(reverse("admin:actions_action_changelist"), {"q": term})
    assert response.status_code == 200
