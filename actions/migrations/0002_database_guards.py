"""PostgreSQL triggers: the audit trail is append-only and material fields are immutable.

SQLite gets the Python-level guards only (model save/delete and the queryset)."""

from __future__ import annotations

from django.db import migrations

from actions.foundation.db_guards import install_database_guards, remove_database_guards


class Migration(migrations.Migration):
    dependencies = [("actions", "0001_initial")]

    operations = [migrations.RunPython(install_database_guards, remove_database_guards)]
