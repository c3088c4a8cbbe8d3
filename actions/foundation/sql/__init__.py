"""Plain SQL for the dispatch path: the few statements a claim and a record send for every action.

Django builds and compiles a statement at every call: 0.2 to 0.5 ms of CPU for an UPDATE or
an INSERT of a few rows, about 1 ms for a locked read of a batch of actions. On the dispatch
path that costs more than PostgreSQL spends running the statement, once or twice per action.
So the statements below are written out, each under its name, and sent through Django's
cursor as they are. Everything else goes through the ORM.

The statements, each run by the function of the same name in lower case:

- ``CLAIMABLE_ACTIONS``: the oldest AUTHORIZED actions that no other transaction holds, locked
  (SKIP LOCKED), each with its agent's active webhook, loaded as model instances.
- ``APPROVE_ROWS``: the APPROVE rows of the given actions, oldest first: the last one of an
  action is the approval in force.
- ``ACTIONS_LOCK_FOR_RECORD``: a group of records locks its actions and reads each one's status
  and lease token, and its agent's active webhook, in one statement.
- ``ACTIVE_WEBHOOK``: the key of an agent's active webhook, if it has one.
- ``ACTIONS_CLAIM``: the claims of N actions in one UPDATE, each row set to its own values
  (lease, attempt count, times), and only where the row is still AUTHORIZED: a compare-and-set.
  The caller compares the row count with N.
- ``ACTIONS_RECORD``: the records of N actions in one UPDATE, each row set to its own values,
  and only where the row is still SUBMITTING under the lease token its record holds: the lease
  fence, a compare-and-set. A stale token changes no row. ``ACTIONS_RECORD_ESCALATION`` is the
  same for a record that hands its action to a person: the owner and the due date too.
- In ``trail_events``, beside this module: ``EVENT_CHAIN_HEADS``, the last event of each of N
  actions' trails, live or archived (its sequence and chain hash), which the next event's chain
  hash follows (actions.foundation.chain).
- ``EVENTS_ARCHIVE_COPY`` and ``EVENTS_ARCHIVE_DELETE``: the archive's move of closed actions'
  events, one INSERT ... SELECT and one DELETE in the caller's transaction, the delete let past
  the append-only trigger by ``ARCHIVING_ON`` only; ``ARCHIVED_EVENTS_DELETE`` prunes archived
  events past retention, let through by ``PRUNING_ON`` and their tombstone
  (actions.foundation.db_guards says why).
- ``EVENTS_INSERT`` and ``ATTEMPTS_INSERT``: N audit events, or N attempts, in one INSERT that
  returns their keys in the order given (as Django's ``bulk_create`` reads them).
- ``ATTEMPT_ANSWERS``: what the receiver said, written on N attempts in one UPDATE.
- ``TRANSACTIONS_ENDED_BELOW``: the lowest transaction id still running (PostgreSQL only), below
  which the audit trail's events are final: where a checkpoint's period ends.
- ``ORDER_RESERVE``, ``ORDER_BOOK`` and ``ORDER_RELEASE``: a refund's money on its order. The
  reservation is a compare-and-set too: only at the approved version, and only while the
  refundable balance covers the amount.
- ``database_now``: the database server's clock (the dialect's ``now``). Every host asks the
  same clock where a decision must not depend on which host makes it (the periodic tasks'
  periods, actions.foundation.schedule).

Values are prepared as the model's field prepares them for a save (``get_db_prep_save``: a
JSON column's value, an aware datetime on SQLite, a UUID on SQLite), so a row written here
reads back through the ORM exactly as if the ORM had written it.

Where SQLite and PostgreSQL differ, the statements differ in one place, ``_Dialect``:

- rows given as values (for an UPDATE or an INSERT of N rows, or a list of keys): PostgreSQL
  takes one array per column, ``unnest(%s::bigint[], %s::text[], ...) AS v(id, ...)``, one text
  for any number of rows; SQLite has no arrays and takes ``VALUES (...), (...)``. Where Django
  binds parameters on the server (``server_side_binding``), the arrays go in PostgreSQL's binary
  format (psycopg's ``%b``): psycopg dumps a list of 16 JSON values in a third of the CPU it
  takes as text, which quotes and escapes each one;
- row locks: ``FOR UPDATE`` (``SKIP LOCKED``) on PostgreSQL. SQLite has no such clause: a write
  transaction (``IMMEDIATE`` in console.settings) holds the whole database.

tests/actions/test_sql.py checks each statement on the database the suite runs on, and runs
itself once more on SQLite when that is PostgreSQL.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from django.db import NotSupportedError, connections, router, transaction
from django.db.models import Field, Model

from actions.models import Action, ActionEvent, AgentWebhook, Attempt, Order
from actions.models.actions import MaterialFieldChanged
from approvals.models import Approval, Decision

# --- where SQLite and PostgreSQL differ ----------------------------------------------------------


@dataclass(frozen=True)
class Column:
    """A column of rows given as values: its name and, for PostgreSQL's arrays, its type."""

    name: str
    type: str


class _Dialect:
    """What differs between the two databases the console runs on (see the module's docstring)."""

    lock = ""  # after a SELECT that locks its rows
    lock_skip_locked = ""
    now = ""  # the server clock's time, read by database_now

    def rows(self, connection: Any, columns: Sequence[Column], rows: Sequence[Sequence[Any]]) -> tuple[str, list[Any]]:
        """``rows`` (each a tuple of prepared values in the order of ``columns``) as a FROM item
        named ``v`` with one column per ``columns``, and its parameters."""
        raise NotImplementedError


class _PostgreSQL(_Dialect):
    lock = " FOR UPDATE"
    lock_skip_locked = " FOR UPDATE SKIP LOCKED"
    # The time of this statement, not of the transaction's start (now()).
    now = "SELECT statement_timestamp()"

    def rows(self, connection: Any, columns: Sequence[Column], rows: Sequence[Sequence[Any]]) -> tuple[str, list[Any]]:
        binary = connection.settings_dict["OPTIONS"].get("server_side_binding") is True
        placeholder = "%b" if binary else "%s"
        arrays = ", ".join(f"{placeholder}::{column.type}[]" for column in columns)
        names = ", ".join(f'"{column.name}"' for column in columns)
        return f"unnest({arrays}) AS v({names})", [list(values) for values in zip(*rows, strict=True)]


class _SQLite(_Dialect):
    # A text in UTC with milliseconds; database_now makes it an aware datetime.
    now = "SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')"

    def rows(self, connection: Any, columns: Sequence[Column], rows: Sequence[Sequence[Any]]) -> tuple[str, list[Any]]:
        row = "(" + ", ".join(["%s"] * len(columns)) + ")"
        names = ", ".join(f'column{position} AS "{column.name}"' for position, column in enumerate(columns, 1))
        params = [value for values in rows for value in values]
        values = ", ".join([row] * len(rows))
        return f"(SELECT {names} FROM (VALUES {values})) AS v", params  # noqa: S608 -- placeholders only


_DIALECTS: dict[str, _Dialect] = {"postgresql": _PostgreSQL(), "sqlite": _SQLite()}


def _dialect(connection: Any) -> _Dialect:
    try:
        return _DIALECTS[connection.vendor]
    except KeyError:
        raise NotSupportedError(
            f"the console's statements run on PostgreSQL and SQLite, not {connection.vendor}"
        ) from None


def connection_for(model: type[Model], *, write: bool = True) -> Any:
    return connections[router.db_for_write(model) if write else router.db_for_read(model)]


@functools.cache
def _fields(model: type[Model]) -> dict[str, Field]:
    """The model's columns by name, with the field that prepares each one's values."""
    return {str(field.column): field for field in model._meta.concrete_fields}


def _prepared(connection: Any, model: type[Model], columns: Sequence[Column], obj: Model) -> tuple[Any, ...]:
    fields = _fields(model)
    return tuple(
        fields[column.name].get_db_prep_save(getattr(obj, fields[column.name].attname), connection)
        for column in columns
    )


def statement_write(connection: Any, sql: str, params: Sequence[Any]) -> Any:
    """Run one writing statement and return its cursor's rows (or an empty list) and row count.

    As ``QuerySet.update``: an error inside an atomic block marks it for rollback, even when the
    caller catches it."""
    with transaction.mark_for_rollback_on_error(using=connection.alias), connection.cursor() as cursor:
        cursor.execute(sql, params)
        fetched = cursor.fetchall() if cursor.description else []
        return fetched, cursor.rowcount


_KEYS = (Column("id", "bigint"),)


def key_rows(connection: Any, keys: Iterable[int]) -> tuple[str, list[Any]]:
    return _dialect(connection).rows(connection, _KEYS, [(key,) for key in keys])


# --- reads ----------------------------------------------------------------------------------------


# The agent's active webhook, as a column of a read of actions (NULL for none): a batch that
# reads its actions anyway learns its agents' webhooks without a statement of its own. An agent
# has at most one webhook (one-to-one); the ORDER BY only makes "the first" definite.
_ACTIVE_WEBHOOK_OF_ACTION = (
    '(SELECT w."id" FROM "actions_agentwebhook" AS w'
    ' WHERE w."agent_id" = "actions_action"."proposed_by_agent_id" AND w."is_active" ORDER BY w."id" LIMIT 1)'
)

CLAIMABLE_ACTIONS = (
    'SELECT "actions_action".*, '  # noqa: S608 -- fixed text: the values are parameters
    + _ACTIVE_WEBHOOK_OF_ACTION
    + ' AS "agent_webhook_pk"'
    ' FROM "actions_action"'
    ' WHERE "actions_action"."status" = \'AUTHORIZED\'{before}{among}'
    ' ORDER BY "actions_action"."status_changed_at", "actions_action"."id"'
    " LIMIT %s{lock}"
)


def claimable_actions(
    *, limit: int, authorized_before: datetime | None = None, action_pks: Sequence[int] | None = None
) -> list[Action]:
    """Up to ``limit`` AUTHORIZED actions, the oldest authorization first, locked with SKIP LOCKED
    (rows another transaction holds are passed over, never waited for), each loaded as the ORM
    loads it and with ``agent_webhook_pk``, its agent's active webhook's key or None.

    ``authorized_before``: only those authorized before then. ``action_pks``: only these."""
    connection = connection_for(Action)
    dialect = _dialect(connection)
    params: list[Any] = []
    before = among = ""
    if authorized_before is not None:
        before = ' AND "actions_action"."status_changed_at" < %s'
        params.append(authorized_before)
    if action_pks is not None:
        keys, key_params = key_rows(connection, action_pks)
        among = f' AND "actions_action"."id" IN (SELECT v."id" FROM {keys})'  # noqa: S608 -- placeholders only
        params += key_params
    params.append(limit)
    sql = CLAIMABLE_ACTIONS.format(before=before, among=among, lock=dialect.lock_skip_locked)
    return list(Action.objects.raw(sql, tuple(params)))


APPROVE_ROWS = (
    'SELECT * FROM "approvals_approval" WHERE "decision" = %s'
    ' AND "action_id" IN (SELECT v."id" FROM {keys}) ORDER BY "id"'
)


def approve_rows(*, action_pks: Sequence[int]) -> list[Approval]:
    """The APPROVE rows of these actions, in the order they were inserted (by key)."""
    if not action_pks:
        return []
    connection = connection_for(Approval, write=False)
    keys, params = key_rows(connection, action_pks)
    return list(Approval.objects.raw(APPROVE_ROWS.format(keys=keys), (Decision.APPROVE.value, *params)))


ACTIONS_LOCK_FOR_RECORD = (
    'SELECT "actions_action"."id", "actions_action"."status", "actions_action"."lease_token",'  # noqa: S608 -- fixed text: the values are parameters
    ' "actions_action"."proposed_by_agent_id", ' + _ACTIVE_WEBHOOK_OF_ACTION + ' FROM "actions_action"'
    ' WHERE "actions_action"."id" IN (SELECT v."id" FROM {keys}) ORDER BY "actions_action"."id"{lock}'
)


@dataclass(frozen=True)
class LockedForRecord:
    """An action as a group of records finds it under its lock."""

    status: str
    lease_token: uuid.UUID | None
    agent_id: int | None
    agent_webhook_pk: int | None


def actions_lock_for_record(*, action_pks: Sequence[int]) -> dict[int, LockedForRecord]:
    """Lock these actions (FOR UPDATE, in the order of their keys) and read each one's status,
    lease token, agent and its agent's active webhook."""
    connection = connection_for(Action)
    keys, params = key_rows(connection, action_pks)
    token_field = Action._meta.get_field("lease_token")
    with connection.cursor() as cursor:
        cursor.execute(ACTIONS_LOCK_FOR_RECORD.format(keys=keys, lock=_dialect(connection).lock), params)
        rows = cursor.fetchall()
    return {
        # SQLite gives the token as the 32 hex digits Django stores there; the field reads both.
        pk: LockedForRecord(status, token_field.to_python(token), agent_id, hook_pk)
        for pk, status, token, agent_id, hook_pk in rows
    }


ACTIVE_WEBHOOK = 'SELECT "id" FROM "actions_agentwebhook" WHERE "agent_id" = %s AND "is_active" ORDER BY "id" LIMIT 1'


def active_webhook(*, agent_id: int) -> int | None:
    """The key of the agent's active webhook, or None."""
    connection = connection_for(AgentWebhook, write=False)
    with connection.cursor() as cursor:
        cursor.execute(ACTIVE_WEBHOOK, [agent_id])
        row = cursor.fetchone()
    return None if row is None else int(row[0])


# --- the transitions of claims and records ---------------------------------------------------------

# What every transition of the dispatch path writes: the row's id, its status and when it
# changed, and the lease.
_TRANSITION_COLUMNS = (
    Column("id", "bigint"),
    Column("status", "text"),
    Column("status_changed_at", "timestamptz"),
    Column("updated_at", "timestamptz"),
    Column("lease_token", "uuid"),
    Column("lease_expires_at", "timestamptz"),
)

_CLAIM_COLUMNS = (
    *_TRANSITION_COLUMNS,
    Column("attempt_count", "integer"),
    Column("first_attempt_at", "timestamptz"),
    Column("last_attempt_at", "timestamptz"),
)

ACTIONS_CLAIM = (
    'UPDATE "actions_action" AS a SET "status" = v."status", "status_changed_at" = v."status_changed_at",'
    ' "updated_at" = v."updated_at", "lease_token" = v."lease_token", "lease_expires_at" = v."lease_expires_at",'
    ' "attempt_count" = v."attempt_count", "first_attempt_at" = v."first_attempt_at",'
    ' "last_attempt_at" = v."last_attempt_at"'
    ' FROM {rows} WHERE a."id" = v."id" AND a."status" = \'AUTHORIZED\''
)


def actions_claim(actions: Sequence[Action]) -> int:
    """Write the claims of these actions (AUTHORIZED -> SUBMITTING, run in memory by the claim's
    transition) in one UPDATE, each row only while it is still AUTHORIZED. Returns the number of
    rows written: fewer than the actions means another writer moved one first."""
    return _transitions_write(actions, _CLAIM_COLUMNS, ACTIONS_CLAIM, fences=None)


_RECORD_COLUMNS = (
    *_TRANSITION_COLUMNS,
    Column("provider_reference", "text"),
    Column("next_reconcile_at", "timestamptz"),
)
_ESCALATION_COLUMNS = (*_RECORD_COLUMNS, Column("owner_id", "integer"), Column("due_at", "timestamptz"))
_FENCE = Column("fence", "uuid")

ACTIONS_RECORD = (
    'UPDATE "actions_action" AS a SET "status" = v."status", "status_changed_at" = v."status_changed_at",'
    ' "updated_at" = v."updated_at", "lease_token" = v."lease_token", "lease_expires_at" = v."lease_expires_at",'
    ' "provider_reference" = v."provider_reference", "next_reconcile_at" = v."next_reconcile_at"'
    ' FROM {rows} WHERE a."id" = v."id" AND a."status" = \'SUBMITTING\' AND a."lease_token" = v."fence"'
)
ACTIONS_RECORD_ESCALATION = (
    'UPDATE "actions_action" AS a SET "status" = v."status", "status_changed_at" = v."status_changed_at",'
    ' "updated_at" = v."updated_at", "lease_token" = v."lease_token", "lease_expires_at" = v."lease_expires_at",'
    ' "provider_reference" = v."provider_reference", "next_reconcile_at" = v."next_reconcile_at",'
    ' "owner_id" = v."owner_id", "due_at" = v."due_at"'
    ' FROM {rows} WHERE a."id" = v."id" AND a."status" = \'SUBMITTING\' AND a."lease_token" = v."fence"'
)


def actions_record(records: Sequence[tuple[Action, uuid.UUID | None]]) -> int:
    """Write the records of these actions (each moved from SUBMITTING by its record's transitions,
    run in memory) with their lease fences: each row only while it is still SUBMITTING under the
    token given with it. One UPDATE, or two when some records hand their actions to a person
    (their owner and due date are written too; a record that does not hand its action over
    leaves the owner alone, as finance may have set it meanwhile). Returns the number of rows
    written: fewer than the records means a lease was lost."""
    plain: list[tuple[Action, uuid.UUID | None]] = []
    escalated: list[tuple[Action, uuid.UUID | None]] = []
    record_names = _names(_RECORD_COLUMNS)
    for action, token in records:
        (plain if set(_changed(action)) <= record_names else escalated).append((action, token))
    written = 0
    if plain:
        written += _transitions_write(
            [a for a, _ in plain], _RECORD_COLUMNS, ACTIONS_RECORD, fences=[t for _, t in plain]
        )
    if escalated:
        written += _transitions_write(
            [a for a, _ in escalated], _ESCALATION_COLUMNS, ACTIONS_RECORD_ESCALATION, fences=[t for _, t in escalated]
        )
    return written


def _names(columns: Sequence[Column]) -> set[str]:
    """The field names of these columns of actions (``owner`` for ``owner_id``)."""
    fields = _fields(Action)
    return {fields[column.name].name for column in columns if column.name != "id"}


def _changed(action: Action) -> list[str]:
    changed = action.changed_fields()
    if changed is None:
        raise ValueError(f"{action.action_id}: an action not loaded from the database has no known changes")
    return changed


def _transitions_write(
    actions: Sequence[Action], columns: Sequence[Column], statement: str, *, fences: Sequence[Any] | None
) -> int:
    if not actions:
        return 0
    connection = connection_for(Action)
    written = _names(columns)
    for action in actions:
        changed = set(_changed(action))
        material = sorted(changed & set(Action.MATERIAL_FIELDS))
        if material:
            raise MaterialFieldChanged(
                f"{action.action_id}: material fields cannot change after the proposal: {', '.join(material)}"
            )
        if not changed <= written:
            raise ValueError(f"{action.action_id}: this statement does not write {sorted(changed - written)}")
    rows = [_prepared(connection, Action, columns, action) for action in actions]
    row_columns = list(columns)
    if fences is not None:
        token_field = Action._meta.get_field("lease_token")
        row_columns.append(_FENCE)
        rows = [
            (*row, token_field.get_db_prep_save(fence, connection)) for row, fence in zip(rows, fences, strict=True)
        ]
    source, params = _dialect(connection).rows(connection, row_columns, rows)
    _, count = statement_write(connection, statement.format(rows=source), params)
    if count == len(actions):
        for action in actions:
            action.saved_elsewhere(written)
    return int(count)


# --- new rows: events and attempts ----------------------------------------------------------------

_EVENT_COLUMNS = (
    Column("action_id", "bigint"),
    Column("transition", "text"),
    Column("from_state", "text"),
    Column("to_state", "text"),
    Column("actor_kind", "text"),
    Column("actor_user_id", "integer"),
    Column("actor_agent_id", "bigint"),
    Column("actor_label", "text"),
    Column("reason", "text"),
    Column("evidence", "jsonb"),
    Column("created_at", "timestamptz"),
    Column("sequence", "integer"),
    Column("content_hash", "text"),
    Column("chain_hash", "text"),
)

# ``txid`` is left to its column default (the inserting transaction's id on PostgreSQL).
EVENTS_INSERT = (
    'INSERT INTO "actions_actionevent" ("action_id", "transition", "from_state", "to_state", "actor_kind",'
    ' "actor_user_id", "actor_agent_id", "actor_label", "reason", "evidence", "created_at",'
    ' "sequence", "content_hash", "chain_hash")'
    ' SELECT * FROM {rows} RETURNING "id"'
)

_ATTEMPT_COLUMNS = (
    Column("action_id", "bigint"),
    Column("kind", "text"),
    Column("lease_token", "uuid"),
    Column("idempotency_key", "text"),
    Column("request", "jsonb"),
    Column("response", "jsonb"),
    Column("error", "jsonb"),
    Column("outcome", "text"),
    Column("held_lease", "boolean"),
    Column("started_at", "timestamptz"),
    Column("finished_at", "timestamptz"),
)

ATTEMPTS_INSERT = (
    'INSERT INTO "actions_attempt" ("action_id", "kind", "lease_token", "idempotency_key", "request", "response",'
    ' "error", "outcome", "held_lease", "started_at", "finished_at")'
    ' SELECT * FROM {rows} RETURNING "id"'
)


def events_insert(events: Sequence[ActionEvent]) -> None:
    """Insert these new audit events in one statement and give each its key."""
    _insert(ActionEvent, events, _EVENT_COLUMNS, EVENTS_INSERT)


def attempts_insert(attempts: Sequence[Attempt]) -> None:
    """Insert these new attempts in one statement and give each its key."""
    _insert(Attempt, attempts, _ATTEMPT_COLUMNS, ATTEMPTS_INSERT)


def _insert(model: type[Model], objects: Sequence[Model], columns: Sequence[Column], statement: str) -> None:
    if not objects:
        return
    connection = connection_for(model)
    for obj in objects:
        if type(obj) is not model or obj.pk is not None or not obj._state.adding:
            raise ValueError(f"{model.__name__}: only new rows without a key are inserted here")
    rows = [_prepared(connection, model, columns, obj) for obj in objects]
    source, params = _dialect(connection).rows(connection, columns, rows)
    keys, _ = statement_write(connection, statement.format(rows=source), params)
    # In the order of the rows given, as bulk_create reads them on both databases.
    for obj, (key,) in zip(objects, keys, strict=True):
        obj.pk = key
        obj._state.adding = False
        obj._state.db = connection.alias


_ANSWER_COLUMNS = (
    Column("id", "bigint"),
    Column("response", "jsonb"),
    Column("error", "jsonb"),
    Column("outcome", "text"),
    Column("held_lease", "boolean"),
    Column("finished_at", "timestamptz"),
)

ATTEMPT_ANSWERS = (
    'UPDATE "actions_attempt" AS t SET "response" = v."response", "error" = v."error", "outcome" = v."outcome",'
    ' "held_lease" = v."held_lease", "finished_at" = v."finished_at" FROM {rows} WHERE t."id" = v."id"'
)

# What ``attempt_answers`` writes on an attempt.
ATTEMPT_ANSWER_FIELDS = ("response", "error", "outcome", "held_lease", "finished_at")


def attempt_answers(answers: Sequence[Attempt]) -> int:
    """Write what the receiver said on these attempts (each carries its attempt's key and the
    ATTEMPT_ANSWER_FIELDS) in one statement. Returns the number of attempts written."""
    if not answers:
        return 0
    connection = connection_for(Attempt)
    rows = [_prepared(connection, Attempt, _ANSWER_COLUMNS, answer) for answer in answers]
    source, params = _dialect(connection).rows(connection, _ANSWER_COLUMNS, rows)
    _, count = statement_write(connection, ATTEMPT_ANSWERS.format(rows=source), params)
    return int(count)


# --- a refund's money on its order ---------------------------------------------------------------

ORDER_RESERVE = (
    'UPDATE "actions_order" SET "reserved_amount" = "actions_order"."reserved_amount" + %s,'
    ' "version" = "actions_order"."version" + 1'
    ' WHERE "actions_order"."id" = %s AND "actions_order"."version" = %s'
    ' AND "actions_order"."captured_amount" >= "actions_order"."refunded_amount" + "actions_order"."reserved_amount"'
    ' + "actions_order"."outside_refunded_amount" + %s'
)
ORDER_BOOK = (
    'UPDATE "actions_order" SET "reserved_amount" = "actions_order"."reserved_amount" - %s,'
    ' "refunded_amount" = "actions_order"."refunded_amount" + %s WHERE "actions_order"."id" = %s'
)
ORDER_RELEASE = (
    'UPDATE "actions_order" SET "reserved_amount" = "actions_order"."reserved_amount" - %s'
    ' WHERE "actions_order"."id" = %s'
)


def order_reserve(*, order_pk: int, version: int, amount: Decimal) -> bool:
    """Reserve ``amount`` on the order and move it one version on, only if it is still at
    ``version`` and its refundable balance covers the amount. Whether it did."""
    money = _money(amount)
    _, count = statement_write(connection_for(Order), ORDER_RESERVE, [money, order_pk, version, money])
    return bool(count)


def order_book(*, order_pk: int, amount: Decimal) -> int:
    """The reserved ``amount`` becomes refunded money."""
    money = _money(amount)
    _, count = statement_write(connection_for(Order), ORDER_BOOK, [money, money, order_pk])
    return int(count)


def order_release(*, order_pk: int, amount: Decimal) -> int:
    """The reserved ``amount`` is released."""
    _, count = statement_write(connection_for(Order), ORDER_RELEASE, [_money(amount), order_pk])
    return int(count)


def _money(amount: Decimal) -> Any:
    return Order._meta.get_field("reserved_amount").get_db_prep_save(amount, connection_for(Order))


# --- the server's clock, and the audit trail's checkpoints ---------------------------------------


def database_now() -> datetime:
    """The database server's clock, as an aware datetime in UTC (SQLite's is a naive text)."""
    connection = connection_for(Action, write=False)
    with connection.cursor() as cursor:
        cursor.execute(_dialect(connection).now)
        (value,) = cursor.fetchone()
    value = datetime.fromisoformat(value) if isinstance(value, str) else value
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC)


TRANSACTIONS_ENDED_BELOW = "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint"


def transactions_ended_below() -> int | None:
    """The lowest transaction id still running on PostgreSQL: every lower one has ended, so the
    events it wrote are final (actions.evidence.checkpoints covers those). None on SQLite."""
    connection = connection_for(ActionEvent, write=False)
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute(TRANSACTIONS_ENDED_BELOW)
        return int(cursor.fetchone()[0])
