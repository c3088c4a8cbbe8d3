"""Material fields never change after the proposal (invariant 4) and the audit trail is
append-only (invariant 9): refused by the models in Python, and on PostgreSQL by triggers that
hold for any client, raw SQL included."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from django.db import IntegrityError, connection, models, transaction
from django.db.models import ProtectedError

from actions.models import Action, ActionEvent
from actions.models.actions import AuditTrailIsAppendOnly, MaterialFieldChanged
from actions.services import Actor, ProposalResult, action_cancel
from tests.factories import make_adjustment_request, make_bill, make_order, make_request

Propose = Callable[..., ProposalResult]


def other_value(name: str, action: Action) -> Any:
    """A different, well-formed value for one material field of ``action``."""
    if name == "order":
        return make_order(number="5555")
    if name == "refund_request":
        assert action.order is not None
        return make_request(action.order, 2)
    if name == "bill":
        return make_bill()
    if name == "adjustment_request":
        return make_adjustment_request(make_bill())
    return {
        "action_id": "refund:order-4821:request-2",
        "kind": "adjustment",
        "idempotency_key": "refund:order-4821:request-2",
        "payload": {**action.payload, "amount": "99.00"},
        "payload_hash": "sha256:" + "0" * 64,
        "amount": Decimal("99.00"),
        "currency": "USD",
        "reason_code": "goodwill",
    }[name]


MATERIAL = [
    "action_id",
    "kind",
    "idempotency_key",
    "payload",
    "payload_hash",
    "order",
    "refund_request",
    "bill",
    "adjustment_request",
    "amount",
    "currency",
    "reason_code",
]


ATTNAMES = {
    "order": "order_id",
    "refund_request": "refund_request_id",
    "bill": "bill_id",
    "adjustment_request": "adjustment_request_id",
}


def test_the_test_covers_every_material_field() -> None:
    assert set(Action.MATERIAL_FIELDS) == {ATTNAMES.get(name, name) for name in MATERIAL}


# --- material fields, in Python ------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("name", MATERIAL)
def test_it_refuses_to_save_a_changed_material_field(propose: Propose, name: str) -> None:
    """Invariant 4: the action id, idempotency key and material payload never change."""
    action = Action.objects.get(pk=propose().action.pk)
    before = Action.objects.filter(pk=action.pk).values().get()
    setattr(action, name, other_value(name, action))

    with pytest.raises(MaterialFieldChanged, match=ATTNAMES.get(name, name)):
        action.save()

    assert Action.objects.filter(pk=action.pk).values().get() == before


@pytest.mark.django_db
def test_it_refuses_a_changed_amount_on_the_instance_the_service_returned(propose: Propose) -> None:
    """The guard also holds for an instance that was created, not loaded."""
    action = propose().action
    action.amount = Decimal("99.00")

    with pytest.raises(MaterialFieldChanged, match="amount"):
        action.save()

    assert Action.objects.get(pk=action.pk).amount == Decimal("40.00")


@pytest.mark.django_db
def test_it_refuses_to_save_a_payload_changed_in_place(propose: Propose) -> None:
    """Invariant 4: mutating the payload dict is a change of the material payload too."""
    action = Action.objects.get(pk=propose().action.pk)
    action.payload["amount"] = "99.00"

    with pytest.raises(MaterialFieldChanged, match="payload"):
        action.save()


@pytest.mark.django_db
def test_a_non_material_change_is_saved(propose: Propose, finance: Any) -> None:
    action = Action.objects.get(pk=propose().action.pk)
    action.owner = finance
    action.save()

    assert Action.objects.get(pk=action.pk).owner == finance


# --- material fields, on PostgreSQL --------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", MATERIAL)
def test_the_database_refuses_a_queryset_update_of_a_material_field(propose: Propose, name: str) -> None:
    """Invariant 4: a queryset update skips save(), so the trigger is what refuses it."""
    action = propose().action
    before = Action.objects.filter(pk=action.pk).values().get()
    new_value = other_value(name, action)

    with pytest.raises(IntegrityError, match="material fields of action refund:order-4821:request-1 cannot change"):
        Action.objects.filter(pk=action.pk).update(**{name: new_value})

    assert Action.objects.filter(pk=action.pk).values().get() == before


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE actions_action SET amount = amount + 1 WHERE id = %s",
        "UPDATE actions_action SET payload = jsonb_set(payload, '{amount}', '\"99.00\"') WHERE id = %s",
        "UPDATE actions_action SET idempotency_key = 'refund:order-4821:request-1-again' WHERE id = %s",
    ],
    ids=["amount", "payload", "idempotency_key"],
)
def test_the_database_refuses_raw_sql_that_changes_a_material_field(propose: Propose, sql: str) -> None:
    """Invariant 4: whatever client connects (a script, psql), the material fields hold."""
    action = propose().action
    before = Action.objects.filter(pk=action.pk).values().get()

    with pytest.raises(IntegrityError, match="cannot change"), connection.cursor() as cursor:
        cursor.execute(sql, [action.pk])

    assert Action.objects.filter(pk=action.pk).values().get() == before


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_database_still_accepts_non_material_changes(propose: Propose, finance: Any, manager: Any) -> None:
    """The trigger must not block the work around an action: assigning an owner, or a full
    save() of a transition that rewrites every column with unchanged material values."""
    action = propose().action

    assert Action.objects.filter(pk=action.pk).update(owner=finance) == 1
    with connection.cursor() as cursor:
        cursor.execute("UPDATE actions_action SET evidence = 'Re-read the ticket.' WHERE id = %s", [action.pk])
    cancelled = action_cancel(action_pk=action.pk, actor=Actor.for_user(manager), reason="Duplicate ticket.")

    saved = Action.objects.get(pk=action.pk)
    assert saved.owner == finance
    assert saved.evidence == "Re-read the ticket."
    assert cancelled.status == saved.status == "CANCELLED"
    assert saved.amount == Decimal("40.00")


# --- the audit trail, in Python -------------------------------------------------------------------


@pytest.fixture
def event(propose: Propose) -> ActionEvent:
    return ActionEvent.objects.get(action=propose().action)


def assert_unchanged(event: ActionEvent) -> None:
    stored = ActionEvent.objects.get(pk=event.pk)
    assert (stored.transition, stored.to_state, stored.reason) == ("propose", "PROPOSED", "Validation passed.")


@pytest.mark.django_db
def test_it_refuses_to_save_a_changed_audit_event(event: ActionEvent) -> None:
    """Invariant 9: the audit trail is append-only."""
    event.reason = "Nothing to see here."

    with pytest.raises(AuditTrailIsAppendOnly):
        event.save()

    assert_unchanged(event)


@pytest.mark.django_db
def test_it_refuses_to_delete_an_audit_event(event: ActionEvent) -> None:
    """Invariant 9: the audit trail is append-only."""
    with pytest.raises(AuditTrailIsAppendOnly):
        event.delete()

    assert_unchanged(event)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "change",
    [
        lambda e: ActionEvent.objects.filter(pk=e.pk).update(reason="rewritten"),
        lambda e: ActionEvent.objects.all().update(to_state="SUCCEEDED"),
        lambda e: ActionEvent.objects.filter(pk=e.pk).delete(),
        lambda e: ActionEvent.objects.all().delete(),
        lambda e: e.action.events.update(reason="rewritten"),
        lambda e: e.action.events.all().delete(),
        lambda e: ActionEvent.objects.bulk_update([ActionEvent(pk=e.pk, reason="rewritten")], ["reason"]),
    ],
    ids=[
        "filter-update",
        "all-update",
        "filter-delete",
        "all-delete",
        "related-update",
        "related-delete",
        "bulk-update",
    ],
)
def test_it_refuses_to_rewrite_the_audit_trail_in_bulk(
    event: ActionEvent, change: Callable[[ActionEvent], Any]
) -> None:
    """Invariant 9: the audit trail is append-only, for querysets too."""
    # The savepoint keeps the test's transaction usable: bulk_update runs inside an atomic
    # block without a savepoint, which marks the enclosing transaction as broken on error.
    with pytest.raises(AuditTrailIsAppendOnly), transaction.atomic():
        change(event)

    assert_unchanged(event)


@pytest.mark.django_db
def test_it_refuses_to_delete_an_action_that_has_an_audit_trail(event: ActionEvent) -> None:
    """Invariant 9: deleting the action would take its trail with it."""
    with pytest.raises(ProtectedError):
        event.action.delete()

    assert_unchanged(event)


@pytest.mark.django_db
def test_new_audit_events_can_still_be_appended(propose: Propose, manager: Any) -> None:
    action = propose().action

    action_cancel(action_pk=action.pk, actor=Actor.for_user(manager), reason="Duplicate ticket.")

    assert list(ActionEvent.objects.filter(action=action).values_list("transition", flat=True)) == ["propose", "cancel"]


# --- the audit trail, on PostgreSQL ----------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE actions_actionevent SET reason = 'rewritten' WHERE id = %s",
        "UPDATE actions_actionevent SET to_state = 'SUCCEEDED' WHERE id = %s",
        "DELETE FROM actions_actionevent WHERE id = %s",
    ],
    ids=["update-reason", "update-state", "delete"],
)
def test_the_database_refuses_raw_sql_that_rewrites_the_audit_trail(event: ActionEvent, sql: str) -> None:
    """Invariant 9: the audit trail is append-only for any client."""
    with pytest.raises(IntegrityError, match="append-only"), connection.cursor() as cursor:
        cursor.execute(sql, [event.pk])

    assert_unchanged(event)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_database_refuses_a_queryset_that_goes_around_the_python_guard(event: ActionEvent) -> None:
    """Invariant 9: code that calls Django's own QuerySet methods is refused by the trigger."""
    with pytest.raises(IntegrityError, match="append-only"):
        models.QuerySet.update(ActionEvent.objects.filter(pk=event.pk), reason="rewritten")
    with pytest.raises(IntegrityError, match="append-only"):
        ActionEvent.objects.filter(pk=event.pk)._raw_delete(connection.alias)

    assert_unchanged(event)
