"""Create or update orders from the payment provider's charges.

    manage.py import_charges [--page-size 100] [--max-charges N]

Reads every charge with Stripe's list API, page by page, and sends each one that names an order
(``metadata[order_number]``) through the same service as ``POST /api/v1/orders``. Safe to run
again at any time, e.g. from cron: unchanged charges write nothing.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from actions.orders.charges import ChargeListFailed, charges_import


class Command(BaseCommand):
    help = "Create or update orders from the payment provider's charges (Stripe's list API, paged)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--page-size", type=int, default=100, help="Charges per page, 1 to 100 (default 100).")
        parser.add_argument("--max-charges", type=int, default=None, help="Stop after this many charges.")

    def handle(self, *args: Any, **options: Any) -> None:
        if not 1 <= options["page_size"] <= 100:
            raise CommandError("--page-size must be between 1 and 100.")
        try:
            report = charges_import(page_size=options["page_size"], max_charges=options["max_charges"])
        except ChargeListFailed as failed:
            raise CommandError(f"{failed} Orders imported so far are kept; run the command again.") from None
        for charge_id, why in report.skipped:
            self.stderr.write(f"skipped {charge_id}: {why}")
        self.stdout.write(report.summary())
