"""The console's one search box: find an action, an order or a bill by what people have in hand.

A person pastes what they have: an order number ("4821"), a customer's name or email, a ticket
("T-1001"), an action id, a provider's reference (``re_...`` for a refund, ``ch_...`` for the
charge it was drawn from), a supplier bill's number or the supplier's name. Every term is a
case-insensitive substring match.

Speed at scale: on PostgreSQL the searched columns carry trigram GIN indexes (migration
``0017_search_indexes``), which serve ``UPPER(col) LIKE UPPER('%term%')``, the SQL Django writes
for ``icontains``. Each table is searched by its own query on its own columns: a join or an IN
(subquery) inside one big OR would make PostgreSQL read the whole actions table. Actions are then
fetched by the matching orders, requests and bills through their foreign-key indexes.
``tests/actions/test_search.py`` shows the plan; ``manage.py search_bench`` measures it at 1M
actions. Terms shorter than three characters have no trigram and are not searched (named, not
an error).

Who sees what: people who can open an action's page (managers, finance, accounts payable,
admins) find every action, order and bill. Anybody else who may propose (an agent's owner) finds
only the actions they are accountable for, and no orders or bills. Nobody else finds anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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


def action_url(action: Action, user: Any) -> str | None:
    """The page where this person reads the action: the manager's detail for a manager, finance's
    for finance, accounts payable and admins; None when the person has no page for it."""
    if user.has_perm(perms.DECIDE):
        return reverse("approvals-detail", args=[action.pk])
    if user.has_perm(perms.RESOLVE) or user.has_perm(perms.CORRECT):
        return reverse("review-action", args=[action.pk])
    return None


def order_url(order: Order, user: Any) -> str | None:
    return reverse("order-detail", args=[order.pk]) if may_search_everything(user) else None


def visible_actions(user: Any) -> QuerySet[Action]:
    """The actions this person may see at all (see the module's docstring)."""
    if may_search_everything(user):
        return Action.objects.all()
    if user.has_perm(perms.PROPOSE):
        return Action.objects.filter(proposed_by_user=user)
    return Action.objects.none()


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
    if term.isdigit():
        condition |= Q(pk=int(term))
    return condition


# Provider references name what they are by their prefix: a refund's (``re_``, ``pyr_``) lives on
# the action, a charge's (``ch_``, ``py_``, ``pi_``) on the order.
ACTION_REFERENCE_PREFIXES = ("re_", "pyr_")
CHARGE_REFERENCE_PREFIXES = ("ch_", "py_", "pi_")


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
    """Orders by number, customer name or email, or the provider's charge (``ch_...``).

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


def matching_requests(term: str) -> QuerySet[RefundRequest]:
    """Refund requests by their ticket (the external reference)."""
    if _shape(term) != "any":
        return RefundRequest.objects.none()
    return RefundRequest.objects.filter(external_reference__icontains=term)


def matching_bills(term: str) -> QuerySet[Bill]:
    if _shape(term) != "any":
        return Bill.objects.none()
    return Bill.objects.filter(
        Q(number__icontains=term) | Q(supplier_name__icontains=term) | Q(accounting_reference__icontains=term)
    )


def search_actions(term: str, base: QuerySet[Action] | None = None) -> QuerySet[Action]:
    """Actions matching ``term`` on their own columns or through their order, ticket or bill.

    The orders, requests and bills are found first, by their own indexed queries, and their
    primary keys put in the condition: each part of the OR is then an index scan."""
    base = Action.objects.all() if base is None else base
    condition = action_condition(term)
    order_pks = list(matching_orders(term).order_by().values_list("pk", flat=True)[:TARGET_LIMIT])
    if order_pks:
        condition |= Q(order_id__in=order_pks)
    request_pks = list(matching_requests(term).order_by().values_list("pk", flat=True)[:TARGET_LIMIT])
    if request_pks:
        condition |= Q(refund_request_id__in=request_pks)
    bill_pks = list(matching_bills(term).order_by().values_list("pk", flat=True)[:TARGET_LIMIT])
    if bill_pks:
        condition |= Q(bill_id__in=bill_pks)
    return base.filter(condition)


@dataclass(frozen=True)
class ActionHit:
    action: Action
    url: str | None


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
    if len(term) < MIN_TERM_LENGTH and not term.isdigit():
        return term, f"Type at least {MIN_TERM_LENGTH} characters (or an action's number)."
    return term, ""


def search(*, user: Any, raw: str) -> SearchResults:
    term, problem = clean_term(raw)
    everything = may_search_everything(user)
    results = SearchResults(term=term, problem=problem, everything=everything)
    if not term or problem:
        return results
    if len(term) < MIN_TERM_LENGTH:
        # A short number is an action's number: too short for the substring indexes.
        matched = visible_actions(user).filter(pk=int(term))
    else:
        matched = search_actions(term, visible_actions(user))
    actions = list(
        matched.select_related("order", "bill", "refund_request").order_by("-created_at", "-pk")[: SECTION_LIMIT + 1]
    )
    results.more_actions = len(actions) > SECTION_LIMIT
    results.actions = [ActionHit(action, action_url(action, user)) for action in actions[:SECTION_LIMIT]]
    if everything and len(term) >= MIN_TERM_LENGTH:
        orders = list(matching_orders(term).order_by("-paid_at", "-pk")[: SECTION_LIMIT + 1])
        results.more_orders = len(orders) > SECTION_LIMIT
        results.orders = [OrderHit(order, order_url(order, user)) for order in orders[:SECTION_LIMIT]]
        bills = list(matching_bills(term).order_by("-issued_at", "-pk")[: SECTION_LIMIT + 1])
        results.more_bills = len(bills) > SECTION_LIMIT
        results.bills = bills[:SECTION_LIMIT]
    return results
