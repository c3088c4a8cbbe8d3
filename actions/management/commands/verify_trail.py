"""``manage.py verify_trail``: recompute every action's hash chain and every checkpoint of the
audit trail; name the first broken link; exit 1 on any (docs/evidence.md)."""

from __future__ import annotations

import sys
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from actions.evidence.checkpoints import signing_key
from actions.evidence.verify import trail_check, trail_verify


class Command(BaseCommand):
    help = "Recompute the audit trail's hash chains and checkpoints; exit 1 at the first break."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--notify", action="store_true", help="Also tell finance of the breaks, as the periodic check does."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        started = time.perf_counter()
        key = signing_key()
        report = trail_check(key=key) if options["notify"] else trail_verify(key=key)
        elapsed = time.perf_counter() - started
        self.stdout.write(
            f"{report.actions} actions, {report.events} events, {report.checkpoints} checkpoints, "
            f"{report.tombstones} retention tombstones checked "
            f"in {elapsed:.2f} s"
        )
        if report.first is None:
            self.stdout.write("the trail verifies: every chain and checkpoint holds")
            return
        self.stderr.write(f"FIRST BREAK: {report.first.line()}")
        if len(report.breaks) > 1:
            self.stderr.write(f"{len(report.breaks) - 1} more:")
            for found in report.breaks[1:20]:
                self.stderr.write(f"  {found.line()}")
        sys.exit(1)
