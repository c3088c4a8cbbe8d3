"""Database-level guards for the intent log, installed by a migration on PostgreSQL."""

from __future__ import annotations

from typing import Any

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
