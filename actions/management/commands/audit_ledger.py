"""Compare the receivers' ledgers with the console's records; exit 1 while a discrepancy is open.

For cron and CI: ``python manage.py audit_ledger`` reads what is new since the last run, prints
a summary and stores a Discrepancy for each finding (finance sees them in the review queue). It
exits 1 while any discrepancy is open, found by this run or an earlier one: a run reads only the
windows since the last, so its own findings say nothing of one that nobody has closed.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from actions.engine.ledger import ledger_audit_run
from actions.models import Discrepancy
from actions.review.selectors.common import OPEN_DISCREPANCY
from actions.review.selectors.summary import ledger_audit_state


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
        state = ledger_audit_state()
        if state.open_discrepancies:
            for discrepancy in Discrepancy.objects.filter(status__in=OPEN_DISCREPANCY).select_related("action")[:50]:
                self.stdout.write(f"  - {discrepancy}")
            raise CommandError(
                f"{state.open_discrepancies} open discrepancies between the receivers' ledgers and the console."
            )
        self.stdout.write(self.style.SUCCESS("The receivers' ledgers and the console agree."))
