"""Check invariants 1, 2, 5 and 8 against the console's database and the receiver's ledger.

    python manage.py audit_effects            # a table; exit 1 on any violation
    python manage.py audit_effects --json     # the same, machine-readable

Anyone can run it against a live deployment: it only reads.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from django.core.management.base import BaseCommand

from actions.engine.invariants import audit_effects

INVARIANTS = {
    1: "at most one effect per action",
    2: "exactly one effect per SUCCEEDED action, reference recorded",
    5: "the orders' money adds up",
    8: "nothing lost: no SUBMITTING/UNKNOWN beyond policy, NEEDS_REVIEW owned",
}


class Command(BaseCommand):
    help = "Audit the console against the payment provider's ledger (invariants 1, 2, 5 and 8)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
        parser.add_argument(
            "--stuck-grace",
            type=float,
            default=0,
            help="extra seconds allowed before an action counts as stuck (for a system under load)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        report = audit_effects(stuck_grace_seconds=options["stuck_grace"])
        if options["json"]:
            self.stdout.write(json.dumps(report.as_dict(), indent=2, default=str))
        else:
            self.stdout.write(
                f"actions {report.actions}   effects {report.effects}   targets checked {report.targets}   "
                f"duplicates {report.duplicates}   lost {report.lost}"
            )
            self.stdout.write("states: " + ", ".join(f"{k} {v}" for k, v in sorted(report.states.items())))
            self.stdout.write(f"{'invariant':<10} {'result':<8} what")
            for number, what in INVARIANTS.items():
                failed = sum(1 for v in report.violations if v.invariant == number)
                result = "ok" if not failed else f"{failed} FAIL"
                self.stdout.write(f"{number:<10} {result:<8} {what}")
            for violation in report.violations[:200]:
                self.stdout.write(f"  [{violation.invariant}] {violation.subject}: {violation.message}")
        if not report.ok:
            sys.exit(1)
