"""``manage.py archive_closed_actions [--before DATE] [--dry-run]``: move the audit events of
closed actions out of the live trail, as the monthly retention run does
(docs/operators/retention.md)."""

from __future__ import annotations

from datetime import date, datetime, time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from actions.engine.retention import archive_closed_actions


def _day(value: str) -> date:
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise CommandError(f"--before takes a date as YYYY-MM-DD, not {value!r}") from None


class Command(BaseCommand):
    help = "Archive the audit events of actions closed before a date (by default ARCHIVE_AFTER_DAYS ago)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--before", help="Archive actions closed before this day (YYYY-MM-DD, the console's time zone)."
        )
        parser.add_argument("--dry-run", action="store_true", help="Count what would move; move nothing.")

    def handle(self, *args: Any, **options: Any) -> None:
        before = None
        if options["before"]:
            day = _day(options["before"])
            before = timezone.make_aware(datetime.combine(day, time.min))
            if before > timezone.now():
                raise CommandError("--before lies in the future: only actions closed in the past are archived")
        report = archive_closed_actions(before=before, dry_run=options["dry_run"])
        verb = "would move" if report.dry_run else "moved"
        self.stdout.write(
            f"{verb} {report.events} events of {report.actions} actions closed before "
            f"{timezone.localtime(report.before):%Y-%m-%d %H:%M} to the archive"
        )
