"""``manage.py export_evidence``: write evidence bundles, one signed JSON file and one readable
HTML page per action (docs/evidence.md)."""

from __future__ import annotations

from datetime import datetime, time
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from actions.evidence.bundle import (
    evidence_actions,
    evidence_bundle_signed,
    evidence_file_name,
    evidence_json,
    evidence_page_context,
)
from actions.models import Action


def _moment(text: str, option: str) -> datetime:
    moment = parse_datetime(text)
    if moment is None:
        day = parse_date(text)
        if day is None:
            raise CommandError(f"{option}: {text!r} is not a date (YYYY-MM-DD) or a time (YYYY-MM-DDTHH:MM)")
        moment = datetime.combine(day, time.min)
    return moment if timezone.is_aware(moment) else timezone.make_aware(moment)


class Command(BaseCommand):
    help = "Write the evidence bundles of one action, or of the actions proposed in a period."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--action", help="the action's id (refund:order-4821:request-3) or its key")
        parser.add_argument("--from", dest="start", help="the period's first day or time (inclusive)")
        parser.add_argument("--to", dest="end", help="the period's end (exclusive)")
        parser.add_argument("--out", required=True, help="the folder to write into (created if missing)")

    def handle(self, *args: Any, **options: Any) -> None:
        if bool(options["action"]) == bool(options["start"] or options["end"]):
            raise CommandError("give either --action, or --from and --to")
        if options["action"]:
            ref = options["action"]
            found = Action.objects.filter(action_id=ref).values_list("pk", flat=True).first()
            if found is None and ref.isdigit():
                found = Action.objects.filter(pk=int(ref)).values_list("pk", flat=True).first()
            if found is None:
                raise CommandError(f"--action: no action {ref!r}")
            pks = [found]
        else:
            if not (options["start"] and options["end"]):
                raise CommandError("--from and --to go together")
            start, end = _moment(options["start"], "--from"), _moment(options["end"], "--to")
            if end <= start:
                raise CommandError("--to must come after --from")
            pks = evidence_actions(start=start, end=end)
        out = Path(options["out"])
        out.mkdir(parents=True, exist_ok=True)
        for pk in pks:
            bundle = evidence_bundle_signed(action_pk=pk)
            name = evidence_file_name(bundle)
            (out / f"{name}.json").write_bytes(evidence_json(bundle))
            (out / f"{name}.html").write_text(
                render_to_string("actions/evidence_file.html", evidence_page_context(bundle)), encoding="utf-8"
            )
        self.stdout.write(f"{len(pks)} bundle(s) written to {out}")
