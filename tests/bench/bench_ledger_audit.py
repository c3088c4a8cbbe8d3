"""What the ledger audit costs in memory and time: N refunds at the sandbox provider, each with
its SUCCEEDED action, audited once as the whole history in one read ("before": one window as
long as the history, which is what the audit did before it read in windows) and once in
windows of a day ("after"), side by side (docs/benchmarks/index.md).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \\
        python -m tests.bench.bench_ledger_audit --effects 100000 [--days 100] [--window-hours 24] [--keep]

Not a pytest test: it prints a table. It creates its own database (Django's test database
machinery, migrated) and its own sandbox provider (a separate process, as in production: the
audit reads it over HTTP, page by page, through the Stripe SDK). The refunds are written
straight into the sandbox's SQLite file and the actions with ``bulk_create``, spread evenly
over ``--days``; both are set up so that the audit finds nothing, and the benchmark checks that
it does not. Each mode runs twice: once for the time (no tracing), once under ``tracemalloc``
for the peak of memory the Python heap held. ``ru_maxrss`` is the process's high-water mark of
resident memory: it only rises, so the windowed audit runs first, and the whole-history read's
figure is how far it pushed the mark above that.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sqlite3
import tempfile
import time
import tracemalloc
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--effects", type=int, default=100000)
    parser.add_argument("--days", type=int, default=100, help="the history's span (default 100 days)")
    parser.add_argument("--window-hours", type=float, default=24, help="the windowed audit's window (default 24)")
    parser.add_argument("--keep", action="store_true", help="keep the benchmark's database")
    args = parser.parse_args()
    os.environ["DJANGO_SETTINGS_MODULE"] = "console.settings"
    os.environ["DATABASE_TEST_NAME"] = f"bench_ledger_audit_{os.getpid()}"
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    # Only the refund kind's receiver is read: no accounting system, no mail sandbox.
    os.environ["ACCOUNTING_API_BASE"] = ""
    os.environ["MAIL_SANDBOX_URL"] = ""
    import django

    django.setup()
    from django.conf import settings
    from django.test.utils import setup_databases, teardown_databases
    from django.utils import timezone

    from actions.engine.ledger import ledger_audit_run
    from actions.kinds.refund.contract import provider_from_settings
    from actions.models import Action, ActionKind, ActionStatus, Discrepancy, LedgerAuditCursor
    from harness.sandboxes.payment.app import Sandbox
    from tests.processes import SandboxProcess

    names = setup_databases(verbosity=0, interactive=False)
    workdir = Path(tempfile.mkdtemp(prefix="bench-ledger-audit-"))
    sandbox = SandboxProcess(workdir)
    try:
        now = timezone.now()
        start = (now - timedelta(days=args.days)).replace(minute=0, second=0, microsecond=0)
        span = (now - timedelta(minutes=5)) - start
        step = span / args.effects
        created = [start + step * n for n in range(args.effects)]

        seeding = time.perf_counter()
        Sandbox(str(workdir / "sandbox.sqlite3")).close()  # its schema
        with sqlite3.connect(workdir / "sandbox.sqlite3") as db:
            db.executemany(
                "INSERT INTO charges (id, amount, currency, created, metadata) VALUES (?, 100000, 'eur', ?, '{}')",
                ((f"ch_bench_{n}", int(at.timestamp())) for n, at in enumerate(created)),
            )
            db.executemany(
                "INSERT INTO refunds (id, charge, amount, currency, status, reason, metadata, created, created_at, "
                "visible_at, planted) VALUES (?, ?, 1000, 'eur', 'succeeded', NULL, ?, ?, ?, ?, 0)",
                (
                    (
                        f"re_bench_{n}",
                        f"ch_bench_{n}",
                        json.dumps({"action_id": f"refund:order-bench-{n}:request-1"}),
                        int(at.timestamp()),
                        at.timestamp(),
                        at.timestamp(),
                    )
                    for n, at in enumerate(created)
                ),
            )
        batch = 2000
        for first in range(0, args.effects, batch):
            Action.objects.bulk_create(
                [
                    Action(
                        action_id=f"refund:order-bench-{n}:request-1",
                        kind=ActionKind.REFUND,
                        idempotency_key=f"refund:order-bench-{n}:request-1",
                        payload={"kind": "refund", "order": f"bench-{n}", "charge": f"ch_bench_{n}"},
                        payload_hash="sha256:" + "0" * 64,
                        amount=Decimal("10.00"),
                        currency="EUR",
                        reason_code="damaged",
                        status=ActionStatus.SUCCEEDED,
                        provider_reference=f"re_bench_{n}",
                        # The console records the success a moment after the receiver made it.
                        status_changed_at=created[n] + timedelta(seconds=1),
                    )
                    for n in range(first, min(first + batch, args.effects))
                ]
            )
        seconds = time.perf_counter() - seeding
        print(f"seeded {args.effects} refunds and actions over {args.days} days in {seconds:.1f}s")

        sandbox.start()
        settings.PROVIDER_API_BASE = sandbox.url
        settings.LEDGER_AUDIT_START = start.isoformat()
        provider_from_settings.cache_clear()

        modes = [
            (f"after: windows of {args.window_hours:g}h", timedelta(hours=args.window_hours)),
            ("before: the whole history at once", span + timedelta(days=1)),
        ]
        rows: list[dict[str, Any]] = []
        for label, window in modes:
            rows.append(measure(label, window, ledger_audit_run, LedgerAuditCursor, Discrepancy))
        print()
        print(f"{'mode':<36} {'windows':>8} {'effects':>8} {'time s':>8} ", end="")
        print(f"{'tracemalloc peak MiB':>21} {'maxrss +MiB':>12}")
        for row in rows:
            print(
                f"{row['label']:<36} {row['windows']:>8} {row['effects']:>8} {row['seconds']:>8.1f} "
                f"{row['peak_mib']:>21.1f} {row['rss_mib']:>12.1f}"
            )
    finally:
        sandbox.stop()
        if not args.keep:
            teardown_databases(names, verbosity=0)


def measure(label: str, window: timedelta, audit: Any, cursors: Any, discrepancies: Any) -> dict[str, Any]:
    """One mode: a timed run, then a traced one, each from an empty cursor."""
    from actions.engine import ledger

    windows = 0
    read = ledger.ledger_compare

    def counting(**kwargs: Any) -> Any:
        nonlocal windows
        windows += kwargs["kind"].name == "refund"
        return read(**kwargs)

    ledger.ledger_compare = counting  # type: ignore[assignment]
    try:
        cursors.objects.all().delete()
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        started = time.perf_counter()
        run = audit(window_length=window)
        seconds = time.perf_counter() - started
        rss_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
        counted_windows = windows

        cursors.objects.all().delete()
        tracemalloc.start()
        audit(window_length=window)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    finally:
        ledger.ledger_compare = read  # type: ignore[assignment]
    if run.error or discrepancies.objects.exists():
        raise SystemExit(f"{label}: the audit should find nothing here: {run.error or discrepancies.objects.first()}")
    print(f"{label}: {run.effects_seen} effects, {run.actions_checked} action checks, {seconds:.1f}s")
    return {
        "label": label,
        "windows": counted_windows,
        "effects": run.effects_seen,
        "seconds": seconds,
        "peak_mib": peak / 2**20,
        "rss_mib": rss_mib,
    }


if __name__ == "__main__":
    main()
