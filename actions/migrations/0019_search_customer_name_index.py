"""A btree for the search's exact lookup of a customer's whole name (actions/search.py,
``exact_named_orders``), on PostgreSQL only.

The search shows the newest orders first (``ORDER BY paid_at DESC, id DESC``, at most 200
followed to their actions). A name is shared by many orders, more as the history grows, so an
index on the name alone would still read every order of "Grace Hopper" and sort them. This one
is in the order the search reads: the upper-cased name (Django writes ``customer_name__iexact``
as ``UPPER(customer_name::text) = UPPER('term')``), then ``paid_at`` and ``id`` descending, so
the newest 200 come from the front of the index whatever the table's size (measured:
``tests/bench/bench_scale.py``, README "Scale").

Skipped on SQLite, as ``0017`` and ``0018`` are: ``iexact`` is a ``LIKE`` there, which no
expression index serves, and the tables are small.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

NAME = "order_name_upper_paid_idx"


def _postgres(schema_editor: Any) -> bool:
    return bool(schema_editor.connection.vendor == "postgresql")


def create_index(apps: Any, schema_editor: Any) -> None:
    if _postgres(schema_editor):
        schema_editor.execute(
            f"CREATE INDEX IF NOT EXISTS {NAME} ON actions_order (UPPER(customer_name), paid_at DESC, id DESC)"
        )


def drop_index(apps: Any, schema_editor: Any) -> None:
    if _postgres(schema_editor):
        schema_editor.execute(f"DROP INDEX IF EXISTS {NAME}")


class Migration(migrations.Migration):
    dependencies = [("actions", "0018_search_exact_indexes")]

    operations = [migrations.RunPython(create_index, drop_index, elidable=False)]
