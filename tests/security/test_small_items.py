"""Finding 12: SQLite gets the append-only triggers and a private file; seed_demo stays out of
production."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError

from actions.foundation.db_guards import SQLITE_GUARDS
from console.settings import create_private_file

MATERIAL = (
    "action_id",
    "kind",
    "idempotency_key",
    "payload",
    "payload_hash",
    "order_id",
    "refund_request_id",
    "amount",
    "currency",
    "reason_code",
)


def sqlite_with_guards() -> sqlite3.Connection:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE actions_actionevent (id INTEGER PRIMARY KEY, reason TEXT)")
    db.execute("CREATE TABLE actions_securityevent (id INTEGER PRIMARY KEY, subject TEXT)")
    db.execute(f"CREATE TABLE actions_action (id INTEGER PRIMARY KEY, status TEXT, {', '.join(MATERIAL)})")
    for statement in SQLITE_GUARDS:
        db.execute(statement)
    return db


@pytest.mark.parametrize("table", ["actions_actionevent", "actions_securityevent"])
def test_sqlite_refuses_to_rewrite_or_delete_the_trails(table: str) -> None:
    db = sqlite_with_guards()
    db.execute(f"INSERT INTO {table} (id) VALUES (1)")  # noqa: S608 (a fixed table name)

    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        db.execute(f"UPDATE {table} SET id = 2")  # noqa: S608
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        db.execute(f"DELETE FROM {table}")  # noqa: S608


def test_sqlite_refuses_to_change_an_actions_material_fields_but_not_its_status() -> None:
    db = sqlite_with_guards()
    db.execute("INSERT INTO actions_action (id, status, amount, currency) VALUES (1, 'PROPOSED', '10.00', 'EUR')")

    db.execute("UPDATE actions_action SET status = 'AUTHORIZED'")
    with pytest.raises(sqlite3.IntegrityError, match="material"):
        db.execute("UPDATE actions_action SET amount = '1000.00'")


def test_the_database_file_is_created_readable_by_its_owner_only(tmp_path: Path) -> None:
    created = tmp_path / "console.sqlite3"
    existing = tmp_path / "old.sqlite3"
    existing.write_text("")
    existing.chmod(0o644)

    create_private_file(created)
    create_private_file(existing)

    assert created.stat().st_mode & 0o777 == 0o600
    assert existing.stat().st_mode & 0o777 == 0o600


@pytest.mark.django_db
def test_seed_demo_refuses_to_run_with_debug_off(settings: Any) -> None:
    settings.DEBUG = False
    with pytest.raises(CommandError, match="DEBUG"):
        call_command("seed_demo")
    assert not User.objects.exists()
