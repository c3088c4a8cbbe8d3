"""Trigram indexes for the console's search (actions/search.py), on PostgreSQL only.

The search matches substrings case-insensitively, which Django writes as
``UPPER(col::text) LIKE UPPER('%term%')``. A GIN index of ``gin_trgm_ops`` over the same
``UPPER(col)`` expression serves that for any term of three characters or more, so the search
stays an index scan at a million actions (tests/actions/test_search.py shows the plan).

The embedded default (SQLite, ``make start``) has neither pg_trgm nor GIN: there the extension
operation does nothing and the indexes are skipped, and the search reads its small tables whole.
The indexes are not in the models' Meta for the same reason: a GinIndex there would be created on
SQLite too. Built CONCURRENTLY would need a non-atomic migration; these tables are built once, at
deploy, and the lock is short for a fresh install (see README, "Search", for a large table).
"""

from __future__ import annotations

from typing import Any

from django.contrib.postgres.operations import TrigramExtension
from django.db import migrations

# (table, column, index name): each column gets its own GIN index over UPPER(col) with
# gin_trgm_ops. One index per column rather than one per table: PostgreSQL prices a scan of a
# multicolumn GIN index by the whole index, so each column's scan looked four times dearer than it
# is, and the planner chose to read the table instead.
INDEXES = [
    ("actions_action", "action_id", "action_id_trgm_idx"),
    ("actions_action", "provider_reference", "action_provider_ref_trgm_idx"),
    ("actions_order", "number", "order_number_trgm_idx"),
    ("actions_order", "customer_name", "order_customer_name_trgm_idx"),
    ("actions_order", "customer_email", "order_customer_email_trgm_idx"),
    ("actions_order", "charge_reference", "order_charge_ref_trgm_idx"),
    ("actions_refundrequest", "external_reference", "refund_request_ref_trgm_idx"),
    ("actions_bill", "number", "bill_number_trgm_idx"),
    ("actions_bill", "supplier_name", "bill_supplier_trgm_idx"),
    ("actions_bill", "accounting_reference", "bill_accounting_ref_trgm_idx"),
]


def _postgres(schema_editor: Any) -> bool:
    return bool(schema_editor.connection.vendor == "postgresql")


def create_indexes(apps: Any, schema_editor: Any) -> None:
    if not _postgres(schema_editor):
        return
    for table, column, name in INDEXES:
        expression = f"UPPER({schema_editor.quote_name(column)}) gin_trgm_ops"
        schema_editor.execute(f"CREATE INDEX IF NOT EXISTS {name} ON {table} USING gin ({expression})")


def drop_indexes(apps: Any, schema_editor: Any) -> None:
    if not _postgres(schema_editor):
        return
    for _, _, name in INDEXES:
        schema_editor.execute(f"DROP INDEX IF EXISTS {name}")


class Migration(migrations.Migration):
    dependencies = [("actions", "0015_agent_webhooks_notifications")]

    operations = [
        TrigramExtension(),
        migrations.RunPython(create_indexes, drop_indexes, elidable=False),
    ]
