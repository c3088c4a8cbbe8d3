"""Dispatch throughput and PostgreSQL commits per action, next to bare Celery.

    python -m tests.bench.bench_dispatch --actions 200

Not a pytest test (pytest only collects ``test_*.py``): it measures and prints, and exits
non-zero only when the run itself went wrong (an action not SUCCEEDED, a refund missing or
doubled at the sandbox, an order whose money does not add up).

In one run, with the same Redis broker and the same Celery workers and settings:

1. bare Celery: N no-op tasks published from this process, timed until the workers have
   acknowledged the last one;
2. dispatch: N auto-approved refunds (one order each) are proposed with their publish held
   back, then their N dispatch messages are published the way ``dispatch_enqueue`` does and
   timed like the no-ops, until the last one is acknowledged, which with acks_late is after
   its outcome was recorded. This compares like with like: N messages in, N tasks done;
3. end to end: N more refunds proposed one after the other from this process, each publishing
   its dispatch on commit, timed from the first proposal to the last acknowledgement.

Completion is read from the broker (queue and unacknowledged set both empty), never by polling
the database, so measuring adds no commits.

Commits are counted by PostgreSQL itself: ``pg_stat_database.xact_commit`` of a database only
this benchmark uses, read from a connection to another database. A backend publishes its
counters reliably only when it exits (an idle one may sit on them), so every reading is taken
with no session connected to the benchmark's database: workers stopped, this process's
connection closed. Two baselines are subtracted:

- an idle interval with nothing connected (autovacuum, anything else), as a rate;
- the workers' own life cycle (start, warm-up, stop) with no measured work, run once on its
  own, so that connecting, warming up and stopping are not charged to the actions.

The benchmark sets itself up and cleans up: it creates its own database with Django's test
database machinery (and migrates it), starts the sandbox provider and the workers, and drops,
stops and flushes all of it at the end. It needs PostgreSQL and an empty Redis database.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from celery import shared_task

REPO_ROOT = Path(__file__).resolve().parents[2]
QUEUE = "console"  # settings.CELERY_TASK_DEFAULT_QUEUE
UNACKED = "unacked"  # kombu's Redis transport keeps delivered, unacknowledged messages here
REFUND = Decimal("10.00")  # below the EUR auto-approval threshold
CAPTURED = Decimal("100.00")
WARMUP_PER_PROCESS = 10
DRAIN_TIMEOUT_SECONDS = 600.0


@shared_task(name="bench.noop")
def noop() -> None:
    """The bare Celery task the console's dispatch is compared with."""


# --- arguments and environment ------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.bench_dispatch",
        description="Throughput of auto-approved refunds through real workers and the sandbox, next to "
        "bare Celery no-op tasks, and PostgreSQL commits per action.",
    )
    parser.add_argument("--actions", type=int, default=200, help="N (default 200)")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/postgres",
        help="a PostgreSQL server; the benchmark creates and drops its own database there "
        "(default $DATABASE_URL, else postgres://postgres@127.0.0.1:5432/postgres)",
    )
    parser.add_argument(
        "--broker-url",
        default=os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/13"),
        help="a Redis database for this run alone: it must be empty, and is flushed at the end "
        "(default $BENCH_BROKER_URL, else redis://127.0.0.1:6379/13)",
    )
    parser.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument(
        "--pool", choices=("solo", "prefork"), default="solo", help="Celery pool, as make start runs it (default solo)"
    )
    parser.add_argument("--concurrency", type=int, default=4, help="child processes per prefork worker (default 4)")
    parser.add_argument("--idle-seconds", type=float, default=5.0, help="length of the idle baseline (default 5)")
    parser.add_argument("--keep-logs", action="store_true", help="keep the worker and sandbox logs")
    args = parser.parse_args(argv)
    if args.actions < 1 or args.workers < 1 or args.concurrency < 1:
        parser.error("--actions, --workers and --concurrency must be at least 1")
    if not args.database_url.startswith(("postgres://", "postgresql://")):
        parser.error("--database-url must point at PostgreSQL: commits are counted from its statistics")
    return args


def configure_django(args: argparse.Namespace, workdir: Path) -> None:
    """Point this process's settings at the benchmark's database and broker, then set Django up."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "console.settings"
    os.environ["DATABASE_URL"] = args.database_url
    # One connection for all the proposals, opened once: no pool needed in this process.
    os.environ["DATABASE_POOL"] = "0"
    os.environ["DATABASE_TEST_NAME"] = f"bench_console_{os.getpid()}"
    os.environ["CELERY_BROKER_URL"] = args.broker_url
    os.environ["CONSOLE_DATA_DIR"] = str(workdir)
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    import django

    django.setup()


# --- PostgreSQL's own commit counter ---------------------------------------------------------------


class CommitCounter:
    """Reads ``pg_stat_database.xact_commit`` of one database from a connection to another one,
    so that reading it adds nothing to what it reads."""

    def __init__(self, settings_dict: dict[str, Any]) -> None:
        import psycopg

        self.database = settings_dict["NAME"]
        self._connection = psycopg.connect(
            dbname="postgres" if self.database != "postgres" else "template1",
            user=settings_dict.get("USER") or None,
            password=settings_dict.get("PASSWORD") or None,
            host=settings_dict.get("HOST") or None,
            port=settings_dict.get("PORT") or None,
            autocommit=True,
        )

    def _one(self, sql: str) -> int:
        row = self._connection.execute(sql, [self.database]).fetchone()
        assert row is not None, f"no statistics for database {self.database}"
        return int(row[0])

    def quiescent(self, timeout: float = 60.0) -> tuple[int, float]:
        """The counter once no session is connected to the database (each one published its
        counters as it exited), and when it was read."""
        deadline = time.monotonic() + timeout
        while self._one("SELECT count(*) FROM pg_stat_activity WHERE datname = %s"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"sessions still connected to {self.database} after {timeout:.0f}s")
            time.sleep(0.05)
        return self._one("SELECT xact_commit FROM pg_stat_database WHERE datname = %s"), time.monotonic()

    def close(self) -> None:
        self._connection.close()


# --- processes -------------------------------------------------------------------------------------


class Workers:
    """``celery worker`` processes with the console's settings and the no-op task."""

    def __init__(self, *, args: argparse.Namespace, workdir: Path, env: dict[str, str]) -> None:
        self.log_paths: list[Path] = []
        self.processes: list[subprocess.Popen[bytes]] = []
        for index in range(args.workers):
            log_path = workdir / f"worker-{index}-{uuid.uuid4().hex[:6]}.log"
            command = [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "console",
                "worker",
                "--pool",
                args.pool,
                "--concurrency",
                str(args.concurrency if args.pool == "prefork" else 1),
                "--loglevel",
                "WARNING",
                "--hostname",
                f"bench{index}-{uuid.uuid4().hex[:6]}@%h",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "--include",
                "tests.bench.bench_dispatch",
            ]
            with open(log_path, "ab") as log:
                # A session of its own, so that stopping it also stops a prefork pool's children.
                process = subprocess.Popen(
                    command, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
            self.log_paths.append(log_path)
            self.processes.append(process)

    @property
    def alive(self) -> bool:
        return all(process.poll() is None for process in self.processes)

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)

    def log_tail(self) -> str:
        return "\n".join(path.read_text(errors="replace")[-2000:] for path in self.log_paths if path.exists())


def worker_environment(*, settings_dict: dict[str, Any], broker_url: str, sandbox_url: str) -> dict[str, str]:
    credentials = settings_dict["USER"] + (f":{settings_dict['PASSWORD']}" if settings_dict.get("PASSWORD") else "")
    host = settings_dict.get("HOST") or "127.0.0.1"
    port = settings_dict.get("PORT") or 5432
    return {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "DJANGO_SETTINGS_MODULE": "console.settings",
        "DATABASE_URL": f"postgres://{credentials}@{host}:{port}/{settings_dict['NAME']}",
        "DATABASE_POOL": "1",  # the production default: psycopg's pool
        "CELERY_BROKER_URL": broker_url,
        "PROVIDER_API_BASE": sandbox_url,
        "CONSOLE_FAULT_POINTS": "",
    }


# --- the broker tells when work is done -----------------------------------------------------------


def wait_drained(broker: Any, *, workers: Workers, timeout: float = DRAIN_TIMEOUT_SECONDS) -> float:
    """Wait until the queue is empty and no message is delivered but unacknowledged.

    Returns the moment it first saw both empty. Two empty readings in a row are required: a
    message popped from the queue is written to the unacknowledged set a moment later.
    """
    deadline = time.monotonic() + timeout
    first_empty: float | None = None
    while True:
        now = time.monotonic()
        if broker.llen(QUEUE) == 0 and broker.hlen(UNACKED) == 0:
            if first_empty is not None:
                return first_empty
            first_empty = now
        else:
            first_empty = None
        if not workers.alive:
            raise RuntimeError(f"a worker died:\n{workers.log_tail()}")
        if now > deadline:
            raise RuntimeError(f"the workers did not drain the queue within {timeout:.0f}s:\n{workers.log_tail()}")
        time.sleep(0.002)


def timed(run: Callable[[], None], *, broker: Any, workers: Workers) -> float:
    """Seconds from the start of ``run`` until the workers have acknowledged all it published."""
    started = time.monotonic()
    run()
    return wait_drained(broker, workers=workers) - started


# --- the console's side ---------------------------------------------------------------------------


@dataclass
class Fixture:
    proposer: Any
    orders: list[Any]


def seed(*, count: int, sandbox: Any, label: str) -> Fixture:
    """``count`` paid EUR orders with one refund request each, and their charges at the sandbox.

    One order per action: an approval is bound to its order's version, which every reservation
    bumps, so refunds on one order are dispatched one approval at a time by design.
    """
    from datetime import timedelta

    from django.contrib.auth.models import User
    from django.utils import timezone

    from actions.models import Agent, Order, RefundRequest
    from actions.services import Actor

    owner, _ = User.objects.get_or_create(username="bench.owner")
    agent, _ = Agent.objects.get_or_create(name="bench-agent", defaults={"owner": owner, "scopes": ["refund"]})
    paid_at = timezone.now() - timedelta(days=1)
    orders = Order.objects.bulk_create(
        Order(
            number=f"{label}-{index}",
            customer_name="Bench Customer",
            currency="EUR",
            captured_amount=CAPTURED,
            charge_reference=f"ch_{label}_{index}",
            paid_at=paid_at,
        )
        for index in range(count)
    )
    RefundRequest.objects.bulk_create(RefundRequest(order=order, number=1) for order in orders)
    for order in orders:
        sandbox.seed_charge(order.charge_reference, int(CAPTURED * 100), "eur")
    return Fixture(proposer=Actor.for_agent(agent), orders=orders)


def propose_all(fixture: Fixture) -> None:
    """Propose one auto-approved refund per order; each commit publishes its dispatch."""
    from actions.models import ActionStatus
    from actions.services import action_propose_refund

    for order in fixture.orders:
        result = action_propose_refund(
            order_number=order.number,
            request_number=1,
            amount=str(REFUND),
            currency="EUR",
            reason_code="damaged",
            proposer=fixture.proposer,
        )
        if result.action.status != ActionStatus.AUTHORIZED:
            raise RuntimeError(f"{result.action.action_id} was not auto-approved: {result.action.status}")


def propose_held_back(fixture: Fixture) -> list[int]:
    """Propose as ``propose_all`` does, keeping each on-commit publish instead of sending it."""
    import actions.publish

    held: list[int] = []
    publish = actions.publish.dispatch_enqueue
    actions.publish.dispatch_enqueue = held.append  # type: ignore[assignment]  # looked up at call time
    try:
        propose_all(fixture)
    finally:
        actions.publish.dispatch_enqueue = publish
    return held


def publish_dispatches(action_pks: list[int]) -> None:
    from actions.publish import dispatch_enqueue

    for action_pk in action_pks:
        dispatch_enqueue(action_pk)


def publish_noops(count: int) -> None:
    for _ in range(count):
        noop.delay()


def verify(fixtures: list[Fixture], sandbox: Any) -> list[str]:
    """Every action SUCCEEDED with one refund at the sandbox, and every order's money adds up."""
    from actions.models import Action, ActionStatus, Order

    problems = []
    numbers = [order.number for fixture in fixtures for order in fixture.orders]
    actions = list(Action.objects.filter(order__number__in=numbers))
    refunds: dict[str, list[dict[str, Any]]] = {}
    for refund in sandbox.ledger():
        refunds.setdefault(refund["metadata"].get("action_id", ""), []).append(refund)
    if len(actions) != len(numbers):
        problems.append(f"{len(actions)} actions for {len(numbers)} orders")
    for action in actions:
        found = refunds.get(action.action_id, [])
        if action.status != ActionStatus.SUCCEEDED:
            problems.append(f"{action.action_id} is {action.status}")
        if len(found) != 1 or found[0]["id"] != action.provider_reference or found[0]["amount"] != 1000:
            problems.append(f"{action.action_id}: {len(found)} refunds at the sandbox")
    for order in Order.objects.filter(number__in=numbers):
        if (order.refunded_amount, order.reserved_amount) != (REFUND, 0):
            problems.append(f"order {order.number}: refunded {order.refunded_amount}, reserved {order.reserved_amount}")
    return problems


# --- the run --------------------------------------------------------------------------------------


@dataclass
class Measured:
    n: int
    noop_seconds: float
    dispatch_seconds: float
    end_to_end_seconds: float
    proposing_seconds: float
    background_rate: float
    lifecycle_commits: float
    run_commits: float

    @property
    def commits_per_action(self) -> float:
        # The run proposed and dispatched 2N actions: N held back, N end to end.
        return (self.run_commits - self.lifecycle_commits) / (2 * self.n)


def start_warm_workers(
    *, args: argparse.Namespace, workdir: Path, env: dict[str, str], broker: Any, warm: Fixture
) -> Workers:
    """Workers whose every process has imported everything and opened its database pool."""
    workers = Workers(args=args, workdir=workdir, env=env)
    publish_noops(len(warm.orders))
    wait_drained(broker, workers=workers, timeout=120)
    propose_all(warm)
    wait_drained(broker, workers=workers)
    return workers


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="bench_dispatch_"))
    configure_django(args, workdir)

    import redis
    import requests
    from django.db import connection

    from tests.processes import SandboxProcess
    from tests.providers.sandbox_client import SandboxClient

    broker = redis.Redis.from_url(args.broker_url)
    if broker.dbsize():
        print(f"refusing to run: the broker database {args.broker_url} is not empty (it is flushed at the end)")
        return 2

    n = args.actions
    processes = args.workers * (args.concurrency if args.pool == "prefork" else 1)
    warm_count = WARMUP_PER_PROCESS * processes
    original_name = connection.settings_dict["NAME"]
    sandbox_process = SandboxProcess(workdir)
    workers: Workers | None = None
    counter: CommitCounter | None = None
    database_created = False
    ok = False
    session = requests.Session()
    try:
        print(f"setting up: database, migrations, sandbox, {2 * n + 2 * warm_count} orders ...", flush=True)
        connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
        database_created = True
        sandbox_process.start()
        sandbox = SandboxClient(sandbox_process.url, session)
        warm_alone = seed(count=warm_count, sandbox=sandbox, label="warm1")
        warm_measured = seed(count=warm_count, sandbox=sandbox, label="warm2")
        held_back = seed(count=n, sandbox=sandbox, label="held")
        end_to_end = seed(count=n, sandbox=sandbox, label="e2e")
        counter = CommitCounter(connection.settings_dict)
        env = worker_environment(
            settings_dict=connection.settings_dict, broker_url=args.broker_url, sandbox_url=sandbox_process.url
        )
        connection.close()

        print(f"idle baseline: {args.idle_seconds:.0f} s with nothing connected ...", flush=True)
        idle_start, idle_started = counter.quiescent()
        time.sleep(args.idle_seconds)
        idle_end, idle_ended = counter.quiescent()
        background_rate = (idle_end - idle_start) / (idle_ended - idle_started)

        print("worker life cycle alone: start, warm up, stop ...", flush=True)
        workers = start_warm_workers(args=args, workdir=workdir, env=env, broker=broker, warm=warm_alone)
        workers.stop()
        connection.close()
        lifecycle_end, lifecycle_ended = counter.quiescent()
        lifecycle_commits = lifecycle_end - idle_end - background_rate * (lifecycle_ended - idle_ended)

        print(f"the same life cycle with {n} no-ops, {n} dispatches and {n} refunds end to end ...", flush=True)
        workers = start_warm_workers(args=args, workdir=workdir, env=env, broker=broker, warm=warm_measured)
        noop_seconds = timed(lambda: publish_noops(n), broker=broker, workers=workers)
        held = propose_held_back(held_back)
        dispatch_seconds = timed(lambda: publish_dispatches(held), broker=broker, workers=workers)
        proposing: list[float] = []

        def propose_end_to_end() -> None:
            started = time.monotonic()
            propose_all(end_to_end)
            proposing.append(time.monotonic() - started)

        end_to_end_seconds = timed(propose_end_to_end, broker=broker, workers=workers)
        workers.stop()
        connection.close()
        run_end, run_ended = counter.quiescent()
        run_commits = run_end - lifecycle_end - background_rate * (run_ended - lifecycle_ended)

        result = Measured(
            n=n,
            noop_seconds=noop_seconds,
            dispatch_seconds=dispatch_seconds,
            end_to_end_seconds=end_to_end_seconds,
            proposing_seconds=proposing[0],
            background_rate=background_rate,
            lifecycle_commits=lifecycle_commits,
            run_commits=run_commits,
        )
        problems = verify([held_back, end_to_end], sandbox)
        report(args=args, database=counter.database, result=result, problems=problems)
        ok = not problems
        return 0 if ok else 1
    finally:
        if workers is not None:
            workers.stop()
            if not ok:
                print(f"--- worker logs (tail) ---\n{workers.log_tail()}")
        sandbox_process.stop()
        session.close()
        if counter is not None:
            counter.close()
        if database_created:
            connection.creation.destroy_test_db(original_name, verbosity=0)
        broker.flushdb()
        if args.keep_logs or not ok:
            print(f"logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def report(*, args: argparse.Namespace, database: str, result: Measured, problems: list[str]) -> None:
    n = result.n
    noop_rate = n / result.noop_seconds
    dispatch_rate = n / result.dispatch_seconds
    end_to_end_rate = n / result.end_to_end_seconds
    ratio = dispatch_rate / noop_rate
    per_action = result.commits_per_action
    if args.pool == "prefork":
        shape = f"{args.workers} x celery prefork (concurrency {args.concurrency})"
    else:
        shape = f"{args.workers} x celery solo"
    print(
        f"""
Effect console: dispatch benchmark, N = {n}
  workers      {shape}, prefetch 1, acks_late, Redis {args.broker_url}; sandbox provider; no beat
  bare Celery  {n} no-op tasks in {result.noop_seconds:.2f} s = {noop_rate:.1f} tasks/s
  dispatch     {n} authorized refunds in {result.dispatch_seconds:.2f} s = {dispatch_rate:.1f} actions/s
               (N dispatch messages published like the no-ops; done = acknowledged = outcome recorded)
  ratio        {ratio:.2f} of bare Celery (target >= 0.50: {"met" if ratio >= 0.5 else "NOT met"})
  end to end   {n} refunds from proposal to SUCCEEDED in {result.end_to_end_seconds:.2f} s = {end_to_end_rate:.1f}/s
               (proposed one after another by this one process, which alone took {result.proposing_seconds:.2f} s)
  commits      {per_action:.2f} per action (target 3: intent+authorization, reservation+SUBMITTING, outcome:
               {"met" if round(per_action, 1) <= 3.0 else "NOT met"})

How the commits were counted
  PostgreSQL's own counter, pg_stat_database.xact_commit, for database {database} (created for this run
  and dropped after it), read from a connection to another database so that reading adds nothing. A
  backend publishes its counters when it exits, so every reading waits until no session is connected.
  1. idle interval, nothing connected: {result.background_rate:.3f} commits/s (autovacuum, anything else),
     subtracted pro rata from the intervals below;
  2. the workers' life cycle alone (start, warm-up, stop): {result.lifecycle_commits:.1f} commits;
  3. the same life cycle with the measured work ({2 * n} refunds, {n} no-ops): {result.run_commits:.1f} commits.
  ({result.run_commits:.1f} - {result.lifecycle_commits:.1f}) / {2 * n} refunds = {per_action:.2f} commits per action.
  PostgreSQL counts every transaction, a lone read outside a transaction block included, so this is
  everything the console committed per action, not only its writes.
"""
    )
    if problems:
        print(f"FAILED: {len(problems)} problems, e.g.:")
        for problem in problems[:10]:
            print(f"  {problem}")
    else:
        print(f"verified: {2 * n} refunds SUCCEEDED, one refund each at the sandbox, every order's money adds up")


if __name__ == "__main__":
    sys.exit(main())
