"""Run the dispatcher process: batched claims and many receiver calls in flight (README, "Worker profiles").

    python manage.py dispatcher --concurrency 32 --batch 16

It runs beside the Celery workers and beat, which still do everything else (reconciliation,
the sweeps, workflows). SIGTERM or SIGINT stops the claiming; the calls in flight finish and are
recorded before the process exits. Set DATABASE_POOL_MAX to at least concurrency + 2: each
calling thread may keep one database connection (a kind may read while it builds its call), the
claim loop keeps one, and the recorder thread, which records every answer, one.
"""

from __future__ import annotations

import signal
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from actions.engine.dispatcher import Dispatcher


class Command(BaseCommand):
    help = "Claim AUTHORIZED actions in batches and keep many receiver calls in flight."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--concurrency", type=int, default=16, help="receiver calls in flight at most")
        parser.add_argument(
            "--batch", type=int, default=settings.DISPATCH_BATCH_SIZE, help="actions claimed per transaction at most"
        )
        parser.add_argument(
            "--idle", type=float, default=0.05, help="seconds before looking again when nothing was claimable"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        concurrency, batch = options["concurrency"], options["batch"]
        if concurrency < 1 or batch < 1:
            raise CommandError("--concurrency and --batch must be at least 1.")
        pool = settings.DATABASES["default"].get("OPTIONS", {}).get("pool")
        needed = concurrency + 2  # the calling threads, the claim loop and the recorder
        if isinstance(pool, dict) and pool.get("max_size", 0) < needed:
            raise CommandError(
                f"DATABASE_POOL_MAX is {pool.get('max_size')}: it must be at least --concurrency + 2 "
                f"({needed}: a connection for each calling thread, the claim loop and the recorder), "
                "or the pool would silently cap the calls in flight."
            )
        dispatcher = Dispatcher(concurrency=concurrency, batch_size=batch, idle_seconds=options["idle"])
        # Only the flag: the handler runs in the claim loop's own thread, which may be inside the
        # wake event's lock (not reentrant) when the signal lands. The idle wait ends within a
        # second by itself.
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: dispatcher.stop.set())
        self.stdout.write(
            f"dispatcher ready: {concurrency} calls in flight at most, batches of {batch}, "
            f"{dispatcher.prefetch} claimed ahead of a free thread at most "
            f"(LEASE_SECONDS {settings.LEASE_SECONDS}, PROVIDER_TIMEOUT_SECONDS {settings.PROVIDER_TIMEOUT_SECONDS})"
        )
        self.stdout.flush()
        stats = dispatcher.run()
        self.stdout.write(
            f"dispatcher stopped: {stats.claimed} claimed in {stats.claim_transactions} claim transactions, "
            f"{stats.stale} stale, recorded {stats.recorded or {}}, {stats.errors} errors, "
            f"{len(stats.batch_sizes)} non-empty claims of at most {max(stats.batch_sizes, default=0)}, "
            f"{stats.record_transactions} record transactions of at most {max(stats.group_sizes, default=0)}, "
            f"{dispatcher.peak_outstanding} claimed and unrecorded at the peak"
        )
