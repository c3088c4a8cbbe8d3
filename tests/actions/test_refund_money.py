"""The refund kind's money, checked at the kind itself (``actions.kinds.refund``).

Invariant 5: per order, refunded = the sum of its SUCCEEDED refunds, reserved = the sum over its
live ones, outside refunded = the sum of its booked outside refunds, and the three within what
was captured. The engine's tests prove the money moves right; these prove that the kind's
reservation refuses in words that name the cause, and that its checker (``money_violations``,
which the invariant checker and the chaos runs read) finds each way the books can be wrong,
including the outside refunds, which only tests outside the mutation subset reached before.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.db.models import F
from django.utils import timezone

from actions.kinds import kind_for
from actions.kinds.refund.contract import RefundKind, remedy_open
from actions.models import Action, ActionKind, ActionStatus, Order, OutsideRefund, Remedy, RemedyKind
from actions.provider_events.services import outside_refund_record
from actions.services import Actor
from tests.actions.test_reconciliation import authorized_refund
from tests.approvals.test_reservation import order_of
from tests.factories import make_order

pytestmark = pytest.mark.django_db
S = ActionStatus


@pytest.fixture
def refunds() -> RefundKind:
    kind = kind_for(ActionKind.REFUND)
    assert isinstance(kind, RefundKind)
    return kind


def book_outside(
    order: Order, reference: str, minor: int, status: str = "succeeded", *, now: datetime | None = None
) -> None:
    """An outside refund as the provider's webhook books it (its amount in minor units), received
    ``now`` (by default, the clock's now)."""
    refund = {"id": reference, "status": status, "amount": minor, "currency": order.currency.lower()}
    outside_refund_record(
        order=order, refund=refund, event_id=f"evt_{reference}_{status}", now=now or timezone.now()
    )


def as_status(action: Action, status: str, order: Order, **money: Decimal) -> None:
    Action.objects.filter(pk=action.pk).update(status=status)
    Order.objects.filter(pk=order.pk).update(**money)


# --- the reservation -------------------------------------------------------------------------


def test_a_reservation_that_uses_the_whole_balance_is_made_and_raises_the_version(
    agent_actor: Actor, refunds: RefundKind
) -> None:
    action = authorized_refund(agent_actor, captured="20.00")  # the refund is 20.00: all of it
    order = order_of(action)
    assert refunds.reserve(action, approved_version=order.version) == []
    stored = Order.objects.get(pk=order.pk)
    assert (stored.reserved_amount, stored.version) == (action.amount, order.version + 1)


def test_a_reservation_one_cent_beyond_the_balance_is_refused_and_names_the_balance(
    agent_actor: Actor, refunds: RefundKind
) -> None:
    action = authorized_refund(agent_actor, captured="20.00")
    order = order_of(action)
    Order.objects.filter(pk=order.pk).update(refunded_amount=Decimal("0.01"))
    [failure] = refunds.reserve(action, approved_version=order.version)
    assert failure.binding == "balance"
    assert failure.message == f"The refundable balance 19.99 EUR no longer covers {action.amount}."
    assert Order.objects.get(pk=order.pk).reserved_amount == 0


@pytest.mark.parametrize("booked", ["refunded_amount", "reserved_amount", "outside_refunded_amount"])
def test_every_sum_already_on_the_order_counts_against_the_reservation(
    agent_actor: Actor, refunds: RefundKind, booked: str
) -> None:
    action = authorized_refund(agent_actor, captured="20.00")
    order = order_of(action)
    Order.objects.filter(pk=order.pk).update(**{booked: Decimal("0.01")})
    [failure] = refunds.reserve(action, approved_version=order.version)
    assert failure.binding == "balance"


def test_a_reservation_against_a_moved_order_names_both_versions(agent_actor: Actor, refunds: RefundKind) -> None:
    action = authorized_refund(agent_actor)
    order = order_of(action)
    Order.objects.filter(pk=order.pk).update(version=F("version") + 2)
    [failure] = refunds.reserve(action, approved_version=order.version)
    assert failure.binding == "order_version"
    assert failure.message == (
        f"The order changed since the approval (approved at version {order.version}, now {order.version + 2})."
    )
    assert Order.objects.get(pk=order.pk).reserved_amount == 0


def test_a_reservation_refused_after_an_outside_refund_says_what_was_refunded_and_what_is_left(
    agent_actor: Actor, refunds: RefundKind
) -> None:
    action = authorized_refund(agent_actor)  # captured 100.00
    order = order_of(action)
    approved = order.version
    book_outside(order, "re_outside_1", 3000)
    book_outside(order, "re_outside_2", 1250)
    [failure] = refunds.reserve(action, approved_version=approved)
    assert failure.binding == "order_version"
    assert failure.message == (
        f"The order changed since the approval (approved at version {approved}, now {approved + 2})."
        " A refund was made outside the console, at the payment provider: 30.00 EUR (re_outside_1);"
        " 12.50 EUR (re_outside_2). The order now has 57.50 EUR left to refund."
    )

    # Only the ones booked after the approved version are named.
    [later] = refunds.reserve(action, approved_version=approved + 1)
    assert "12.50 EUR (re_outside_2)" in later.message and "re_outside_1" not in later.message
    assert Order.objects.get(pk=order.pk).reserved_amount == 0


def test_a_moved_orders_message_names_its_own_outside_refunds_in_the_order_they_were_received(
    agent_actor: Actor, refunds: RefundKind
) -> None:
    """Another order's outside refund is not named, and two webhooks for this order are named in
    the order they arrived, not the order they were written (the second to arrive may take the
    order's lock first). The booking a later event reversed is still named once, as made; its
    reversal is not named as a second refund."""
    action = authorized_refund(agent_actor)  # captured 100.00
    order = order_of(action)
    approved = order.version
    elsewhere = order_of(authorized_refund(agent_actor))
    book_outside(elsewhere, "re_other_order", 700)
    received = timezone.now()
    book_outside(order, "re_second", 2000, now=received + timedelta(seconds=1))
    book_outside(order, "re_first", 1000, now=received)
    book_outside(order, "re_first", 1000, "failed", now=received + timedelta(seconds=2))
    [failure] = refunds.reserve(action, approved_version=approved)
    assert failure.message == (
        f"The order changed since the approval (approved at version {approved}, now {approved + 3})."
        " A refund was made outside the console, at the payment provider: 10.00 EUR (re_first);"
        " 20.00 EUR (re_second). The order now has 80.00 EUR left to refund."
    )


# --- the checker -----------------------------------------------------------------------------


@pytest.fixture
def consistent_books(agent_actor: Actor) -> dict[str, Order]:
    """Four orders whose books are right (succeeded, reserved, booked outside, a dead outside
    refund) and one the checker must not read: nothing was ever refunded on it."""
    succeeded, reserving = authorized_refund(agent_actor), authorized_refund(agent_actor)
    orders = {
        "succeeded": order_of(succeeded),
        "reserving": order_of(reserving),
        "outside": make_order(),
        "dead_outside": make_order(),
        "untouched": make_order(),
    }
    as_status(succeeded, S.SUCCEEDED, orders["succeeded"], refunded_amount=succeeded.amount)
    as_status(reserving, S.UNKNOWN, orders["reserving"], reserved_amount=reserving.amount)
    book_outside(orders["outside"], "re_booked", 2500)
    book_outside(orders["dead_outside"], "re_dead", 2500, status="failed")
    assert OutsideRefund.objects.filter(booked=False).count() == 1
    return orders


def test_books_that_are_right_have_no_violation_and_only_touched_orders_are_read(
    refunds: RefundKind, consistent_books: dict[str, Order]
) -> None:
    # The untouched order and the one whose outside refund was never booked are not read.
    assert refunds.money_violations() == (3, [])


@pytest.mark.parametrize(
    ("order", "change", "problem"),
    [
        ("succeeded", {"refunded_amount": Decimal("19.00")}, "refunded 19.00 but SUCCEEDED actions sum to 20.00"),
        ("reserving", {"reserved_amount": Decimal("0")}, "reserved 0.00 but live actions sum to 20.00"),
        (
            "outside",
            {"outside_refunded_amount": Decimal("20.00")},
            "outside refunded 20.00 but booked outside refunds sum to 25.00",
        ),
        ("untouched", {"refunded_amount": Decimal("1.00")}, "refunded 1.00 but SUCCEEDED actions sum to 0"),
        ("untouched", {"reserved_amount": Decimal("1.00")}, "reserved 1.00 but live actions sum to 0"),
        (
            "untouched",
            {"outside_refunded_amount": Decimal("1.00")},
            "outside refunded 1.00 but booked outside refunds sum to 0",
        ),
    ],
)
def test_each_sum_that_disagrees_with_its_actions_is_named_on_its_order(
    refunds: RefundKind, consistent_books: dict[str, Order], order: str, change: dict[str, Decimal], problem: str
) -> None:
    target = consistent_books[order]
    Order.objects.filter(pk=target.pk).update(**change)
    count, problems = refunds.money_violations()
    assert problems == [(f"order-{target.number}", problem)]
    assert count == (4 if order == "untouched" else 3)


@pytest.fixture
def without_the_money_constraint() -> None:
    """The database refuses an order whose money exceeds what was captured (the check constraint
    ``order_money_adds_up``); the checker must still see one, on a database restored without it.
    Dropped inside the test's transaction, which rolls back."""
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE actions_order DROP CONSTRAINT order_money_adds_up")


@pytest.mark.postgres
@pytest.mark.usefixtures("without_the_money_constraint")
def test_money_beyond_what_was_captured_is_a_violation_even_when_every_sum_agrees(
    agent_actor: Actor, refunds: RefundKind, consistent_books: dict[str, Order]
) -> None:
    order = consistent_books["succeeded"]
    Order.objects.filter(pk=order.pk).update(captured_amount=Decimal("19.99"))
    assert refunds.money_violations() == (
        3,
        [(f"order-{order.number}", "refunded + reserved + refunded outside exceeds captured")],
    )
    Order.objects.filter(pk=order.pk).update(captured_amount=Decimal("20.00"))
    assert refunds.money_violations() == (3, [])


@pytest.mark.postgres
@pytest.mark.usefixtures("without_the_money_constraint")
@pytest.mark.parametrize(
    "money",
    [
        {"refunded_amount": Decimal("6.00"), "outside_refunded_amount": Decimal("5.00")},
        {"reserved_amount": Decimal("6.00"), "outside_refunded_amount": Decimal("5.00")},
        {"refunded_amount": Decimal("6.00"), "reserved_amount": Decimal("5.00")},
    ],
)
def test_every_sum_on_the_order_counts_towards_what_was_captured(
    refunds: RefundKind, money: dict[str, Decimal]
) -> None:
    order = make_order(captured="10.00")
    Order.objects.filter(pk=order.pk).update(**money)
    exceeds = (f"order-{order.number}", "refunded + reserved + refunded outside exceeds captured")
    assert exceeds in refunds.money_violations()[1]
    Order.objects.filter(pk=order.pk).update(captured_amount=Decimal("11.00"))
    assert exceeds not in refunds.money_violations()[1]


def test_a_settled_or_failed_refund_reserves_nothing_in_the_checkers_sums(
    agent_actor: Actor, refunds: RefundKind
) -> None:
    for status in (S.FAILED_FINAL, S.AUTHORIZED, S.STALE):
        action = authorized_refund(agent_actor)
        as_status(action, status, order_of(action))
    assert refunds.money_violations() == (0, [])
    for status in (S.SUBMITTING, S.SETTLING, S.NEEDS_REVIEW):
        action = authorized_refund(agent_actor)
        order = order_of(action)
        as_status(action, status, order)
        assert refunds.money_violations()[1][-1] == (
            f"order-{order.number}",
            f"reserved 0.00 but live actions sum to {action.amount}",
        )
        Order.objects.filter(pk=order.pk).update(reserved_amount=action.amount)


def test_the_outside_refunds_booked_on_orders_explain_their_provider_effects(
    refunds: RefundKind, consistent_books: dict[str, Order]
) -> None:
    number = consistent_books["outside"].number
    assert refunds.explained_effects() == {"re_booked": f"an outside refund booked on order {number}"}


# --- the remedy --------------------------------------------------------------------------------


def test_a_refund_that_failed_for_good_opens_a_remedy_for_its_whole_amount(
    agent_actor: Actor, finance: Any, refunds: RefundKind
) -> None:
    action = authorized_refund(agent_actor)
    remedy = remedy_open(action)
    assert (remedy.action_id, remedy.amount, remedy.currency, remedy.owner) == (
        action.pk,
        action.amount,
        "EUR",
        finance,
    )
    assert remedy.note.startswith("Opened automatically: the refund failed for good.")
    assert remedy.created_at >= timezone.now() - timedelta(minutes=1)


def test_a_refund_resolved_as_failed_opens_the_remedy_finance_chose_for_what_the_customer_expects(
    agent_actor: Actor, finance: Any, refunds: RefundKind
) -> None:
    """What finance's "failed for good" resolution opens (actions.engine.resolutions): the
    end-to-end resolution needs the sandbox process, outside the mutation subset."""
    action = authorized_refund(agent_actor)
    remedy = refunds.failure_resolved(
        action, owner=finance, choice=RemedyKind.CHEQUE, amount=Decimal("12.34"), note="Resolved by finance."
    )
    stored = Remedy.objects.get(pk=remedy.pk)
    assert (stored.action_id, stored.kind, stored.amount, stored.currency) == (
        action.pk,
        RemedyKind.CHEQUE,
        Decimal("12.34"),
        "EUR",
    )
    assert (stored.owner, stored.note) == (finance, "Resolved by finance.")
