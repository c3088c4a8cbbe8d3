"""P-f, and the manager's wait: how long an action is unsafe after a worker dies, and how long a
manager waits from her approval to its outcome.

    python -m tests.bench.bench_recovery pf --actions 40 --lease 20 --sweep 2
    python -m tests.bench.bench_recovery wait --rates 10,100,400 --latencies 0,200 --minutes 0.5

Not a pytest test: it measures and prints. It sets itself up (its own database, the payment
sandbox, Celery workers with beat) and cleans up.

``pf``: a worker (threads pool) claims N auto-approved refunds while the sandbox holds each call
for ``--hold`` seconds, so all N are SUBMITTING in that worker when it is SIGKILLed. A second
worker, with beat, survives. For each action the benchmark reads, from the audit trail, when it
became safe again, measured from the kill:

- *swept*: its lease expired and the sweep moved it to UNKNOWN (reconciliation owns it);
- *resolved*: reconciliation recorded its final state, or handed it to a person (NEEDS_REVIEW).

P-f holds when the p99 of *swept* is within one lease plus one sweep interval of the kill (a
lease taken just before the kill expires a full lease later, and the sweep sees it within one
interval); *resolved* adds the reconciliation's lookup.

``wait``: proposals above the auto-approval threshold, approved by a manager (approval_decide,
as her click does) at a steady rate per minute for ``--minutes``, with the sandbox answering
after 0 or 200 ms. For each approval: the approval's time to the action's final state
(``status_changed_at``), p50 and p99, per rate and latency.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings

REPO_ROOT = Path(__file__).resolve().parents[2]
CAPTURED = 100_00
FINAL_OR_PERSON = ("SUCCEEDED", "FAILED_FINAL", "NEEDS_REVIEW")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["pf", "wait"])
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--broker-url", default=os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/12"))
    parser.add_argument("--actions", type=int, default=40, help="pf: actions in flight in the killed worker")
    parser.add_argument("--lease", type=int, default=20, help="LEASE_SECONDS (default 20)")
    parser.add_argument("--sweep", type=int, default=2, help="SWEEP_INTERVAL_SECONDS (default 2)")
    parser.add_argument("--hold", type=float, default=8.0, help="pf: seconds the sandbox holds each call")
    parser.add_argument("--rates", default="10,100,400", help="wait: approvals per minute, comma-separated")
    parser.add_argument("--latencies", default="0,200", help="wait: receiver latency in ms, comma-separated")
    parser.add_argument("--minutes", type=float, default=0.5, help="wait: minutes of approvals per rate")
    parser.add_argument("--concurrency", type=int, default=16, help="threads per worker")
    return parser.parse_args(argv)


def configure_django(args: argparse.Namespace, workdir: Path) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "console.settings"
    os.environ["DATABASE_URL"] = args.database_url
    os.environ["DATABASE_POOL"] = "0"
    os.environ["DATABASE_TEST_NAME"] = f"bench_recovery_{os.getpid()}"
    os.environ["CELERY_BROKER_URL"] = args.broker_url
    os.environ["CONSOLE_DATA_DIR"] = str(workdir)
    os.environ["LEASE_SECONDS"] = str(args.lease)
    os.environ["SWEEP_INTERVAL_SECONDS"] = str(args.sweep)
    os.environ["RECONCILE_BASE_BACKOFF_SECONDS"] = "1"
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    os.environ.setdefault("AUTO_APPROVAL_AGENT_DAILY_AMOUNTS", "EUR:1000000000")
    import django

    django.setup()


def start_worker(
    args: argparse.Namespace, workdir: Path, env: dict[str, str], *, beat: bool, queue: str = ""
) -> subprocess.Popen[bytes]:
    """A worker on ``queue``, or by default on the workers' queue and the periodic tasks' queue
    (the survivor runs the sweeps)."""
    name = f"rec-{uuid.uuid4().hex[:6]}"
    every_queue = f"{settings.CELERY_TASK_DEFAULT_QUEUE},{settings.PERIODIC_QUEUE}"
    command = [
        sys.executable, "-m", "celery", "-A", "console", "worker",
        "--pool", "threads", "--concurrency", str(max(args.concurrency, args.actions if queue else 0)),
        "--loglevel", "WARNING", "--hostname", f"{name}@%h", "-Q", queue or every_queue,
        "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]  # fmt: skip
    if beat:
        command += ["--beat", "--schedule", str(workdir / f"beat-{name}")]
    log = open(workdir / f"{name}.log", "ab")  # noqa: SIM115 -- the child keeps it open
    return subprocess.Popen(
        command, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def worker_env(args: argparse.Namespace, sandbox_url: str, *, latency_ms: int = 0) -> dict[str, str]:
    from django.db import connection

    db = connection.settings_dict
    return {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
        "DATABASE_POOL": "1",
        "DATABASE_POOL_MAX": str(args.concurrency + 4),
        "PROVIDER_API_BASE": sandbox_url,
        # The worker sends only while its lease outlasts a whole call (the timeout): well inside it.
        "PROVIDER_TIMEOUT_SECONDS": str(max(1, args.lease // 2)),
        "CONSOLE_FAULT_POINTS": "",
    }


def seed(count: int, sandbox: Any, label: str) -> tuple[Any, list[Any]]:
    from datetime import timedelta

    from django.contrib.auth.models import User
    from django.utils import timezone

    from actions.models import Agent, Order, RefundRequest
    from actions.services import Actor

    owner, _ = User.objects.get_or_create(username="bench.owner")
    agent, _ = Agent.objects.get_or_create(name="bench-agent", defaults={"owner": owner, "scopes": ["refund"]})
    orders = Order.objects.bulk_create(
        Order(
            number=f"{label}-{i}", customer_name="Bench Customer", currency="EUR", captured_amount=CAPTURED / 100,
            charge_reference=f"ch_{label}_{i}", paid_at=timezone.now() - timedelta(days=1),
        )
        for i in range(count)
    )  # fmt: skip
    RefundRequest.objects.bulk_create(RefundRequest(order=order, number=1) for order in orders)
    for order in orders:
        sandbox.seed_charge(order.charge_reference, CAPTURED, "eur")
    return Actor.for_agent(agent), orders


def propose(actor: Any, order: Any, amount: str) -> Any:
    from actions.kinds.refund.proposal import action_propose_refund

    proposal = action_propose_refund(
        order_number=order.number,
        request_number=1,
        amount=amount,
        currency="EUR",
        reason_code="damaged",
        proposer=actor,
    )
    return proposal.action


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]


def spread(values: list[float]) -> str:
    p50, p99 = percentile(values, 0.5), percentile(values, 0.99)
    return f"p50 {p50:6.2f} s   p99 {p99:6.2f} s   max {max(values):6.2f} s"


def first_event_at(action_pk: int, states: Sequence[str], after: datetime) -> datetime | None:
    from actions.models import ActionEvent

    event = (
        ActionEvent.objects.filter(action_id=action_pk, to_state__in=states, created_at__gte=after)
        .order_by("created_at")
        .first()
    )
    return event.created_at if event else None


def run_pf(args: argparse.Namespace, workdir: Path, sandbox: Any, sandbox_url: str) -> list[str]:
    import actions.foundation.publish
    from actions.foundation.sql import database_now
    from actions.models import Action, ActionStatus
    from console.celery import app

    actor, orders = seed(args.actions, sandbox, "pf")
    env = worker_env(args, sandbox_url)
    # The survivor (with beat) takes the sweeps and reconciliations from the default queue; the
    # victim takes the measured dispatches from a queue of its own, so that all N are in it.
    survivor = start_worker(args, workdir, env, beat=True)
    victim = start_worker(args, workdir, env, beat=False, queue="victim")
    processes = [survivor, victim]
    try:
        # Hold every create long enough for the victim to be holding them all when it dies.
        sandbox.fault(mode="slow", sleep_seconds=args.hold, times=args.actions)
        time.sleep(3)  # both workers consuming (a warm-up, not a measurement)
        held: list[int] = []
        publish = actions.foundation.publish.dispatch_enqueue
        actions.foundation.publish.dispatch_enqueue = held.append  # type: ignore[assignment]
        try:
            pks = [propose(actor, order, "10.00").pk for order in orders]
        finally:
            actions.foundation.publish.dispatch_enqueue = publish
        for pk in held:
            app.send_task("actions.tasks.dispatch", args=[pk], queue="victim")
        wait_for(
            lambda: not Action.objects.filter(pk__in=pks, status=ActionStatus.AUTHORIZED).exists(),
            60,
            "every action claimed",
        )
        os.killpg(victim.pid, signal.SIGKILL)
        killed_at = database_now()
        # The ones in flight when the worker died; a call that ended first is not measured.
        pks = list(Action.objects.filter(pk__in=pks, status=ActionStatus.SUBMITTING).values_list("pk", flat=True))
        in_victim = len(pks)
        wait_for(
            lambda: Action.objects.filter(pk__in=pks, status__in=FINAL_OR_PERSON).count() == len(pks),
            args.lease * 10 + 120,
            "every action resolved",
        )
        swept, resolved = [], []
        for pk in pks:
            unknown = first_event_at(pk, ["UNKNOWN"], killed_at)
            final = first_event_at(pk, FINAL_OR_PERSON, killed_at)
            if unknown is None:
                continue
            swept.append((unknown - killed_at).total_seconds())
            if final is not None:
                resolved.append((final - killed_at).total_seconds())
        bound = args.lease + args.sweep
        lines = [
            f"P-f: {args.actions} actions claimed, {in_victim} in flight in the worker SIGKILLed; lease {args.lease} s,"
            f" sweep every {args.sweep} s, bound = lease + one sweep = {bound} s",
            f"  swept to UNKNOWN after the kill:   {spread(swept)}"
            f"   ({'within' if percentile(swept, 0.99) <= bound else 'OVER'} the bound)",
            f"  resolved (final or with a person): {spread(resolved)}",
            "  final states: " + ", ".join(
                f"{state} {count}" for state, count in sorted(
                    {s: list(Action.objects.filter(pk__in=pks).values_list('status', flat=True)).count(s)
                     for s in FINAL_OR_PERSON}.items())
            ),
        ]  # fmt: skip
        return lines
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)


def run_wait(args: argparse.Namespace, workdir: Path, sandbox: Any, sandbox_url: str) -> list[str]:
    from django.contrib.auth.models import Group, User

    from actions.models import Action
    from approvals.models import ApprovalLimit
    from approvals.services import approval_decide
    from console.roles import MANAGER

    manager, _ = User.objects.get_or_create(username="bench.manager")
    manager.groups.add(Group.objects.get(name=MANAGER))
    ApprovalLimit.objects.get_or_create(user=manager, currency="EUR", defaults={"max_amount": 1000})
    lines = ["The manager's wait: her approval to the action's final state (approved_at -> status_changed_at)"]
    lines.append(f"  {'approvals/min':>13} {'latency':>8} {'n':>5} {'p50':>8} {'p99':>8}")
    for latency in [int(x) for x in args.latencies.split(",")]:
        env = worker_env(args, sandbox_url, latency_ms=latency)
        workers = [start_worker(args, workdir, env, beat=True)]
        try:
            time.sleep(3)
            for rate in [int(x) for x in args.rates.split(",")]:
                count = max(3, round(rate * args.minutes))
                actor, orders = seed(count, sandbox, f"w{latency}-{rate}")
                if latency:
                    sandbox.fault(mode="slow", sleep_seconds=latency / 1000, times=count)
                # Above the auto-approval threshold: each waits for the manager.
                pks = [propose(actor, order, "60.00").pk for order in orders]
                gap = 60.0 / rate
                started = time.monotonic()
                for index, pk in enumerate(pks):
                    delay = started + index * gap - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    approval_decide(action_pk=pk, user=manager, decision="approve")
                wait_for(
                    lambda pks=pks: Action.objects.filter(pk__in=pks, status__in=FINAL_OR_PERSON).count() == len(pks),
                    300,
                    "every approved action final",
                )
                waits, claims = [], []
                for action in Action.objects.filter(pk__in=pks).prefetch_related("approvals"):
                    approved = max(a.decided_at for a in action.approvals.all() if a.decided_at)
                    waits.append((action.status_changed_at - approved).total_seconds())
                    claimed = first_event_at(action.pk, ["SUBMITTING"], approved)
                    if claimed is not None:
                        claims.append((claimed - approved).total_seconds())
                p50, p99 = percentile(waits, 0.5), percentile(waits, 0.99)
                claim50 = percentile(claims, 0.5) if claims else float("nan")
                if os.environ.get("BENCH_TRAIL"):
                    from actions.models import ActionEvent

                    trail = ActionEvent.objects.filter(action_id=pks[0]).order_by("created_at")
                    lines += [f"  {e.created_at:%H:%M:%S} {e.from_state}->{e.to_state} {e.reason[:60]}" for e in trail]
                lines.append(
                    f"  {rate:>13} {latency:>6}ms {len(waits):>5} {p50:>7.2f}s {p99:>7.2f}s"
                    f"   (claimed p50 {claim50:.2f}s)"
                )
        finally:
            for process in workers:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=30)
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="bench_recovery_"))
    configure_django(args, workdir)
    import redis
    import requests
    from django.db import connection

    from tests.processes import SandboxProcess
    from tests.providers.sandbox_client import SandboxClient

    broker = redis.Redis.from_url(args.broker_url)
    broker.flushdb()
    sandbox_process = SandboxProcess(workdir)
    created = False
    try:
        connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
        created = True
        sandbox_process.start()
        sandbox = SandboxClient(sandbox_process.url, requests.Session())
        run = run_pf if args.mode == "pf" else run_wait
        for line in run(args, workdir, sandbox, sandbox_process.url):
            print(line, flush=True)
        return 0
    finally:
        sandbox_process.stop()
        broker.flushdb()
        if created:
            connection.creation.destroy_test_db(connection.settings_dict["NAME"], verbosity=0)


if __name__ == "__main__":
    sys.exit(main())
