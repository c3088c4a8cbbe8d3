# A duplicate is stored under the lowest of its effects' references (actions.engine.ledger's
# duplicate_key), whichever window or lookup saw its copies. Rows written before that rule may
# carry another copy's reference: the next audit would then store the same duplicate a second
# time. Each is re-keyed; where the re-keyed row already exists, the one a person worked on is
# kept (as 0027 chose between copies), else the first one detected.

from django.db import migrations

DUPLICATE_KINDS = ("duplicate_effect", "repeat_by_decision")


def worked_on(row) -> bool:
    return row.status != "open" or row.owner_id is not None or bool(row.note)


def duplicates_rekey(apps, schema_editor):
    Discrepancy = apps.get_model("actions", "Discrepancy")
    for row in Discrepancy.objects.filter(kind__in=DUPLICATE_KINDS).order_by("id").iterator(chunk_size=2000):
        effects = [str(reference) for reference in (row.details or {}).get("effects") or []]
        if not effects or min(effects) == row.provider_reference:
            continue
        key = min(effects)
        twin = Discrepancy.objects.filter(kind=row.kind, action_id=row.action_id, provider_reference=key).first()
        if twin is None:
            Discrepancy.objects.filter(pk=row.pk).update(provider_reference=key)
        elif worked_on(row) and not worked_on(twin):
            twin.delete()
            Discrepancy.objects.filter(pk=row.pk).update(provider_reference=key)
        else:
            row.delete()


class Migration(migrations.Migration):
    dependencies = [
        ("actions", "0028_tombstone_txid"),
    ]

    operations = [
        migrations.RunPython(duplicates_rekey, migrations.RunPython.noop),
    ]
