"""Compare the receiver's ledger with the console's records; exit 1 when anything differs.

For cron and CI: ``python manage.py audit_ledger`` prints a summary and stores a Discrepancy
for each finding (finance sees them in the review queue).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from actions.engine.ledger import ledger_audit_run
from actions.models import Discrepancy


class Command(BaseCommand):
    help = "Compare the payment provider's ledger with the console's actions and record discrepancies."

    def handle(self, *args: Any, **options: Any) -> None:
        run = ledger_audit_run()
        if run.error:
            raise CommandError(run.error)
        self.stdout.write(
            f"Ledger audit: {run.effects_seen} effects at the receivers, {run.actions_checked} actions checked, "
            f"{run.discrepancies_found} discrepancies ({run.discrepancies_new} new)."
        )
        if run.discrepancies_found:
            for discrepancy in Discrepancy.objects.filter(status="open").select_related("action")[:50]:
                self.stdout.write(f"  - {discrepancy}")
            raise CommandError(
                f"{run.discrepancies_found} discrepancies between the receiver's ledger and the console."
            )
        self.stdout.write(self.style.SUCCESS("The receiver's ledger and the console agree."))
