"""Run the chaos test against the configured PostgreSQL and Redis and print its report.

A dedicated database is strongly advised: the run restarts PostgreSQL (all its clients see
the restart) and flushes the Redis broker database. See README.md, "The chaos run".
"""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand

from actions.chaos import ChaosConfig, ChaosRun


class Command(BaseCommand):
    help = "Propose N refunds through the API while killing workers and injecting faults; then audit."

    def add_arguments(self, parser: Any) -> None:
        defaults = ChaosConfig()
        parser.add_argument("--actions", type=int, default=defaults.actions)
        parser.add_argument("--workers", type=int, default=defaults.workers)
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
        parser.add_argument("--drain-deadline", type=float, default=defaults.drain_deadline_seconds, help="seconds")
        parser.add_argument("--seed", type=int, default=defaults.seed)
        parser.add_argument(
            "--adjustment-share",
            type=float,
            default=defaults.adjustment_share,
            help="share of the actions that are invoice adjustments (the rest are refunds)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        config = ChaosConfig(
            actions=options["actions"],
            workers=options["workers"],
            kill_every_seconds=options["kill_every"],
            create_fault_probability=options["create_faults"],
            lookup_fault_probability=options["lookup_faults"],
            worker_fault_probability=options["worker_faults"],
            restart_postgres=not options["no_postgres_restart"],
            flush_redis=not options["no_redis_flush"],
            drain_deadline_seconds=options["drain_deadline"],
            seed=options["seed"],
            adjustment_share=options["adjustment_share"],
        )
        report = ChaosRun(config).run()
        for line in report.lines():
            self.stdout.write(line)
        if not report.ok:
            sys.exit(1)
