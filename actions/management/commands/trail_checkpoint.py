"""``manage.py trail_checkpoint``: make the audit trail's next signed checkpoint now (beat makes
one every TRAIL_INTERVAL_SECONDS)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from actions.evidence.checkpoints import checkpoint_make


class Command(BaseCommand):
    help = "Make the audit trail's next signed checkpoint."

    def handle(self, *args: Any, **options: Any) -> None:
        run = checkpoint_make()
        made = run.checkpoint
        if made is None:
            self.stdout.write("another run made the next checkpoint first")
        else:
            self.stdout.write(
                f"checkpoint {made.number}: {made.event_count} events, root {made.root}, signed by key {made.key_id}"
            )
        self.stdout.write(f"{run.appended} line(s) appended to the checkpoint file")
