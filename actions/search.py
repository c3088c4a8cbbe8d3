"""The console's one search box: find an action, an order or a bill by what people have in hand.

A person pastes what they have: an order number ("4821"), a customer's name or email, a ticket
("T-1001"), an action id, a provider's reference (``re_...`` for a refund, ``ch_...`` for the
charge it was drawn from), a supplier bill's number or the supplier's name.

Exactly first, then any part of it. A term that is exactly an identifier something holds (an
order's number, a customer's email or whole name, a ticket, a bill's number, an action id, an
action's number, a provider reference) finds what holds it, and the actions hanging off it, by btree
equality: the cost of that does not grow with the history (migration ``0018_search_exact_indexes``
adds the case-insensitive ones, ``0019_search_customer_name_index`` the customer's name, in the
order the search shows orders in). Only when that shows the person nothing is the term matched as a
case-insensitive substring of every searched column. The term's shape decides which columns
are asked: a ``re_...`` is only ever a refund's reference, an email only a customer's.

Speed of the substring search: on PostgreSQL the searched columns carry trigram GIN indexes
(migration ``0017_search_indexes``), which serve ``UPPER(col) LIKE UPPER('%term%')``, the SQL
Django writes for ``icontains``. Each table is searched by its own query on its own columns: a join
or an IN (subquery) inside one big OR would make PostgreSQL read the whole actions table. Actions
are then fetched by the matching orders, requests and bills through their foreign-key indexes. A
trigram scan reads every row sharing the term's trigrams, so a common part of a name ("Hopper")
costs more as the history grows (a whole name goes by the exact lookup's btree);
``tests/bench/bench_scale.py`` measures both. Terms shorter than three characters have no
trigram and are not searched (named, not an error), except an action's number.

Who sees what: people who can open an action's page (managers, finance, accounts payable,
admins) find every action, order and bill. Anybody else who may propose (an agent's owner) finds
only the actions they are accountable for, and no orders or bills. Nobody else finds anything.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from django.db.models import Q, QuerySet
from django.urls import reverse

from actions import permissions as perms
from actions.models import Action, Bill, Order, RefundRequest

# The fewest characters a term needs: a trigram index has nothing to offer below three.
MIN_TERM_LENGTH = 3
MAX_TERM_LENGTH = 200
# Each section shows the newest matches up to here, and says when there were more.
SECTION_LIMIT = 50
# How many matching orders, requests or bills to follow to their actions.
TARGET_LIMIT = 200


def may_search_everything(user: Any) -> bool:
    """Whoever can open an action's page in the console: managers decide, finance and accounts
    payable resolve, admins correct."""
    return bool(user.has_perm(perms.DECIDE) or user.has_perm(perms.RESOLVE) or user.has_perm(perms.CORRECT))


def may_search(user: Any) -> bool:
    return may_search_everything(user) or bool(user.has_perm(perms.PROPOSE))


def action_urls(user: Any) -> Callable[[int], str | None]:
    """The page where this person reads an action, by the action's key: the manager's detail for
    a manager, finance's for finance, accounts payable and admins; None when the person has no
    page for it. The person's permissions are asked once for a list of actions, not once a row
    (each ``has_perm`` asks every authentication backend)."""
    if user.has_perm(perms.DECIDE):
        page = "approvals-detail"
    elif user.has_perm(perms.RESOLVE) or user.has_perm(perms.CORRECT):
        page = "review-action"
    else:
        return lambda pk: None
    return lambda pk: reverse(page, args=[pk])


def visible_actions(user: Any) -> QuerySet[Action]:
    """The actions this person may see at all (see the module's docstring)."""
    if may_search_everything(user):
        return Action.objects.all()
    if user.has_perm(perms.PROPOSE):
        return Action.objects.filter(proposed_by_user=user)
    return Action.objects.none()


def action_number(term: str) -> int | None:
    """The action's number a term of digits names, or None.

    ``str.isdigit`` also accepts digits that ``int`` refuses (superscripts such as "²"), and a
    pasted 30-digit number is no primary key: both are no match, never an error page."""
    if not term.isdigit():
        return None
    try:
        number = int(term)
    except ValueError:
        return None
    return number if 0 < number <= MAX_ACTION_NUMBER else None


def action_condition(term: str) -> Q:
    """The actions whose own searchable columns contain ``term``: the query the trigram index
    indexes ``action_id_trgm_idx`` and ``action_provider_ref_trgm_idx`` serve."""
    shape = _shape(term)
    if shape in ("charge_reference", "email"):
        # Neither is ever part of an action id or a refund's reference: found through the order.
        return Q(pk__in=[])
    if shape == "action_id":
        # An action id ("refund:order-4821:request-1") is matched from its start, as written, by
        # the unique column's btree (its pattern-ops twin serves LIKE 'term%'). Its trigrams
        # ("ref", "und", "ord"...) are in every action id, which makes a trigram scan slow.
        return Q(action_id__startswith=term)
    condition = Q(action_id__icontains=term) | Q(provider_reference__icontains=term)
    number = action_number(term)
    if number is not None:
        condition |= Q(pk=number)
    return condition


def exact_action_condition(term: str) -> Q | None:
    """The actions whose own identifier columns hold exactly ``term``, each by a btree: a
    refund's reference (``action_provider_ref_idx``) or an action id (its unique index). None
    when no such column can hold a term of this shape. (An action's number is apart: see
    ``Lookup.number``.)"""
    shape = _shape(term)
    if shape == "refund_reference":
        return Q(provider_reference=term)
    if shape == "action_id":
        return Q(action_id=term)
    return None


# Provider references name what they are by their prefix: a refund's (``re_``, ``pyr_``) lives on
# the action, a charge's (``ch_``, ``py_``, ``pi_``) on the order.
ACTION_REFERENCE_PREFIXES = ("re_", "pyr_")
CHARGE_REFERENCE_PREFIXES = ("ch_", "py_", "pi_")
# The largest primary key PostgreSQL's bigint holds: a longer number names no action.
MAX_ACTION_NUMBER = 2**63 - 1


def _shape(term: str) -> str:
    lowered = term.lower()
    if lowered.startswith(ACTION_REFERENCE_PREFIXES):
        return "refund_reference"
    if lowered.startswith(CHARGE_REFERENCE_PREFIXES):
        return "charge_reference"
    if "@" in term:
        return "email"
    if ":" in term and " " not in term:
        return "action_id"
    return "any"


def matching_orders(term: str) -> QuerySet[Order]:
    """Orders by any part of their number, customer name or email, or the provider's charge
    (``ch_...``).

    A term that says what it is (an email, a charge) is looked for in that column only: fewer
    index scans, and no order matched by accident by a refund's reference."""
    shape = _shape(term)
    if shape in ("refund_reference", "action_id"):
        return Order.objects.none()
    if shape == "charge_reference":
        return Order.objects.filter(charge_reference__icontains=term)
    if shape == "email":
        return Order.objects.filter(customer_email__icontains=term)
    return Order.objects.filter(
        Q(number__icontains=term)
        | Q(customer_name__icontains=term)
        | Q(customer_email__icontains=term)
        | Q(charge_reference__icontains=term)
    )


def exact_orders(term: str) -> QuerySet[Order]:
    """Orders whose charge, customer email or number is ``term``, each by a btree: the charge
    as the provider spells it (``order_charge_ref_idx``), the email and the number in any case
    (``order_email_upper_idx``, ``order_number_upper_idx``)."""
    shape = _shape(term)
    if shape == "charge_reference":
        return Order.objects.filter(charge_reference=term)
    if shape == "email":
        return Order.objects.filter(customer_email__iexact=term)
    if shape == "any":
        return Order.objects.filter(number__iexact=term)
    return Order.objects.none()


def exact_named_orders(term: str) -> QuerySet[Order] | None:
    """Orders whose customer's name is ``term`` in any case, newest first, by one btree that is
    already in that order (``order_name_upper_paid_idx``: the upper-cased name, then paid_at and
    id descending): the newest ``TARGET_LIMIT`` of a name thousands of orders share are read
    from the front of the index, however long the history. Its own query, not another branch of
    ``exact_orders``' OR: PostgreSQL answers an OR with a bitmap of every matching row, sorted
    afterwards, which grows with the history again."""
    if _shape(term) != "any":
        return None
    return Order.objects.filter(customer_name__iexact=term)


def matching_requests(term: str) -> QuerySet[RefundRequest]:
    """Refund requests by any part of their ticket (the external reference)."""
    if _shape(term) != "any":
        return RefundRequest.objects.none()
    return RefundRequest.objects.filter(external_reference__icontains=term)


def exact_requests(term: str) -> QuerySet[RefundRequest]:
    """Refund requests whose ticket is ``term``, in any case (``refund_request_ref_upper_idx``)."""
    if _shape(term) != "any":
        return RefundRequest.objects.none()
    return RefundRequest.objects.filter(external_reference__iexact=term)


def matching_bills(term: str) -> QuerySet[Bill]:
    if _shape(term) != "any":
        return Bill.objects.none()
    return Bill.objects.filter(
        Q(number__icontains=term) | Q(supplier_name__icontains=term) | Q(accounting_reference__icontains=term)
    )


def exact_bills(term: str) -> QuerySet[Bill]:
    """Bills whose number is ``term`` in any case (``bill_number_upper_idx``), or whose
    accounting reference is ``term`` as the accounting system spells it."""
    if _shape(term) != "any":
        return Bill.objects.none()
    return Bill.objects.filter(Q(number__iexact=term) | Q(accounting_reference=term))


@dataclass(frozen=True)
class Lookup:
    """One way of matching a term on every searched table: exactly, or by any part of it.

    The querysets are not run here: ``found`` runs each at most once. ``number`` is an action's
    number the term may be, found by the primary key alongside what holds the term; unlike the
    rest it never decides that the exact lookup found something (see ``_holds_the_term``)."""

    exact: bool
    actions: Q | None
    orders: QuerySet[Order]
    requests: QuerySet[RefundRequest]
    bills: QuerySet[Bill]
    number: int | None = None
    # Orders by the customer's whole name (exact lookup only), run as a query of their own.
    named_orders: QuerySet[Order] | None = None


def lookup_exact(term: str) -> Lookup:
    return Lookup(
        exact=True,
        actions=exact_action_condition(term),
        orders=exact_orders(term),
        requests=exact_requests(term),
        bills=exact_bills(term),
        number=action_number(term) if _shape(term) == "any" else None,
        named_orders=exact_named_orders(term),
    )


def lookup_containing(term: str) -> Lookup:
    return Lookup(
        exact=False,
        actions=action_condition(term),
        orders=matching_orders(term),
        requests=matching_requests(term),
        bills=matching_bills(term),
    )


@dataclass(frozen=True)
class Found:
    """What one lookup found: the newest matching orders (a section's worth, and one more to
    tell that there are more) and bills, the keys of every order and ticket followed to their
    actions (up to ``TARGET_LIMIT`` each), and the query for the actions, or None when nothing
    can lead to one."""

    orders: list[Order]
    bills: list[Bill]
    actions: QuerySet[Action] | None
    request_pks: frozenset[int] = frozenset()
    number: int | None = None
    order_pks: frozenset[int] = frozenset()


def found(lookup: Lookup, base: QuerySet[Action]) -> Found:
    """Runs ``lookup``: the orders, tickets and bills first, each by its own indexed query, then
    their primary keys go into the actions' condition, so each part of the OR is an index scan
    (a join or an IN (subquery) inside one big OR would make PostgreSQL read the whole actions
    table).

    The orders followed to their actions are the newest ones: the same scan of the trigram
    indexes gives the orders' section its keys, whose rows are then read by primary key."""
    # Up to TARGET_LIMIT orders are followed to their actions, but only a section's worth is
    # shown: the rest are read as bare keys, not as model instances (at 1M actions a common name
    # matches hundreds of orders, and building 200 instances was a visible part of the page).
    newest = list(lookup.orders.order_by("-paid_at", "-pk").values_list("paid_at", "pk")[:TARGET_LIMIT])
    if lookup.named_orders is not None:
        newest += lookup.named_orders.order_by("-paid_at", "-pk").values_list("paid_at", "pk")[:TARGET_LIMIT]
        newest = sorted(set(newest), reverse=True)  # the same order as each query's
    order_pks = [pk for _, pk in newest[:TARGET_LIMIT]]
    shown = order_pks[: SECTION_LIMIT + 1]
    by_pk = Order.objects.in_bulk(shown)  # (no query for no keys)
    orders = [by_pk[pk] for pk in shown if pk in by_pk]
    request_pks = list(lookup.requests.order_by().values_list("pk", flat=True)[:TARGET_LIMIT])
    bills = list(lookup.bills.order_by("-issued_at", "-pk")[:TARGET_LIMIT])
    parts = [lookup.actions] if lookup.actions is not None else []
    if order_pks:
        parts.append(Q(order_id__in=order_pks))
    if request_pks:
        parts.append(Q(refund_request_id__in=request_pks))
    if bills:
        parts.append(Q(bill_id__in=[bill.pk for bill in bills]))
    if lookup.number is not None:
        parts.append(Q(pk=lookup.number))
    what = Found(
        orders=orders,
        bills=bills,
        actions=None,
        request_pks=frozenset(request_pks),
        number=lookup.number,
        order_pks=frozenset(order_pks),
    )
    if not parts:
        # Nothing can lead to an action: no query to send.
        return what
    condition = parts[0]
    for part in parts[1:]:
        condition |= part
    return replace(what, actions=base.filter(condition))


def search_actions(term: str, base: QuerySet[Action] | None = None) -> QuerySet[Action]:
    """Actions matching ``term`` on their own columns or through their order, ticket or bill:
    exactly if any of ``base`` does (see ``search``), else by any part of the term."""
    base = Action.objects.all() if base is None else base
    lookup = lookup_exact(term)
    # Decided without the action's number, as in ``search``: see ``_holds_the_term``.
    holding = found(replace(lookup, number=None), base).actions
    if holding is not None and holding.exists():
        exact = found(lookup, base).actions
        assert exact is not None
        return exact
    containing = found(lookup_containing(term), base).actions
    return containing if containing is not None else base.none()


@dataclass(frozen=True)
class ActionHit:
    action: Action
    url: str | None
    # The page of the action's order, for the people who may open it.
    order_url: str | None = None


@dataclass(frozen=True)
class OrderHit:
    order: Order
    url: str | None


@dataclass
class SearchResults:
    term: str
    problem: str = ""
    actions: list[ActionHit] = field(default_factory=list)
    orders: list[OrderHit] = field(default_factory=list)
    bills: list[Bill] = field(default_factory=list)
    more_actions: bool = False
    more_orders: bool = False
    more_bills: bool = False
    # Whether the person sees everything, or only their own proposals (said on the page).
    everything: bool = True
    # Whether these are exact matches (the term is an identifier something holds whole), or
    # matches of any part of the term.
    exact: bool = False

    @property
    def searched(self) -> bool:
        return bool(self.term) and not self.problem

    @property
    def empty(self) -> bool:
        return not (self.actions or self.orders or self.bills)


def clean_term(raw: str) -> tuple[str, str]:
    """The term to search for, and a problem to show instead when there is one."""
    term = " ".join(raw.split())
    if not term:
        return "", ""
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in raw):
        return "", "The search may not contain control characters."
    if len(term) > MAX_TERM_LENGTH:
        return term[:MAX_TERM_LENGTH], f"That is too long to search for: at most {MAX_TERM_LENGTH} characters."
    if len(term) < MIN_TERM_LENGTH and action_number(term) is None:
        return term, f"Type at least {MIN_TERM_LENGTH} characters (or an action's number)."
    return term, ""


def search(*, user: Any, raw: str) -> SearchResults:
    """Searches for ``raw`` as ``user`` may see it: exactly first, then by any part of it.

    A term that is exactly an order's number, a customer's email or whole name, a ticket, a bill's
    number, an action id, an action's number or a provider reference finds what holds it (and the actions
    that hang off it) through btree indexes, whose cost does not grow with the history. Only when
    the exact lookup shows this person nothing is the term looked for as a part, by the trigram
    indexes, whose cost grows with the number of rows that share the term's trigrams.

    Whether to fall back is decided on what this person would be shown (an agent's owner: their
    own actions only), so the answer says nothing about rows they may not see."""
    term, problem = clean_term(raw)
    everything = may_search_everything(user)
    results = SearchResults(term=term, problem=problem, everything=everything)
    if not term or problem:
        return results
    visible = visible_actions(user)
    if len(term) < MIN_TERM_LENGTH:
        # A short number is an action's number: too short for the substring indexes.
        number = action_number(term)
        short = visible.filter(pk=number) if number is not None else visible.none()
        _show(results, Found(orders=[], bills=[], actions=short), user)
        return results
    for lookup in (lookup_exact(term), lookup_containing(term)):
        what = found(lookup, visible)
        _show(results, what, user)
        results.exact = lookup.exact
        if not lookup.exact or _holds_the_term(results, what):
            break
    return results


def _holds_the_term(results: SearchResults, what: Found) -> bool:
    """Whether the exact lookup showed something that holds the term, rather than only the
    action whose number it happens to be: at scale every run of digits is some action's number,
    and that alone must not hide the orders and tickets that contain those digits ("482" for
    order 4821)."""
    if results.orders or results.bills:
        return True
    order_pks = what.order_pks
    bill_pks = {bill.pk for bill in what.bills}
    return any(
        action.pk != what.number
        or action.order_id in order_pks
        or action.refund_request_id in what.request_pks
        or action.bill_id in bill_pks
        for action in (hit.action for hit in results.actions)
    )


# What the results page shows of an action and of what it hangs off (templates/console/search.html),
# and what ``_holds_the_term`` and ``action_urls`` read: nothing else is loaded. An action has 32
# columns, 10 of them moments and JSON documents that psycopg would parse for every row.
SHOWN_ACTION_FIELDS = (
    "action_id",
    "kind",
    "status",
    "amount",
    "currency",
    "provider_reference",
    "created_at",
    "order",
    "refund_request",
    "bill",
    "order__number",
    "order__customer_name",
    "refund_request__external_reference",
    "bill__number",
    "bill__supplier_name",
)


def newest_shown_actions(actions: QuerySet[Action]) -> list[Action]:
    """The newest section's worth of ``actions`` (and one more, to tell that there are more),
    with what the page shows of their order, ticket and bill.

    The newest are chosen by their keys alone, in a subquery, and only those rows are then read
    whole and joined: a common name's 200 orders hold some 800 actions at 1M, and joining every
    one of them to its order before the sort kept the others' rows for nothing."""
    ordering = ("-created_at", "-pk")
    newest = actions.order_by(*ordering).values("pk")[: SECTION_LIMIT + 1]
    shown = Action.objects.filter(pk__in=newest).select_related("order", "bill", "refund_request")
    return list(shown.only(*SHOWN_ACTION_FIELDS).order_by(*ordering))


def _show(results: SearchResults, what: Found, user: Any) -> None:
    actions: list[Action] = []
    if what.actions is not None:
        actions = newest_shown_actions(what.actions)
    results.more_actions = len(actions) > SECTION_LIMIT
    url = action_urls(user)
    # Orders and bills are for the people who see everything (see the module's docstring).
    order_page = _order_page if results.everything else lambda pk: None
    results.actions = [
        ActionHit(action, url(action.pk), order_page(action.order_id) if action.order_id else None)
        for action in actions[:SECTION_LIMIT]
    ]
    if results.everything:
        results.more_orders = len(what.orders) > SECTION_LIMIT
        results.orders = [OrderHit(order, _order_page(order.pk)) for order in what.orders[:SECTION_LIMIT]]
        results.more_bills = len(what.bills) > SECTION_LIMIT
        results.bills = what.bills[:SECTION_LIMIT]


def _order_page(pk: int) -> str:
    return reverse("order-detail", args=[pk])
