"""Database-level guards for the intent log, installed by migrations on PostgreSQL and SQLite."""

from __future__ import annotations

from typing import Any

from django.db.models import Count

from actions.foundation.chain import EVENT_ROW_FIELDS, GENESIS, chain_link, content_hash, row_event_content
from actions.foundation.sql.trail_events import sqlite_refusal, sqlite_refusal_name

# The audit trail is append-only, and an action's material fields never change after the
# proposal. Python refuses both; on PostgreSQL these triggers refuse them for any client.
PG_GUARDS = """
CREATE OR REPLACE FUNCTION console_refuse_event_change() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'actions_actionevent is append-only: % refused', TG_OP
        USING ERRCODE = 'integrity_constraint_violation';
END;
$$ LANGUAGE plpgsql;

DROP TRIGGER IF EXISTS actionevent_append_only ON actions_actionevent;
CREATE TRIGGER actionevent_append_only
    BEFORE UPDATE OR DELETE ON actions_actionevent
    FOR EACH ROW EXECUTE FUNCTION console_refuse_event_change();

CREATE OR REPLACE FUNCTION console_refuse_material_change() RETURNS trigger AS $$
BEGIN
    IF NEW.action_id IS DISTINCT FROM OLD.action_id
       OR NEW.kind IS DISTINCT FROM OLD.kind
       OR NEW.idempotency_key IS DISTINCT FROM OLD.idempotency_key
       OR NEW.payload::text IS DISTINCT FROM OLD.payload::text
       OR NEW.payload_hash IS DISTINCT FROM OLD.payload_hash
       OR NEW.order_id IS DISTINCT FROM OLD.order_id
       OR NEW.refund_request_id IS DISTINCT FROM OLD.refund_request_id
       OR NEW.amount IS DISTINCT FROM OLD.amount
       OR NEW.currency IS DISTINCT FROM OLD.currency
       OR NEW.reason_code IS DISTINCT FROM OLD.reason_code THEN
        RAISE EXCEPTION 'material fields of action % cannot change', OLD.action_id
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

DROP TRIGGER IF EXISTS action_material_immutable ON actions_action;
CREATE TRIGGER action_material_immutable
    BEFORE UPDATE ON actions_action
    FOR EACH ROW EXECUTE FUNCTION console_refuse_material_change();
"""


def install_database_guards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(PG_GUARDS, params=None)


def remove_database_guards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(
        "DROP TRIGGER IF EXISTS actionevent_append_only ON actions_actionevent;"
        "DROP TRIGGER IF EXISTS action_material_immutable ON actions_action;"
    )


# The security trail (actions.SecurityEvent) is append-only like the audit trail.
PG_SECURITY_GUARDS = """
DROP TRIGGER IF EXISTS securityevent_append_only ON actions_securityevent;
CREATE TRIGGER securityevent_append_only
    BEFORE UPDATE OR DELETE ON actions_securityevent
    FOR EACH ROW EXECUTE FUNCTION console_refuse_event_change();
"""

# SQLite has no stored procedures, but its triggers can RAISE(ABORT): the same three guards,
# so that the embedded default refuses a rewrite from the sqlite3 shell as PostgreSQL does.
SQLITE_GUARDS = [
    """CREATE TRIGGER IF NOT EXISTS actionevent_no_update BEFORE UPDATE ON actions_actionevent
    BEGIN SELECT RAISE(ABORT, 'actions_actionevent is append-only: UPDATE refused'); END""",
    sqlite_refusal("actions_actionevent", "DELETE"),
    """CREATE TRIGGER IF NOT EXISTS securityevent_no_update BEFORE UPDATE ON actions_securityevent
    BEGIN SELECT RAISE(ABORT, 'actions_securityevent is append-only: UPDATE refused'); END""",
    """CREATE TRIGGER IF NOT EXISTS securityevent_no_delete BEFORE DELETE ON actions_securityevent
    BEGIN SELECT RAISE(ABORT, 'actions_securityevent is append-only: DELETE refused'); END""",
    """CREATE TRIGGER IF NOT EXISTS action_material_immutable BEFORE UPDATE ON actions_action
    WHEN NEW.action_id IS NOT OLD.action_id OR NEW.kind IS NOT OLD.kind
      OR NEW.idempotency_key IS NOT OLD.idempotency_key OR NEW.payload IS NOT OLD.payload
      OR NEW.payload_hash IS NOT OLD.payload_hash OR NEW.order_id IS NOT OLD.order_id
      OR NEW.refund_request_id IS NOT OLD.refund_request_id OR NEW.amount IS NOT OLD.amount
      OR NEW.currency IS NOT OLD.currency OR NEW.reason_code IS NOT OLD.reason_code
    BEGIN SELECT RAISE(ABORT, 'material fields of an action cannot change'); END""",
]
SQLITE_GUARD_NAMES = [
    "actionevent_no_update",
    "actionevent_no_delete",
    "securityevent_no_update",
    "securityevent_no_delete",
    "action_material_immutable",
]


def _guards_run(schema_editor: Any, *, postgresql: str, sqlite: list[str]) -> None:
    """Run the guards' statements for the database the migration runs on."""
    vendor = schema_editor.connection.vendor
    for statement in [postgresql] if vendor == "postgresql" else sqlite if vendor == "sqlite" else []:
        schema_editor.execute(statement, params=None)


def install_security_guards(apps: Any, schema_editor: Any) -> None:
    _guards_run(schema_editor, postgresql=PG_SECURITY_GUARDS, sqlite=SQLITE_GUARDS)


def remove_security_guards(apps: Any, schema_editor: Any) -> None:
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute("DROP TRIGGER IF EXISTS securityevent_append_only ON actions_securityevent;")
    elif vendor == "sqlite":
        for name in SQLITE_GUARD_NAMES:
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {name}", params=None)


def refuse_duplicate_charges(apps: Any, schema_editor: Any) -> None:
    """Stop the migration with the duplicates named, rather than with a bare IntegrityError:
    which order keeps the charge is a person's decision."""
    order_model = apps.get_model("actions", "Order")
    duplicates = list(
        order_model.objects.exclude(charge_reference="")
        .values("charge_reference")
        .annotate(n=Count("pk"))
        .filter(n__gt=1)
        .values_list("charge_reference", flat=True)[:20]
    )
    if duplicates:
        raise RuntimeError(
            "Orders share a charge reference, so each could be refunded in full: "
            + ", ".join(duplicates)
            + ". Clear the charge reference on the order that does not own the charge, then migrate again."
        )


# The workflow trail (actions.WorkflowEvent) is append-only like the action's (invariant 9).
PG_WORKFLOW_GUARDS = """
DROP TRIGGER IF EXISTS workflowevent_append_only ON actions_workflowevent;
CREATE TRIGGER workflowevent_append_only
    BEFORE UPDATE OR DELETE ON actions_workflowevent
    FOR EACH ROW EXECUTE FUNCTION console_refuse_event_change();
"""


def install_workflow_guards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_WORKFLOW_GUARDS, params=None)


def remove_workflow_guards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP TRIGGER IF EXISTS workflowevent_append_only ON actions_workflowevent;")


# The hash chain's backfill (actions migration 0022): the events written before the chain
# existed get their sequence and hashes once, by the database's owner, with the append-only
# guard lifted for that one migration. They then verify like every later event.
PG_EVENT_GUARD_OFF = "ALTER TABLE actions_actionevent DISABLE TRIGGER actionevent_append_only"
# Deferred foreign-key checks still pending would make the ALTER TABLE fail: run them first.
PG_EVENT_GUARD_ON = (
    "SET CONSTRAINTS ALL IMMEDIATE; ALTER TABLE actions_actionevent ENABLE TRIGGER actionevent_append_only"
)
SQLITE_EVENT_GUARD_OFF = "DROP TRIGGER IF EXISTS actionevent_no_update"


def backfill_trail_hashes(apps: Any, schema_editor: Any) -> None:
    """Give every existing event its place in its action's chain, in key order (the order the
    events were written in)."""
    event_model = apps.get_model("actions", "ActionEvent")
    vendor = schema_editor.connection.vendor
    if not event_model.objects.filter(chain_hash="").exists():
        return
    schema_editor.execute(PG_EVENT_GUARD_OFF if vendor == "postgresql" else SQLITE_EVENT_GUARD_OFF, params=None)
    heads: dict[int, tuple[int, str]] = {}
    rows = event_model.objects.order_by("id").values("id", "action_id", *EVENT_ROW_FIELDS)
    for row in rows.iterator(chunk_size=2000):
        sequence, previous = heads.get(row["action_id"], (0, GENESIS))
        sequence += 1
        digest = content_hash(row_event_content(row, sequence=sequence))
        chained = chain_link(previous, digest)
        event_model.objects.filter(pk=row["id"]).update(sequence=sequence, content_hash=digest, chain_hash=chained)
        heads[row["action_id"]] = (sequence, chained)
    schema_editor.execute(PG_EVENT_GUARD_ON if vendor == "postgresql" else SQLITE_GUARDS[0], params=None)


# The archive and the retention of the audit trail (actions.engine.retention). The trigger
# function above refuses every UPDATE and DELETE of an event; two deletes are let through, each
# only on an explicit, transaction-local switch that only the archive's statements set
# (actions.foundation.sql), and only with the evidence of the move in the same transaction:
#
# - a live event, while ``console.archiving`` is on, and only once its identical copy (same key,
#   same hashes) is in the archive: the archive moves closed actions' events, it never drops one;
# - an archived event, while ``console.pruning`` is on, and only when the range of keys of a
#   tombstone of pruned audit events, written by this same transaction, covers it: past the
#   trail's retention an event may go, never without a signed statement of what went
#   (actions.foundation.tombstones). An older tombstone's range may cover events of actions
#   that were kept (keys interleave between actions), so it lets nothing go.
#
# Why a setting and not a second role or a disabled trigger: ``SET LOCAL`` ends with its
# transaction, so a forgotten reset cannot leave the trail open; the switch is named in the one
# function that moves rows, which a reader finds by grepping for it; and a stray DELETE (a
# mistaken query, an ORM call, a psql session) still fails. It is not a barrier against the
# database's owner, who can drop any trigger: the hash chain and the signed checkpoints catch that.
PG_ARCHIVE_GUARDS = """
CREATE OR REPLACE FUNCTION console_refuse_event_change() RETURNS trigger AS $$
BEGIN
    -- Nested, so that a row's columns are read only for the table that has them.
    IF TG_OP = 'DELETE' AND TG_TABLE_NAME = 'actions_actionevent' THEN
        IF current_setting('console.archiving', true) = 'on' AND EXISTS (
            SELECT 1 FROM actions_archivedactionevent AS a
            WHERE a.id = OLD.id AND a.chain_hash = OLD.chain_hash AND a.content_hash = OLD.content_hash
        ) THEN
            RETURN OLD;
        END IF;
    ELSIF TG_OP = 'DELETE' AND TG_TABLE_NAME = 'actions_archivedactionevent' THEN
        IF current_setting('console.pruning', true) = 'on' AND EXISTS (
            SELECT 1 FROM actions_retentiontombstone AS t
            WHERE t.record_type = 'audit events' AND OLD.id BETWEEN t.first_id AND t.last_id
                AND t.txid = pg_current_xact_id()::text::bigint
        ) THEN
            RETURN OLD;
        END IF;
    END IF;
    RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'integrity_constraint_violation';
END;
$$ LANGUAGE plpgsql;

"""
# The archive is append-only as the trail is, and so are the tombstones (nothing ever lets one go).
ARCHIVE_TABLES = ("actions_archivedactionevent", "actions_retentiontombstone")


def _pg_append_only(table: str) -> str:
    return (
        f"DROP TRIGGER IF EXISTS {table}_append_only ON {table};"
        f" CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table}"
        " FOR EACH ROW EXECUTE FUNCTION console_refuse_event_change();"
    )


# SQLite has no session settings a trigger could read (and a trigger may not read a temporary
# table): there the archive's transaction drops the delete guard and creates it again before it
# commits (SQLite's DDL is transactional, and one writer holds the database meanwhile).
SQLITE_ARCHIVE_GUARDS = [sqlite_refusal(table, verb) for table in ARCHIVE_TABLES for verb in ("UPDATE", "DELETE")]


def install_archive_guards(apps: Any, schema_editor: Any) -> None:
    tables = "".join(map(_pg_append_only, ARCHIVE_TABLES))
    _guards_run(schema_editor, postgresql=PG_ARCHIVE_GUARDS + tables, sqlite=SQLITE_ARCHIVE_GUARDS)


def remove_archive_guards(apps: Any, schema_editor: Any) -> None:
    drops = "".join(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table};" for table in ARCHIVE_TABLES)
    # The trigger function as it was before the archive.
    before = PG_GUARDS.split("DROP TRIGGER IF EXISTS actionevent_append_only")[0]
    names = [sqlite_refusal_name(table, verb) for table in ARCHIVE_TABLES for verb in ("UPDATE", "DELETE")]
    _guards_run(schema_editor, postgresql=drops + before, sqlite=[f"DROP TRIGGER IF EXISTS {name}" for name in names])
