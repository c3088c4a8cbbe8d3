"""Health check of the Celery workers: are enough of them alive and answering?

    manage.py celery_ping [--timeout 2] [--min-workers 1] [--hostname celery@worker-1]

Sends Celery's control ping through the broker and waits for replies. Prints one JSON line and
exits 0 when at least ``--min-workers`` answered (only the named worker, with ``--hostname``),
1 otherwise: usable as a monitoring check or a systemd ``ExecStartPost``/timer.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from console.celery import app


class Command(BaseCommand):
    help = "Ping the Celery workers through the broker; exit 1 when too few answer."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--timeout", type=float, default=2.0, help="Seconds to wait for replies (default 2).")
        parser.add_argument("--min-workers", type=int, default=1, help="Fewest answering workers that pass.")
        parser.add_argument("--hostname", help="Ping only this worker (its node name, e.g. celery@worker-1).")

    def handle(self, *args: Any, **options: Any) -> None:
        destination = [options["hostname"]] if options["hostname"] else None
        error: str | None = None
        try:
            replies = app.control.ping(timeout=options["timeout"], destination=destination) or []
        except Exception as exc:
            # The broker itself is down: no worker can be reached, which is the answer.
            replies, error = [], f"{type(exc).__name__}: {exc}"
        answered = sorted(name for reply in replies for name in reply)
        healthy = len(answered) >= options["min_workers"]
        report = {"healthy": healthy, "workers": answered, "expected_at_least": options["min_workers"]}
        if error:
            report["error"] = error
        self.stdout.write(json.dumps(report))
        if not healthy:
            sys.exit(1)
