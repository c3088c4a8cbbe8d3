"""Btree indexes for the search's exact lookups (actions/search.py), on PostgreSQL only.

The search first asks whether the term is exactly an identifier something holds, in any case:
Django writes ``number__iexact`` as ``UPPER(number::text) = UPPER('term')``, which a btree over
the same ``UPPER(col)`` expression answers in a few page reads however large the table grows
(the trigram indexes of ``0017_search_indexes`` read every row that shares the term's
trigrams). The customer's email already has one (``order_email_upper_idx``), and the refund's
and the charge's references are matched as the provider spells them, by their plain btrees.

On SQLite ``iexact`` is a ``LIKE``, which no expression index serves, and the tables are
small: the indexes are skipped there, as in ``0017``. They are not in the models' Meta for the
same reason.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

# (table, column, index name)
INDEXES = [
    ("actions_order", "number", "order_number_upper_idx"),
    ("actions_refundrequest", "external_reference", "refund_request_ref_upper_idx"),
    ("actions_bill", "number", "bill_number_upper_idx"),
]


def _postgres(schema_editor: Any) -> bool:
    return bool(schema_editor.connection.vendor == "postgresql")


def create_indexes(apps: Any, schema_editor: Any) -> None:
    if not _postgres(schema_editor):
        return
    for table, column, name in INDEXES:
        schema_editor.execute(
            f"CREATE INDEX IF NOT EXISTS {name} ON {table} (UPPER({schema_editor.quote_name(column)}))"
        )


def drop_indexes(apps: Any, schema_editor: Any) -> None:
    if not _postgres(schema_editor):
        return
    for _, _, name in INDEXES:
        schema_editor.execute(f"DROP INDEX IF EXISTS {name}")


class Migration(migrations.Migration):
    dependencies = [("actions", "0017_search_indexes")]

    operations = [migrations.RunPython(create_indexes, drop_indexes, elidable=False)]
