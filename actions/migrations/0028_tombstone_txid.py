# The retention tombstone records the transaction that wrote it, and the archive's append-only
# guard lets an archived event be pruned only under a tombstone of the pruning transaction itself.

from django.db import migrations, models

import actions.models.actions
from actions.foundation.db_guards import install_archive_guards


class Migration(migrations.Migration):
    dependencies = [
        ("actions", "0027_ledger_audit_windows"),
    ]

    operations = [
        migrations.AddField(
            model_name="retentiontombstone",
            name="txid",
            field=models.BigIntegerField(
                blank=True, db_default=actions.models.actions.CurrentTransactionId(), editable=False, null=True
            ),
        ),
        # The guard's function as actions.foundation.db_guards now writes it (0026 installs the same
        # text on a new database: PL/pgSQL resolves the new column when the function runs, not when
        # it is made). Backwards the stricter guard stays: it refuses more, never less.
        migrations.RunPython(install_archive_guards, migrations.RunPython.noop),
    ]
