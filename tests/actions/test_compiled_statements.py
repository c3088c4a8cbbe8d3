"""UPDATEs compiled once and run with new values (actions.compiled_statements, issue 18 P-a).

A compiled update must do exactly what the queryset it was written as does, each run with that
run's values: the same rows changed, the same count returned, nothing written where its filter
does not hold. It is compiled once per database alias, refuses a statement that is not a single
UPDATE of one table, and marks an atomic block for rollback on an error as QuerySet.update does.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import IntegrityError, NotSupportedError, connection, transaction
from django.db.models import F
from django.db.transaction import TransactionManagementError
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from actions.compiled_statements import (
    AnyOf,
    CompiledInsert,
    CompiledSelect,
    CompiledUpdate,
    KeyList,
    SavedValues,
    Slot,
    ValueOfEachRow,
    ValuesByPrimaryKey,
)
from actions.kinds import refund
from actions.models import Order, RefundRequest
from tests.factories import make_order

pytestmark = pytest.mark.django_db


def reserve(pk: int, version: int, amount: str) -> int:
    return refund._ORDER_RESERVE.run(pk=pk, version=version, amount=Decimal(amount))


def money(order: Order) -> tuple[Decimal, Decimal, int]:
    order.refresh_from_db()
    return order.reserved_amount, order.refunded_amount, order.version


@contextmanager
def texts_sent() -> Iterator[list[str]]:
    """The SQL texts sent in the block, as sent: before the parameters are bound."""
    sent: list[str] = []

    def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        sent.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        yield sent


def test_each_run_writes_its_own_values_on_its_own_row() -> None:
    first, second = make_order(captured="100.00"), make_order(captured="50.00")

    assert reserve(first.pk, 1, "30.00") == 1
    assert reserve(second.pk, 1, "20.00") == 1
    assert reserve(first.pk, 2, "5.50") == 1

    assert money(first) == (Decimal("35.50"), Decimal("0.00"), 3)
    assert money(second) == (Decimal("20.00"), Decimal("0.00"), 2)

    refund._ORDER_BOOK.run(pk=first.pk, amount=Decimal("30.00"))
    refund._ORDER_RELEASE.run(pk=first.pk, amount=Decimal("5.50"))
    assert money(first) == (Decimal("0.00"), Decimal("30.00"), 3)
    assert money(second) == (Decimal("20.00"), Decimal("0.00"), 2)


def test_a_run_whose_filter_does_not_hold_writes_nothing_and_says_so() -> None:
    order = make_order(captured="100.00")

    assert reserve(order.pk, 7, "10.00") == 0  # not the order's version
    assert reserve(order.pk, 1, "100.01") == 0  # more than the refundable balance
    assert money(order) == (Decimal("0.00"), Decimal("0.00"), 1)

    assert reserve(order.pk, 1, "100.00") == 1  # exactly the balance
    assert reserve(order.pk, 2, "0.01") == 0
    assert money(order) == (Decimal("100.00"), Decimal("0.00"), 2)


def test_it_is_compiled_once_and_runs_one_statement_each_time() -> None:
    built: list[dict[str, Any]] = []

    def build(pk: Any, amount: Any) -> Any:
        built.append({"pk": pk, "amount": amount})
        return Order.objects.filter(pk=pk), {"reserved_amount": F("reserved_amount") + amount}

    statement = CompiledUpdate(Order, build, pk=Order._meta.pk, amount=Order._meta.get_field("reserved_amount"))
    order = make_order()

    with CaptureQueriesContext(connection) as queries:
        for _ in range(3):
            assert statement.run(pk=order.pk, amount=Decimal("1.00")) == 1

    assert len(built) == 1
    assert len(queries) == 3
    assert all(query["sql"].startswith('UPDATE "actions_order" SET') for query in queries)
    assert money(order)[0] == Decimal("3.00")


def test_it_refuses_an_update_through_a_join() -> None:
    """Filtered through a join, Django's UPDATE is a subquery on PostgreSQL, but on a database that
    cannot select from the table it updates Django first SELECTs the rows and then updates them by
    id: a compiled statement would carry one run's ids for ever. Only one-table updates compile."""
    joined = CompiledUpdate(
        Order,
        lambda pk: (Order.objects.filter(refund_requests__pk=pk), {"version": F("version") + 1}),
        pk=Order._meta.pk,
    )

    with pytest.raises(ValueError, match="not one UPDATE of one table"):
        joined.run(pk=1)


def test_it_refuses_a_statement_built_on_another_model() -> None:
    """Its rows would be another table's, its slots prepared as another model's columns."""
    other = CompiledUpdate(
        Order,
        lambda pk: (RefundRequest.objects.filter(pk=pk), {"number": F("number") + 1}),
        pk=Order._meta.pk,
    )

    with pytest.raises(TypeError, match="a compiled update of Order built a queryset of RefundRequest"):
        other.run(pk=1)


def test_it_refuses_values_that_are_not_its_slots() -> None:
    order = make_order()

    with pytest.raises(TypeError, match=r"takes \['amount', 'pk', 'version'\]"):
        refund._ORDER_RESERVE.run(pk=order.pk, amount=Decimal("1.00"))
    with pytest.raises(TypeError):
        refund._ORDER_BOOK.run(pk=order.pk, amount=Decimal("1.00"), version=1)
    assert money(order) == (Decimal("0.00"), Decimal("0.00"), 1)


def test_a_slot_the_statement_does_not_use_is_refused_when_it_is_compiled() -> None:
    unused = CompiledUpdate(
        Order,
        lambda pk, amount: (Order.objects.filter(pk=pk), {"version": F("version") + 1}),
        pk=Order._meta.pk,
        amount=Order._meta.get_field("reserved_amount"),
    )

    with pytest.raises(ValueError, match=r"uses the slots \['pk'\]"):
        unused.run(pk=1, amount=Decimal("1.00"))


def test_an_error_marks_the_atomic_block_for_rollback_even_when_caught() -> None:
    """As QuerySet.update: releasing more than is reserved breaks the order's CHECK constraint;
    a caller that catches the error cannot go on writing in the broken transaction."""
    order = make_order()

    with transaction.atomic():
        with pytest.raises(IntegrityError):
            refund._ORDER_RELEASE.run(pk=order.pk, amount=Decimal("1.00"))
        with pytest.raises(TransactionManagementError):
            Order.objects.filter(pk=order.pk).update(version=F("version") + 1)

    assert money(order) == (Decimal("0.00"), Decimal("0.00"), 1)


def test_values_by_primary_key_sets_each_named_row_to_its_own_value() -> None:
    first, second, untouched = make_order(), make_order(), make_order()
    name = Order._meta.get_field("customer_name")
    captured = Order._meta.get_field("captured_amount")

    updated = Order.objects.filter(pk__in=[first.pk, second.pk]).update(
        customer_name=ValuesByPrimaryKey(name, {first.pk: "Grace Hopper", second.pk: "Edsger's"}),
        captured_amount=ValuesByPrimaryKey(captured, {first.pk: Decimal("12.34"), second.pk: Decimal("0.01")}),
    )

    assert updated == 2
    rows = {o.pk: (o.customer_name, o.captured_amount) for o in Order.objects.all()}
    assert rows[first.pk] == ("Grace Hopper", Decimal("12.34"))
    assert rows[second.pk] == ("Edsger's", Decimal("0.01"))
    assert rows[untouched.pk] == ("Ada Lovelace", Decimal("100.00"))


@pytest.mark.postgres
def test_value_of_each_row_sets_each_named_row_to_its_own_value_with_one_text_for_any_number(
    agent_actor: Any, dispatched: list[int]
) -> None:
    """The compiled form of an UPDATE of several rows: each row gets the value at its key's
    position, None is SQL NULL (not JSON null), a row not named keeps its values, and the text
    sent is the same for one row as for two."""
    from django.utils import timezone

    from actions.models import Attempt
    from tests.actions.test_reconciliation import authorized_refund

    action = authorized_refund(agent_actor)
    first, second, third, untouched = (
        Attempt.objects.create(action=action, kind="submit", started_at=timezone.now(), response={"old": index})
        for index in range(4)
    )
    response, outcome = Attempt._meta.get_field("response"), Attempt._meta.get_field("outcome")

    def build(keys: Any, response: Any, outcome: Any) -> Any:
        return Attempt.objects.filter(AnyOf("pk", keys)), {
            "response": ValueOfEachRow(response, keys),
            "outcome": ValueOfEachRow(outcome, keys),
        }

    statement = CompiledUpdate(
        Attempt, build, keys=KeyList(Attempt._meta.pk), response=SavedValues(response), outcome=SavedValues(outcome)
    )
    with texts_sent() as sent:
        # The keys in another order than the rows' own: each value goes with its key.
        two = statement.run(keys=[second.pk, first.pk], response=[None, {"id": "re_1"}], outcome=["unknown", "ok"])
        assert two == 2
        assert statement.run(keys=[third.pk], response=[{"id": "re_3"}], outcome=["ok"]) == 1

    assert len(sent) == 2 and sent[0] == sent[1]
    rows = {row.pk: (row.response, row.outcome) for row in Attempt.objects.filter(action=action)}
    assert rows == {
        first.pk: ({"id": "re_1"}, "ok"),
        second.pk: (None, "unknown"),
        third.pk: ({"id": "re_3"}, "ok"),
        untouched.pk: ({"old": 3}, ""),
    }
    assert Attempt.objects.filter(pk=second.pk, response__isnull=True).exists()  # SQL NULL, not JSON null


def test_value_of_each_row_is_refused_off_postgresql_and_without_its_slots() -> None:
    name = Order._meta.get_field("customer_name")
    with pytest.raises(TypeError, match="SavedValues"):
        ValueOfEachRow(Slot("names", name), Slot("keys", KeyList(Order._meta.pk)))
    if connection.vendor == "postgresql":
        return
    order = make_order()
    with pytest.raises(NotSupportedError, match="PostgreSQL"):
        Order.objects.filter(pk=order.pk).update(
            customer_name=ValueOfEachRow(Slot("names", SavedValues(name)), Slot("keys", KeyList(Order._meta.pk)))
        )


# --- CompiledSelect --------------------------------------------------------------------------


def newest_orders(limit: int, above: Any = None) -> Any:
    rows = Order.objects.annotate(spare=F("captured_amount") - F("reserved_amount")).order_by("-pk")
    if above is not None:
        rows = rows.filter(captured_amount__gt=above)
    return rows[:limit]


def test_a_compiled_select_loads_the_rows_the_queryset_loads_each_run_with_its_own_values() -> None:
    for captured in ("10.00", "20.00", "30.00", "40.00"):
        make_order(captured=captured)
    statement = CompiledSelect(Order, newest_orders, shape=("limit",), above=Order._meta.get_field("captured_amount"))

    for limit, above in ((2, Decimal("0")), (3, Decimal("15.00")), (2, Decimal("25.00")), (5, Decimal("35.00"))):
        loaded = statement.rows(limit=limit, above=above)
        expected = list(newest_orders(limit, above))
        assert [o.pk for o in loaded] == [o.pk for o in expected]
        assert [(o.number, o.captured_amount, o.spare) for o in loaded] == [
            (o.number, o.captured_amount, o.spare) for o in expected
        ]
        assert all(isinstance(o, Order) and not o._state.adding for o in loaded)


def test_a_compiled_select_is_compiled_once_per_shape_and_runs_one_statement_each_time() -> None:
    make_order()
    shapes: list[int] = []

    def build(limit: int) -> Any:
        shapes.append(limit)
        return newest_orders(limit)

    statement = CompiledSelect(Order, build, shape=("limit",))
    with CaptureQueriesContext(connection) as queries:
        for limit in (4, 4, 8, 4, 8):
            statement.rows(limit=limit)

    assert shapes == [4, 8]
    assert len(queries) == 5
    assert [q["sql"].endswith("LIMIT 4") for q in queries.captured_queries] == [True, True, False, True, False]


def test_past_its_shapes_a_compiled_select_compiles_each_new_one_at_every_run() -> None:
    make_order()
    shapes: list[int] = []

    def build(limit: int) -> Any:
        shapes.append(limit)
        return newest_orders(limit)

    statement = CompiledSelect(Order, build, shape=("limit",), max_shapes=2)
    for limit in (1, 2, 3, 3, 1):
        assert len(statement.rows(limit=limit)) == 1

    assert shapes == [1, 2, 3, 3]  # 1 and 2 kept, 3 compiled each time


def test_a_compiled_select_refuses_what_it_cannot_load_or_was_not_told() -> None:
    with pytest.raises(TypeError, match="built a queryset of RefundRequest"):
        CompiledSelect(Order, lambda: RefundRequest.objects.all()).rows()
    with pytest.raises(ValueError, match="for_update=False"):
        CompiledSelect(Order, lambda: Order.objects.select_for_update()).rows()
    with pytest.raises(ValueError, match="one model's rows"):
        CompiledSelect(RefundRequest, lambda: RefundRequest.objects.select_related("order")).rows()
    with pytest.raises(ValueError, match="one model's rows"):
        CompiledSelect(Order, lambda: Order.objects.values("pk", "number")).rows()
    with pytest.raises(ValueError, match="one model's rows"):
        CompiledSelect(Order, lambda: Order.objects.prefetch_related("actions")).rows()
    with pytest.raises(ValueError, match="uses the slots"):
        CompiledSelect(Order, lambda above: Order.objects.all(), above=Order._meta.get_field("captured_amount")).rows(
            above=Decimal("1")
        )
    statement = CompiledSelect(Order, newest_orders, shape=("limit",))
    with pytest.raises(TypeError, match="takes"):
        statement.rows(limit=1, above=Decimal("1"))
    with pytest.raises(TypeError, match="takes"):
        statement.rows()


def test_the_claims_compiled_read_locks_the_oldest_authorized_actions_as_loaded_rows(
    agent_actor: Any, dispatched: list[int]
) -> None:
    """The batched claim's read (actions.engine.claim): the oldest AUTHORIZED actions, in order,
    loaded as the ORM loads them (so a later save knows which fields changed), with their agent's
    webhook, and locked FOR UPDATE SKIP LOCKED on PostgreSQL (tests/actions/test_batch_claims.py
    holds a row from another session and the batch skips it)."""
    from actions.engine import claim
    from actions.models import Action, ActionStatus
    from tests.actions.test_reconciliation import authorized_refund

    actions = [authorized_refund(agent_actor) for _ in range(3)]
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        loaded = claim._CLAIMABLE.rows(limit=2)

    assert [a.pk for a in loaded] == [a.pk for a in actions[:2]]
    assert all(a.status == ActionStatus.AUTHORIZED and a.changed_fields() == [] for a in loaded)
    by_orm = {a.pk: a for a in Action.objects.filter(pk__in=[a.pk for a in loaded])}
    for action in loaded:  # every column as the ORM loads it: JSON as dicts, money as Decimal
        expected = by_orm[action.pk]
        assert isinstance(action.payload, dict) and isinstance(action.amount, Decimal)
        assert [getattr(action, f.attname) for f in Action._meta.concrete_fields] == [
            getattr(expected, f.attname) for f in Action._meta.concrete_fields
        ]
    assert [a.agent_webhook_pk for a in loaded] == [None, None]
    assert all(type(a) is Action for a in loaded)
    if connection.vendor == "postgresql":
        assert queries.captured_queries[-1]["sql"].endswith("LIMIT 2 FOR UPDATE SKIP LOCKED")


# --- AnyOf: a list of keys as one array parameter -------------------------------------------


def orders_among(keys: Any) -> Any:
    return Order.objects.filter(AnyOf("pk", keys)).order_by("pk")


@pytest.mark.postgres
def test_any_of_reads_the_rows_of_any_number_of_keys_with_one_statement_text() -> None:
    orders = [make_order() for _ in range(4)]
    built = []

    def build(keys: Any) -> Any:
        built.append(keys)
        return orders_among(keys)

    statement = CompiledSelect(Order, build, keys=KeyList(Order._meta.pk))
    with CaptureQueriesContext(connection) as queries:
        for keys in ([orders[2].pk], [o.pk for o in orders], [], [orders[0].pk, orders[3].pk, 10**12]):
            assert [o.pk for o in statement.rows(keys=keys)] == sorted(k for k in keys if k != 10**12)

    assert len(built) == 1  # one statement for lists of 1, 4, 0 and 3 keys
    assert len(queries) == 4 and all("= ANY(" in q["sql"] for q in queries.captured_queries)


def test_any_of_is_refused_off_postgresql_and_without_a_key_list() -> None:
    with pytest.raises(TypeError, match="KeyList"):
        AnyOf("pk", Slot("keys", Order._meta.pk))
    if connection.vendor == "postgresql":
        return
    with pytest.raises(NotSupportedError, match="PostgreSQL"):
        CompiledSelect(Order, orders_among, keys=KeyList(Order._meta.pk)).rows(keys=[1])


def test_the_approvals_in_force_are_each_actions_newest_approve_row(agent_actor: Any, dispatched: list[int]) -> None:
    """The batched claim's read of its approvals (compiled on PostgreSQL, the ORM's IN elsewhere):
    the newest APPROVE row of each action named, a later REJECT row ignored, no other action's."""
    from approvals.models import Approval, Decision
    from approvals.policy import approvals_in_force
    from tests.actions.test_reconciliation import authorized_refund

    first, second, other = (authorized_refund(agent_actor) for _ in range(3))
    old = Approval.objects.get(action=first)
    newer = Approval.objects.create(**{**_columns(old), "note": "decided again"})
    Approval.objects.create(**{**_columns(old), "decision": Decision.REJECT, "note": "a later reject"})

    in_force = approvals_in_force(action_pks=[first.pk, second.pk])

    assert {pk: a.pk for pk, a in in_force.items()} == {
        first.pk: newer.pk,
        second.pk: Approval.objects.get(action=second).pk,
    }
    assert other.pk not in in_force and approvals_in_force(action_pks=[]) == {}
    assert in_force[first.pk].note == "decided again" and in_force[first.pk].amount == old.amount


def _columns(approval: Any) -> dict[str, Any]:
    return {f.attname: getattr(approval, f.attname) for f in approval._meta.concrete_fields if not f.primary_key}


def test_an_agents_active_webhook_is_read_by_its_compiled_statement(agent_actor: Any) -> None:
    from actions.models import AgentWebhook
    from actions.outbox import _active_hook

    agent = agent_actor.agent
    assert _active_hook(agent.pk) is None
    hook = AgentWebhook.objects.create(agent=agent, url="https://hooks.example.test/a", secret="s" * 32)
    assert _active_hook(agent.pk) == hook
    AgentWebhook.objects.filter(pk=hook.pk).update(is_active=False)
    assert _active_hook(agent.pk) is None


def _events(action: Any, count: int, **extra: Any) -> list[Any]:
    from django.utils import timezone

    from actions.models import ActionEvent

    now = timezone.now()
    return [
        ActionEvent(
            action=action,
            transition=f"step_{index}",
            from_state="AUTHORIZED",
            to_state="SUBMITTING",
            actor_kind="system",
            actor_label=f"system:test-{index}",
            evidence={"index": index, "nested": [index, None]},
            created_at=now,
            **extra,
        )
        for index in range(count)
    ]


def test_a_compiled_insert_writes_each_new_row_and_gives_each_its_key_in_order(
    agent_actor: Any, dispatched: list[int]
) -> None:
    """What bulk_create does: every row written with its own values, each object given the key
    of its own row (read back in the objects' order), and marked as saved."""
    from actions.models import ActionEvent
    from tests.actions.test_reconciliation import authorized_refund

    action = authorized_refund(agent_actor)
    before = set(ActionEvent.objects.values_list("pk", flat=True))
    events = _events(action, 5)

    CompiledInsert(ActionEvent).insert(events)

    assert all(event.pk is not None and not event._state.adding for event in events)
    stored = {row.pk: row for row in ActionEvent.objects.exclude(pk__in=before)}
    assert sorted(stored) == sorted(event.pk for event in events)
    for event in events:
        row = stored[event.pk]
        assert (row.transition, row.actor_label, row.evidence, row.action_id, row.created_at) == (
            event.transition,
            event.actor_label,
            event.evidence,
            action.pk,
            event.created_at,
        )


@pytest.mark.postgres
def test_a_compiled_insert_is_one_statement_of_one_text_for_any_number_of_rows(
    agent_actor: Any, dispatched: list[int]
) -> None:
    from actions.models import ActionEvent
    from tests.actions.test_reconciliation import authorized_refund

    action = authorized_refund(agent_actor)
    statement = CompiledInsert(ActionEvent)

    with texts_sent() as sent:
        for count in (1, 2, 7):
            statement.insert(_events(action, count))

    assert len(sent) == 3
    assert len(set(sent)) == 1
    assert "UNNEST(" in sent[0] and "RETURNING" in sent[0]
    # The arrays go in PostgreSQL's binary format (console.settings binds on the server).
    assert sent[0].count("(%b)::") == len(statement.fields) and "%s" not in sent[0]


def test_a_compiled_insert_refuses_rows_that_are_not_new_rows_of_its_model(
    agent_actor: Any, dispatched: list[int]
) -> None:
    from actions.models import ActionEvent, Attempt
    from tests.actions.test_reconciliation import authorized_refund

    action = authorized_refund(agent_actor)
    statement = CompiledInsert(ActionEvent)
    saved = _events(action, 1)
    statement.insert(saved)
    count = ActionEvent.objects.count()

    for bad in (saved, _events(action, 1, pk=10**9), [Attempt(action=action, kind="submit")]):
        if connection.vendor != "postgresql":
            break  # elsewhere it is bulk_create, whose own checks apply
        with pytest.raises(ValueError, match="takes new rows without a key"):
            statement.insert([*_events(action, 1), *bad])

    assert ActionEvent.objects.count() == count
    statement.insert([])  # nothing to write: no statement, no error


def test_a_compiled_insert_that_fails_marks_the_atomic_block_for_rollback(
    agent_actor: Any, dispatched: list[int]
) -> None:
    """A row the table refuses (no transition: NOT NULL) fails the whole INSERT, and the caller's
    transaction cannot go on writing, as with bulk_create."""
    from actions.models import ActionEvent
    from tests.actions.test_reconciliation import authorized_refund

    action = authorized_refund(agent_actor)
    count = ActionEvent.objects.count()
    events = _events(action, 3)
    events[1].transition = None

    with transaction.atomic():
        with pytest.raises(IntegrityError):
            CompiledInsert(ActionEvent).insert(events)
        with pytest.raises(TransactionManagementError):
            ActionEvent.objects.count()

    assert ActionEvent.objects.count() == count


def test_a_compiled_insert_fills_what_the_model_fills_on_add_and_gives_the_rows_their_database() -> None:
    """``pre_save(obj, add=True)``, as ``save()`` and ``bulk_create`` call it: a moment the model
    stamps when a row is added (an order's ``created_at``) is set on the object and written; and
    each object then belongs to the database it was written to, as a saved one does."""
    paid = timezone.now() - timedelta(days=1)
    orders = [
        Order(number=f"CI-{n}", customer_name="Ada", currency="EUR", captured_amount=Decimal("10.00"), paid_at=paid)
        for n in range(2)
    ]
    assert all(order.created_at is None for order in orders)
    before = timezone.now()

    CompiledInsert(Order).insert(orders)

    for order in orders:
        assert order._state.db == "default"
        assert order.created_at is not None and order.created_at >= before
        assert Order.objects.get(pk=order.pk).created_at == order.created_at
