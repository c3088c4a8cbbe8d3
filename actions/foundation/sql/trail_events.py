"""The audit trail's statements in plain SQL (part of actions.foundation.sql, which names them
in its docstring): the head of each action's chain, read from the live trail and its archive;
the archive's move of closed actions' events; the pruning of archived events past retention; the
one snapshot in which a reader sees both tables."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from django.db import transaction

from actions.foundation.sql import connection_for, key_rows, statement_write
from actions.models import ActionEvent

# The archive (actions.engine.retention) moves a closed action's events to their own table; an
# event written later on that action (a follow-up's note) continues the chain from there. So the
# head is read from both tables: one probe of each unique index on (action, sequence), and the
# higher sequence wins.
_CHAIN_HEAD_OF = (
    'SELECT e."action_id", e."sequence", e."chain_hash" FROM "{table}" AS e'
    ' WHERE e."action_id" IN (SELECT v."id" FROM {{keys}}) AND e."sequence" = ('
    'SELECT MAX(m."sequence") FROM "{table}" AS m WHERE m."action_id" = e."action_id")'
)
EVENT_CHAIN_HEADS = (
    _CHAIN_HEAD_OF.format(table="actions_actionevent")
    + " UNION ALL "
    + _CHAIN_HEAD_OF.format(table="actions_archivedactionevent")
)


def event_chain_heads(*, action_pks: Sequence[int]) -> dict[int, tuple[int, str]]:
    """The last event of each of these actions' trails, live or archived: its sequence and
    chain hash, by the action's key (an action without events is missing). The caller holds the
    actions' row locks, so no other writer can add an event meanwhile, nor the archive move one."""
    if not action_pks:
        return {}
    connection = connection_for(ActionEvent)
    keys, params = key_rows(connection, action_pks)
    heads: dict[int, tuple[int, str]] = {}
    with connection.cursor() as cursor:
        cursor.execute(EVENT_CHAIN_HEADS.format(keys=keys), params + params)
        for pk, sequence, chain in cursor.fetchall():
            if int(pk) not in heads or int(sequence) > heads[int(pk)][0]:
                heads[int(pk)] = (int(sequence), str(chain))
    return heads


# A reader of whole trails reads the live table and the archive in more than one statement. At
# PostgreSQL's default isolation each statement sees the commits made before it began, so an
# archive batch committing between two of them shows its events twice (or not at all): a false
# "inserted" or "removed" to the trail's check, a signed checkpoint that counts wrong. REPEATABLE
# READ gives the whole transaction the snapshot of its first statement.
SNAPSHOT_FOR_TRAIL_READS = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"


@contextmanager
def trail_snapshot(*, durable: bool = False) -> Iterator[None]:
    """A transaction in which every read of the live trail and its archive sees one snapshot
    (``durable``: one that must be the outermost, as a checkpoint's).

    Inside a caller's transaction (a test's) the isolation is the caller's: PostgreSQL takes SET
    TRANSACTION only before a transaction's first statement. SQLite is one machine's database,
    whose writer already excludes the others; a reader opens no transaction there, which would
    take the write lock (console.settings begins them IMMEDIATE)."""
    connection = connection_for(ActionEvent)
    if connection.vendor != "postgresql":
        if durable:
            with transaction.atomic(using=connection.alias, durable=True):
                yield
        else:
            yield
        return
    owned = not connection.in_atomic_block
    with transaction.atomic(using=connection.alias, durable=durable):
        if owned:
            statement_write(connection, SNAPSHOT_FOR_TRAIL_READS, [])
        yield


# --- the archive of closed actions' events, and their pruning past retention ----------------------

# Every column of an audit event, in both tables (ArchivedActionEvent has ActionEvent's columns,
# its key and its txid included: tests/evidence/test_archive.py holds the two to that).
TRAIL_EVENT_COLUMNS = (
    "id",
    "action_id",
    "transition",
    "from_state",
    "to_state",
    "actor_kind",
    "actor_user_id",
    "actor_agent_id",
    "actor_label",
    "reason",
    "evidence",
    "created_at",
    "sequence",
    "content_hash",
    "chain_hash",
    "txid",
)
_TRAIL_EVENT_NAMES = ", ".join(f'"{name}"' for name in TRAIL_EVENT_COLUMNS)

# The append-only guards on SQLite: a trigger per table and statement that aborts it. The
# migrations install them (actions.foundation.db_guards); the archive's SQLite path drops the
# delete guard of one table and makes it again inside its transaction.
def sqlite_refusal_name(table: str, verb: str) -> str:
    # The live trail's guards were named before the archive existed: actionevent_no_delete.
    return f"{table.removeprefix('actions_').replace('archivedaction', 'archived')}_no_{verb.lower()}"


def sqlite_refusal(table: str, verb: str) -> str:
    return (
        f"CREATE TRIGGER IF NOT EXISTS {sqlite_refusal_name(table, verb)} BEFORE {verb} ON {table}\n"
        f"    BEGIN SELECT RAISE(ABORT, '{table} is append-only: {verb} refused'); END"
    )


# The switches the append-only trigger reads (actions.foundation.db_guards), for this
# transaction only.
ARCHIVING_ON = "SELECT set_config('console.archiving', 'on', true)"
PRUNING_ON = "SELECT set_config('console.pruning', 'on', true)"

EVENTS_ARCHIVE_COPY = (
    f'INSERT INTO "actions_archivedactionevent" ({_TRAIL_EVENT_NAMES})'  # noqa: S608 -- column names only
    f' SELECT {_TRAIL_EVENT_NAMES} FROM "actions_actionevent"'
    ' WHERE "action_id" IN (SELECT v."id" FROM {keys}) ORDER BY "id"'
)
EVENTS_ARCHIVE_DELETE = 'DELETE FROM "actions_actionevent" WHERE "action_id" IN (SELECT v."id" FROM {keys})'
ARCHIVED_EVENTS_DELETE = 'DELETE FROM "actions_archivedactionevent" WHERE "action_id" IN (SELECT v."id" FROM {keys})'


SQLITE_TRIGGER_EXISTS = "SELECT COUNT(*) FROM sqlite_master WHERE type = 'trigger' AND name = %s"


@contextmanager
def _delete_allowed(connection: Any, *, table: str, switch: str) -> Iterator[None]:
    """Let this transaction's DELETE of ``table`` past its append-only guard: on PostgreSQL the
    transaction-local switch the trigger reads; on SQLite the delete trigger is dropped and made
    again before the transaction ends (sqlite_refusal)."""
    if connection.vendor == "postgresql":
        statement_write(connection, switch, [])
        yield
        return
    name = sqlite_refusal_name(table, "DELETE")
    (found,), _ = statement_write(connection, SQLITE_TRIGGER_EXISTS, [name])
    statement_write(connection, f'DROP TRIGGER IF EXISTS "{name}"', [])
    yield
    if found[0]:  # left as found: the archive lifts a guard for its delete, it installs none
        statement_write(connection, sqlite_refusal(table, "DELETE"), [])


def events_archive(*, action_pks: Sequence[int]) -> tuple[int, int]:
    """Move every live event of these actions to the archive: INSERT ... SELECT, then DELETE.
    Must run inside a transaction that holds the actions' row locks. (copied, deleted): the
    caller compares them."""
    if not transaction.get_connection(using=connection_for(ActionEvent).alias).in_atomic_block:
        raise RuntimeError("the archive moves events inside its caller's transaction")
    connection = connection_for(ActionEvent)
    keys, params = key_rows(connection, action_pks)
    _, copied = statement_write(connection, EVENTS_ARCHIVE_COPY.format(keys=keys), params)
    with _delete_allowed(connection, table="actions_actionevent", switch=ARCHIVING_ON):
        _, deleted = statement_write(connection, EVENTS_ARCHIVE_DELETE.format(keys=keys), params)
    return int(copied), int(deleted)


def archived_events_delete(*, action_pks: Sequence[int]) -> int:
    """Delete the archived events of these actions. Must run inside the transaction that wrote
    their tombstone (the guard on PostgreSQL looks for it)."""
    connection = connection_for(ActionEvent)
    if not transaction.get_connection(using=connection.alias).in_atomic_block:
        raise RuntimeError("archived events are pruned inside the transaction that writes their tombstone")
    keys, params = key_rows(connection, action_pks)
    with _delete_allowed(connection, table="actions_archivedactionevent", switch=PRUNING_ON):
        _, deleted = statement_write(connection, ARCHIVED_EVENTS_DELETE.format(keys=keys), params)
    return int(deleted)
