"""Run the chaos test against the configured PostgreSQL and Redis and print its report.

A dedicated database is strongly advised: the run restarts PostgreSQL (all its clients see
the restart) and flushes the Redis broker database. See docs/proving.md.

The restart is ``pg_ctlcluster --skip-systemctl-redirect <version> $CHAOS_POSTGRES_CLUSTER restart``
(CHAOS_POSTGRES_CLUSTER defaults to "main"): point the run's DATABASE_URL at a cluster of its own
and name that cluster, and nobody else's connections are cut.
"""

from __future__ import annotations

import signal
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from harness.chaos.run import ChaosConfig, ChaosRun, postgres_restart_command


class Command(BaseCommand):
    help = (
        "Propose N actions (refunds and invoice adjustments) and supplier emails through the API while "
        "killing workers and injecting faults; then audit each receiver's own ledger, per kind. "
        "The PostgreSQL restart acts on the cluster named by CHAOS_POSTGRES_CLUSTER (default: main)."
    )

    def add_arguments(self, parser: Any) -> None:
        defaults = ChaosConfig()
        parser.add_argument(
            "--actions", type=int, default=defaults.actions, help="refunds and invoice adjustments together"
        )
        parser.add_argument(
            "--adjustment-share",
            type=float,
            default=defaults.adjustment_share,
            help="share of --actions that are invoice adjustments (1/3 or more exercises the second receiver; "
            "0: refunds only)",
        )
        parser.add_argument("--workers", type=int, default=defaults.workers)
        parser.add_argument(
            "--dispatchers",
            type=int,
            default=defaults.dispatchers,
            help="the concurrent profile: dispatcher processes beside the workers (0: Celery dispatch only)",
        )
        parser.add_argument(
            "--dispatcher-concurrency",
            type=int,
            default=defaults.dispatcher_concurrency,
            help="calls in flight per dispatcher process (also its batch size)",
        )
        parser.add_argument(
            "--periodic-concurrency",
            type=int,
            default=defaults.periodic_concurrency,
            help="processes of each host's worker for the periodic tasks' queue",
        )
        parser.add_argument(
            "--sweep-interval",
            type=int,
            default=defaults.sweep_interval_seconds,
            help="seconds between the sweeps' periods; their stale threshold is SCHEDULE_STALE_PERIODS of them",
        )
        parser.add_argument("--kill-every", type=float, default=defaults.kill_every_seconds, help="seconds")
        parser.add_argument(
            "--create-faults",
            type=float,
            default=defaults.create_fault_probability,
            help="probability of each sandbox fault mode on refund creation",
        )
        parser.add_argument(
            "--lookup-faults",
            type=float,
            default=defaults.lookup_fault_probability,
            help="probability of each sandbox fault mode on lookups",
        )
        parser.add_argument(
            "--worker-faults",
            type=float,
            default=defaults.worker_fault_probability,
            help="probability that a worker kills itself at each fault point",
        )
        parser.add_argument("--no-postgres-restart", action="store_true")
        parser.add_argument("--no-redis-flush", action="store_true")
        parser.add_argument(
            "--restart-redis",
            action="store_true",
            help="restart the broker's Redis server instead of flushing it (give the run a Redis of its own)",
        )
        parser.add_argument("--drain-deadline", type=float, default=defaults.drain_deadline_seconds, help="seconds")
        parser.add_argument("--seed", type=int, default=defaults.seed)
        parser.add_argument("--emails", type=int, default=defaults.emails, help="supplier emails to propose")
        parser.add_argument(
            "--mail-faults",
            type=float,
            default=defaults.mail_fault_probability,
            help="probability of each mail sandbox fault (defer, reject, drop after DATA) per message",
        )
        parser.add_argument(
            "--outage",
            type=float,
            default=defaults.outage_seconds,
            help="seconds the receiver refuses every create and lookup (0: none)",
        )
        parser.add_argument(
            "--outside-refunds",
            type=float,
            default=defaults.outside_refund_share,
            help="share of the orders that get a refund made outside the console, told by webhook",
        )
        parser.add_argument("--no-finance", action="store_true", help="leave NEEDS_REVIEW actions unresolved")
        parser.add_argument(
            "--workflow-share",
            type=float,
            default=defaults.workflow_share,
            help="workflows (po_mismatch_resolution) as a share of the run's work; needs adjustments",
        )
        parser.add_argument(
            "--hosts",
            type=int,
            default=defaults.hosts,
            help="simulated hosts, each with its own web process, --workers workers, --dispatchers dispatchers "
            "and beat, on the same PostgreSQL and Redis (1: a single host)",
        )
        parser.add_argument(
            "--lose-host-at",
            type=float,
            default=defaults.lose_host_at,
            help="SIGKILL the first host whole (beat included) once this share of the actions exists (0: never)",
        )
        parser.add_argument(
            "--host-back-after",
            type=float,
            default=defaults.host_back_after_seconds,
            help="seconds until the lost host comes back, every process restarted",
        )
        parser.add_argument(
            "--skew-seconds",
            type=int,
            default=defaults.skew_seconds,
            help="the last host's clock runs this far ahead (negative: behind), through libfaketime "
            "(apt-get install -y faketime)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not 0 <= options["adjustment_share"] <= 1:
            raise CommandError("--adjustment-share must be between 0 and 1.")
        if not 0 <= options["workflow_share"] < 1:
            raise CommandError("--workflow-share must be at least 0 and below 1.")
        if options["hosts"] < 1:
            raise CommandError("--hosts must be at least 1.")
        if options["periodic_concurrency"] < 1:
            raise CommandError("--periodic-concurrency must be at least 1: the sweeps need a process.")
        if options["sweep_interval"] < 1:
            raise CommandError("--sweep-interval must be at least 1 second.")
        if not 0 <= options["lose_host_at"] < 1:
            raise CommandError("--lose-host-at must be at least 0 and below 1.")
        if options["hosts"] == 1 and (options["lose_host_at"] or options["skew_seconds"]):
            raise CommandError("--lose-host-at and --skew-seconds need --hosts 2 or more.")
        if options["host_back_after"] <= 0:
            raise CommandError("--host-back-after must be above 0 seconds.")
        config = ChaosConfig(
            actions=options["actions"],
            adjustment_share=options["adjustment_share"],
            workers=options["workers"],
            dispatchers=options["dispatchers"],
            dispatcher_concurrency=options["dispatcher_concurrency"],
            periodic_concurrency=options["periodic_concurrency"],
            sweep_interval_seconds=options["sweep_interval"],
            kill_every_seconds=options["kill_every"],
            create_fault_probability=options["create_faults"],
            lookup_fault_probability=options["lookup_faults"],
            worker_fault_probability=options["worker_faults"],
            restart_postgres=not options["no_postgres_restart"],
            flush_redis=not options["no_redis_flush"],
            restart_redis=options["restart_redis"],
            drain_deadline_seconds=options["drain_deadline"],
            seed=options["seed"],
            emails=options["emails"],
            mail_fault_probability=options["mail_faults"],
            outage_seconds=options["outage"],
            outside_refund_share=options["outside_refunds"],
            finance_resolves=not options["no_finance"],
            workflow_share=options["workflow_share"],
            hosts=options["hosts"],
            lose_host_at=options["lose_host_at"],
            host_back_after_seconds=options["host_back_after"],
            skew_seconds=options["skew_seconds"],
        )
        if config.restart_postgres:
            try:
                postgres_restart_command()  # names a cluster that exists, before anything starts
            except RuntimeError as error:
                raise CommandError(str(error)) from None
        # A SIGTERM (a CI timeout, a person's kill) unwinds the run, so that it stops the
        # processes it started instead of leaving them running.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        try:
            report = ChaosRun(config).run()
        except RuntimeError as error:
            # A check before anything starts (libfaketime missing, the skew not applying) or a
            # process that never came up: the message names it.
            raise CommandError(str(error)) from None
        for line in report.lines():
            self.stdout.write(line)
        if not report.ok:
            sys.exit(1)
