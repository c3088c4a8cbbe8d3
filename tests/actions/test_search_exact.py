"""The search's exact lookups: a term that is exactly an identifier finds what holds it.

An order's number, a customer's email or whole name, a ticket, a bill's number, an action id or a provider
reference typed whole finds that row (and the actions hanging off it) by a btree, whose cost
does not grow with the history; only when nothing the person may see holds it exactly is the
term searched as a part. The person's role limits both lookups the same way (an agent's owner
sees only their own proposals, never an order), and odd input is a page, never an error.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from actions.kinds.refund.proposal import action_propose_refund
from actions.management.commands.search_bench import bulk_build, sample_terms
from actions.models import Action, Order
from actions.search import (
    TARGET_LIMIT,
    exact_bills,
    exact_named_orders,
    exact_orders,
    exact_requests,
    found,
    lookup_exact,
    search,
)
from actions.services import Actor
from tests.actions.test_finance_services import succeeded
from tests.factories import make_agent, make_bill, make_order, make_request, make_user

pytestmark = pytest.mark.django_db


def _propose(order: Order, actor: Actor, *, amount: str = "20.00", ticket: str | None = None) -> Action:
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


def _order(number: str, email: str = "ada@example.com", name: str = "Ada Lovelace") -> Order:
    order = make_order(number=number, customer_name=name, captured="500.00")
    order.customer_email = email
    order.save(update_fields=["customer_email"])
    return order


def _action_ids(results: Any) -> set[str]:
    return {hit.action.action_id for hit in results.actions}


def _order_numbers(results: Any) -> set[str]:
    return {hit.order.number for hit in results.orders}


def test_a_whole_order_number_finds_that_order_and_not_the_ones_containing_it(
    finance: Any, agent_actor: Actor, dispatched: list[int]
) -> None:
    wanted = _propose(_order("7301"), agent_actor)
    _propose(_order("17301"), agent_actor)
    _propose(_order("73015"), agent_actor)

    results = search(user=finance, raw="7301")

    assert results.exact
    assert _order_numbers(results) == {"7301"}
    assert _action_ids(results) == {wanted.action_id}


def test_part_of_an_order_number_still_finds_every_order_containing_it(
    finance: Any, agent_actor: Actor, dispatched: list[int]
) -> None:
    for number in ("7301", "17301", "73015"):
        _propose(_order(number), agent_actor)

    results = search(user=finance, raw="730")

    assert not results.exact
    assert _order_numbers(results) == {"7301", "17301", "73015"}
    assert len(results.actions) == 3


def test_an_order_number_in_another_case_is_found_exactly(
    finance: Any, agent_actor: Actor, dispatched: list[int]
) -> None:
    wanted = _propose(_order("BS-42"), agent_actor)
    _propose(_order("BS-420"), agent_actor)

    results = search(user=finance, raw="bs-42")

    assert results.exact
    assert _action_ids(results) == {wanted.action_id}


def test_a_whole_email_finds_every_order_of_that_customer_and_their_actions(
    finance: Any, agent_actor: Actor, dispatched: list[int]
) -> None:
    first = _propose(_order("7311", email="Grace.Hopper@navy.example"), agent_actor)
    second = _propose(_order("7312", email="grace.hopper@navy.example"), agent_actor)
    _propose(_order("7313", email="alan@bletchley.example"), agent_actor)

    results = search(user=finance, raw="grace.hopper@NAVY.example")

    assert results.exact
    assert _order_numbers(results) == {"7311", "7312"}
    assert _action_ids(results) == {first.action_id, second.action_id}


def test_a_customers_whole_name_finds_their_orders_exactly_and_not_a_longer_name(
    finance: Any, agent_actor: Actor, dispatched: list[int]
) -> None:
    first = _propose(_order("7321", name="Grace Hopper"), agent_actor)
    second = _propose(_order("7322", name="GRACE HOPPER"), agent_actor)
    longer = _propose(_order("7323", name="Grace Hopperson"), agent_actor)

    whole = search(user=finance, raw="grace hopper")
    part = search(user=finance, raw="Hopper")

    assert whole.exact
    assert _order_numbers(whole) == {"7321", "7322"}
    assert _action_ids(whole) == {first.action_id, second.action_id}
    assert not part.exact
    assert _action_ids(part) == {first.action_id, second.action_id, longer.action_id}


def test_an_order_numbered_like_a_name_and_that_names_orders_are_found_together_newest_first(
    finance: Any, agent_actor: Actor, dispatched: list[int]
) -> None:
    """The name is its own query (see ``exact_named_orders``); its orders and the number's are
    merged into one list, newest first, as one query would have ordered them."""
    named = _order("7331", name="Ada")
    numbered = _order("ADA", name="Charles Babbage")
    older = _order("7332", name="ada")
    base = named.paid_at
    for order, days in ((named, 1), (numbered, 2), (older, 3)):
        Order.objects.filter(pk=order.pk).update(paid_at=base - timedelta(days=days))

    results = search(user=finance, raw="ada")

    assert results.exact
    assert [hit.order.number for hit in results.orders] == ["7331", "ADA", "7332"]


def test_part_of_an_email_is_still_found_as_a_part(finance: Any, agent_actor: Actor, dispatched: list[int]) -> None:
    wanted = _propose(_order("7321", email="grace.hopper@navy.example"), agent_actor)

    results = search(user=finance, raw="hopper@navy")

    assert not results.exact
    assert _action_ids(results) == {wanted.action_id}


def test_a_refund_reference_finds_its_refund_and_a_miscased_one_is_still_found_as_a_part(
    finance: Any, agent_actor: Actor
) -> None:
    done = succeeded(agent_actor)

    exact = search(user=finance, raw=done.provider_reference)
    assert exact.exact and _action_ids(exact) == {done.action_id}

    # Providers' references are case-sensitive, so the btree lookup misses; the part search,
    # which ignores case, still finds it.
    miscased = search(user=finance, raw=done.provider_reference.upper())
    assert not miscased.exact and _action_ids(miscased) == {done.action_id}


def test_a_charge_reference_finds_its_order_and_the_refunds_drawn_from_it(finance: Any, agent_actor: Actor) -> None:
    done = succeeded(agent_actor)
    succeeded(agent_actor)  # another of Ada's orders, another charge
    assert done.order is not None

    results = search(user=finance, raw=done.order.charge_reference)

    assert results.exact
    assert [hit.order.pk for hit in results.orders] == [done.order_id]
    assert _action_ids(results) == {done.action_id}


def test_a_whole_action_id_finds_that_action_and_not_the_ones_it_begins(
    finance: Any, agent_actor: Actor, dispatched: list[int]
) -> None:
    order = _order("7331")
    actions = [_propose(order, agent_actor) for _ in range(11)]  # request-1 ... request-11
    assert actions[0].action_id.endswith(":request-1")

    exact = search(user=finance, raw=actions[0].action_id)
    assert exact.exact and _action_ids(exact) == {actions[0].action_id}

    # The start of an action id still finds every action it begins.
    begun = search(user=finance, raw=actions[0].action_id.rsplit(":", 1)[0] + ":")
    assert not begun.exact and _action_ids(begun) == {action.action_id for action in actions}


def test_a_whole_ticket_in_any_case_finds_its_action(finance: Any, agent_actor: Actor, dispatched: list[int]) -> None:
    wanted = _propose(_order("7341"), agent_actor, ticket="ZD-55012")
    _propose(_order("7342"), agent_actor, ticket="ZD-550129")

    results = search(user=finance, raw="zd-55012")

    assert results.exact
    assert _action_ids(results) == {wanted.action_id}


def test_a_whole_bill_number_finds_that_bill(manager: Any) -> None:
    make_bill(number="BL-9981", supplier_name="Initech Supplies")
    make_bill(number="BL-99810", supplier_name="Initech Supplies")

    results = search(user=manager, raw="bl-9981")

    assert results.exact
    assert [bill.number for bill in results.bills] == ["BL-9981"]


def test_an_actions_number_finds_that_action_and_still_every_order_containing_the_digits(
    finance: Any, agent_actor: Actor, dispatched: list[int]
) -> None:
    """At scale every short run of digits is some action's number: that alone must not hide the
    order a clerk is after when they type part of its number."""
    numbered = _propose(_order("N-1"), agent_actor)
    digits = f"{numbered.pk:03d}"
    containing = _propose(_order(f"9{digits}9"), agent_actor)

    results = search(user=finance, raw=digits)

    assert not results.exact
    assert _order_numbers(results) == {f"9{digits}9"}
    assert _action_ids(results) == {numbered.action_id, containing.action_id}


# --- who sees what --------------------------------------------------------------------------------


def test_an_agents_owner_never_sees_another_owners_exact_match_and_gets_the_part_search_instead(
    agent_actor: Actor, dispatched: list[int]
) -> None:
    """Otto owns the support agent; Olga owns another. Order 7420 holds only Otto's proposal, so
    for Olga nothing she may see holds "7420" exactly: she gets the part search, which finds
    her own proposal on order 74201, and neither Otto's action nor any order."""
    ottos = _propose(_order("7420"), agent_actor)
    olga = make_user("olga.owner", "agent")
    hers = _propose(_order("74201"), Actor.for_agent(make_agent(olga, name="olga-bot")))

    results = search(user=olga, raw="7420")

    assert not results.exact
    assert _action_ids(results) == {hers.action_id}
    assert ottos.action_id not in _action_ids(results)
    assert results.orders == [] and results.bills == []


def test_an_agents_owner_finds_their_own_action_exactly_and_no_order(
    agent_owner: Any, agent_actor: Actor, dispatched: list[int]
) -> None:
    mine = _propose(_order("7430"), agent_actor)
    _propose(_order("74300"), agent_actor)

    results = search(user=agent_owner, raw="7430")

    assert results.exact
    assert _action_ids(results) == {mine.action_id}
    assert results.orders == []


def test_someone_without_a_role_finds_nothing_exactly_either(agent_actor: Actor, dispatched: list[int]) -> None:
    _propose(_order("7440"), agent_actor)
    nobody = make_user("nora.nobody")

    results = search(user=nobody, raw="7440")

    assert results.empty


# --- odd input -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "q",
    [
        "²",  # str.isdigit says yes, int() says no
        "²²²",
        "9" * 30,  # no bigint holds it
        "0",
        "%%%",  # LIKE's wildcards, as text
        "___",
        "re_%_",
        "ch_\\",
        "a@b",
        "::",
        "refund:order-'; DROP TABLE actions_action; --",
    ],
)
def test_odd_input_is_a_page_never_an_error(client: Client, finance: Any, q: str) -> None:
    client.force_login(finance)
    response = client.get(reverse("search"), {"q": q})
    assert response.status_code in (200, 400)
    assert response.context["results"].empty


# --- the cost -------------------------------------------------------------------------------------


def test_an_exact_search_sends_the_same_statements_however_long_the_history(
    finance: Any, agent_actor: Actor, dispatched: list[int]
) -> None:
    """The statement count is the issue's second bar (P-e): more history, no more queries."""
    _propose(_order("7501", email="grace.hopper@navy.example"), agent_actor)
    terms = ["7501", "grace.hopper@navy.example", "Grace"]

    def statements(term: str) -> int:
        with CaptureQueriesContext(connection) as queries:
            search(user=finance, raw=term)
        return len(queries)

    statements("warm-up")  # the first search reads the person's permissions once
    before = {term: statements(term) for term in terms}
    for n in range(30):
        _propose(_order(f"75{n:02d}0", email=f"grace{n}@navy.example", name="Grace Jones"), agent_actor)
    after = {term: statements(term) for term in terms}

    assert after == before


@pytest.mark.parametrize("role", ["finance", "manager"])
def test_the_results_page_sends_the_same_statements_for_one_row_as_for_thirty(
    client: Client, role: str, agent_actor: Actor, dispatched: list[int], request: pytest.FixtureRequest
) -> None:
    """The page loads only the columns it shows (``SHOWN_ACTION_FIELDS``): a column the template
    read that was not loaded would cost a query a row, here thirty more. Each role has its own
    links (the manager's decision page, finance's review page), each with the order's."""
    person = request.getfixturevalue(role)
    client.force_login(person)
    # Above the auto-approval threshold: a proposal waits for a manager from the first page on,
    # so the navigation's count of waiting work (and the plans it looks up) is on both pages,
    # as it is once the agent's daily auto-approval cap leaves the later ones waiting too.
    first = _propose(_order("7601", name="Grace Jones"), agent_actor, amount="60.00", ticket="T-7601")

    def page() -> tuple[int, str]:
        with CaptureQueriesContext(connection) as queries:
            response = client.get(reverse("search"), {"q": "Grace Jones"})
        assert response.status_code == 200
        return len(queries), response.content.decode()

    page()  # the first page reads the person's permissions and session once
    before, shown = page()
    assert f'href="{reverse("order-detail", args=[first.order_id])}"' in shown
    assert "T-7601" in shown
    for n in range(30):
        _propose(_order(f"76{n:02d}1", name="Grace Jones"), agent_actor)
    after, shown = page()

    assert after == before
    assert shown.count("data-action-id=") == 31
    page_of = "approvals-detail" if role == "manager" else "review-action"
    assert f'href="{reverse(page_of, args=[first.pk])}"' in shown


def _exact_actions(term: str) -> Any:
    return found(lookup_exact(term), Action.objects.all()).actions


def _plan(queryset: Any) -> str:
    return str(queryset.explain())


# Two statements, two executes: with server-side binding (the default) a statement with
# parameters cannot hold more than one command.
TICKETS_SQL = """
INSERT INTO actions_refundrequest (order_id, number, external_reference, source, reason_code, note, created_at)
SELECT o.id, n, 'ZD-X' || n, 'ticket', '', '', now()
FROM generate_series(1, 300) AS n, actions_order o WHERE o.number = %(order)s
"""
BILLS_SQL = """
INSERT INTO actions_bill (number, supplier_name, currency, amount, amount_due, adjusted_amount, reserved_amount,
                          version, accounting_reference, purchase_order, po_mismatch, voided, issued_at, created_at)
SELECT 'BL-X' || n, 'Supplier ' || n, 'EUR', 100, 100, 0, 0, 1, '', '', '{}'::jsonb, false, now(), now()
FROM generate_series(1, 300) AS n
"""


@pytest.mark.postgres
def test_each_exact_lookup_is_a_btree_index_scan_on_postgresql() -> None:
    """With sequential scans priced out, each exact lookup reads its btree (migration
    0018_search_exact_indexes for the case-insensitive ones), never a trigram index."""
    # Few rows: the plan is forced anyway. A rolled-back bulk insert leaves its index entries
    # until a vacuum, and 2,000 rows here moved test_search.py's 200,000-row plan when this
    # file ran first.
    bulk_build(actions=40, orders=10, tag="x")
    terms = dict(sample_terms("x", order=3))
    with connection.cursor() as cursor:
        # bulk_build builds and analyzes orders and actions only. Tickets and bills get rows
        # and fresh statistics here too: on a table the planner believes empty, a full scan of
        # another btree (refund requests by order) costs the same as the lookup's own index, and
        # which one wins then depended on what earlier tests left in pg_class (seen on a fresh
        # cluster: refund_request_order_id chosen, after 324 other tests).
        cursor.execute(TICKETS_SQL, {"order": terms["order number"]})
        cursor.execute(BILLS_SQL)
        cursor.execute("ANALYZE actions_refundrequest")
        cursor.execute("ANALYZE actions_bill")
        cursor.execute("SET LOCAL enable_seqscan = off")
    cases = [
        (exact_orders(terms["order number"]), "order_number_upper_idx"),
        (exact_orders(terms["customer email"]), "order_email_upper_idx"),
        (exact_orders(terms["charge reference (ch_...)"]), "order_charge_ref"),
        (exact_requests("ZD-55012"), "refund_request_ref_upper_idx"),
        (exact_bills("BL-9981"), "bill_number_upper_idx"),
        (_exact_actions(terms["refund reference (re_...)"]), "action_provider_ref_idx"),
        (_exact_actions(terms["action id"]), "action_id"),
    ]
    for queryset, index in cases:
        assert queryset is not None
        plan = _plan(queryset)
        assert index in plan, plan
        assert "trgm" not in plan and "Seq Scan" not in plan, plan
    assert search(user=_Everyone(), raw=terms["customer email"]).exact


# A thousand orders of one name, and a thousand of others, paid a minute apart.
SHARED_NAME_SQL = """
INSERT INTO actions_order (number, customer_name, customer_email, currency, captured_amount, refunded_amount,
                           reserved_amount, outside_refunded_amount, version, charge_reference, paid_at, created_at)
SELECT 'N-' || n, CASE WHEN n % 2 = 0 THEN 'Grace Hopper' ELSE 'Alan Turing ' || n END, 'c' || n || '@example.com',
       'EUR', 100, 0, 0, 0, 1, 'ch_n' || n, now() - (n || ' minutes')::interval, now()
FROM generate_series(1, 2000) AS n
"""


@pytest.mark.postgres
def test_a_whole_name_reads_the_newest_orders_from_the_front_of_its_index_without_a_sort() -> None:
    """A name shared by many orders: the newest ``TARGET_LIMIT`` come straight from
    ``order_name_upper_paid_idx`` (name, then paid_at and id descending), so the database
    reads those and stops, however many more share the name. A sort in the plan would mean
    every order of that name was read first (the index's order is not the search's)."""
    with connection.cursor() as cursor:
        cursor.execute(SHARED_NAME_SQL)
        cursor.execute("ANALYZE actions_order")
        # Priced out: reading the small table whole, or a bitmap of every match (both sort after).
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_bitmapscan = off")
    named = exact_named_orders("grace HOPPER")
    assert named is not None
    newest = named.order_by("-paid_at", "-pk").values_list("paid_at", "pk")[:TARGET_LIMIT]

    plan = str(newest.explain(analyze=True))

    assert "order_name_upper_paid_idx" in plan, plan
    assert "Sort" not in plan, plan
    assert f"rows={TARGET_LIMIT} loops" in plan.split("order_name_upper_paid_idx")[1], plan  # stopped at the limit
    assert len(newest) == TARGET_LIMIT
    assert [paid for paid, _ in newest] == sorted((paid for paid, _ in newest), reverse=True)


class _Everyone:
    def has_perm(self, name: str) -> bool:
        return True
