"""Dispatch throughput, worker CPU, statements and PostgreSQL commits per action, next to bare Celery.

    python -m tests.bench.bench_dispatch --actions 300 --repeat 3
    python -m tests.bench.bench_dispatch --actions 300 --latency-ms 200 --pool threads --concurrency 16
    python -m tests.bench.bench_dispatch --actions 300 --repeat 3 --dbos  # and DBOS (tests/bench/bench_dbos.py)

Not a pytest test (pytest only collects ``test_*.py``): it measures and prints, and exits
non-zero only when the run itself went wrong (an action not SUCCEEDED, a refund missing or
doubled at the sandbox, an order whose money does not add up).

Each repetition runs, with the same Redis broker and the same Celery workers and settings:

1. bare Celery: ``--noops`` no-op tasks published from this process, timed until the workers
   have acknowledged the last one (several seconds, so the rate is stable);
2. dispatch: N auto-approved refunds (one order each) are proposed with their publish held
   back, then their N dispatch messages are published the way ``dispatch_enqueue`` does and
   timed like the no-ops, until the last one is acknowledged, which with acks_late is after
   its outcome was recorded. This compares like with like: N messages in, N tasks done;
3. end to end: N more refunds proposed one after the other from this process, each publishing
   its dispatch on commit, timed from the first proposal to the last acknowledgement.

What is measured, per repetition, and printed with the min and the median over repetitions:

- rates, from the broker: completion is read from the broker (queue and unacknowledged set
  both empty), never by polling the database, so measuring adds no commits;
- worker CPU: user + system time of every worker process (and its pool children) read from
  /proc before and after phases 1 and 2, divided by the tasks of that phase;
- statements: SQL statements sent through Django (an execute wrapper; BEGIN and COMMIT are not
  statements here, commits are counted below): the proposals of phase 2 in this process, plus
  the workers' claims and records during phase 2 (each worker process counts its own and
  writes the total after every task);
- commits, counted by PostgreSQL itself: ``pg_stat_database.xact_commit`` of a database only
  this benchmark uses, read from a connection to another database. A backend publishes its
  counters reliably only when it exits (an idle one may sit on them), so every reading is taken
  with no session connected to the benchmark's database: workers stopped, this process's
  connection closed. Two baselines are subtracted: an idle interval with nothing connected
  (autovacuum, anything else), as a rate; and the workers' own life cycle (start, warm-up,
  stop) with no measured work, run once on its own.

``--dbos`` adds, to every repetition, the same refund as a DBOS durable workflow against the same
sandbox and PostgreSQL server (``tests/bench/bench_dbos.py``; it needs
``tests/bench/requirements-bench.txt`` and is skipped with a message without it).

``--latency-ms`` makes the sandbox answer every measured refund after that delay (its ``slow``
fault), as a real provider would; ``--pool threads --concurrency C`` is the worker profile for
that case (docs/operators/scaling.md, "Worker profiles"): the database pool of each worker is sized to C + 2, as
every call in flight holds a pooled connection until its task ends.

The benchmark sets itself up and cleans up: it creates its own database with Django's test
database machinery (and migrates it), starts the sandbox provider and the workers, and drops,
stops and flushes all of it at the end. It needs PostgreSQL and an empty Redis database.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from celery import shared_task

from tests.bench import bench_dbos
from tests.bench.dispatcher_profile import PROFILE_ENV, Completion, Dispatchers
from tests.bench.sessions import logs_tail, sessions_stop

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


# --- in the workers: statements per process --------------------------------------------------------

COUNTERS_ENV = "BENCH_COUNTERS_DIR"


def _install_statement_counter(directory: Path) -> None:
    """Count the SQL statements this worker process sends, and write the total after each task.

    Installed only in the benchmark's workers (they import this module with ``--include`` and
    get ``BENCH_COUNTERS_DIR``). Each thread counts in its own slot, so the threads pool needs
    no lock; the total is written with one pwrite into a file named after the process.
    """
    from celery import signals
    from django.db.backends.signals import connection_created

    counts: dict[int, int] = {}
    files: dict[int, int] = {}

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        ident = threading.get_ident()
        counts[ident] = counts.get(ident, 0) + 1
        return execute(sql, params, many, context)

    def on_connection(sender: Any, connection: Any, **kwargs: Any) -> None:
        if count not in connection.execute_wrappers:
            connection.execute_wrappers.append(count)

    def on_task_done(**kwargs: Any) -> None:
        pid = os.getpid()
        if pid not in files:
            files[pid] = os.open(directory / f"statements-{pid}", os.O_WRONLY | os.O_CREAT, 0o644)
        os.pwrite(files[pid], f"{sum(counts.values()):20d}".encode(), 0)

    connection_created.connect(on_connection, weak=False)
    signals.task_postrun.connect(on_task_done, weak=False)


if os.environ.get(COUNTERS_ENV):
    _install_statement_counter(Path(os.environ[COUNTERS_ENV]))


def worker_statements(directory: Path) -> int:
    """The statements all worker processes have sent so far."""
    return sum(int(path.read_text() or 0) for path in directory.glob("statements-*"))


# --- worker CPU, from /proc ------------------------------------------------------------------------

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may contain spaces; the fields after its closing parenthesis do not.
    return text[text.rindex(")") + 2 :].split()


def process_tree_cpu(roots: list[int]) -> float:
    """CPU seconds (user + system) used so far by ``roots`` and every live descendant."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _proc_stat(int(entry.name))
        if fields is None:
            continue
        parents[int(entry.name)] = int(fields[1])
        ticks[int(entry.name)] = int(fields[11]) + int(fields[12])
    wanted = set(roots)
    grew = True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in wanted and pid not in wanted:
                wanted.add(pid)
                grew = True
    return sum(ticks.get(pid, 0) for pid in wanted) / CLOCK_TICKS


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
    parser.add_argument("--noops", type=int, default=3000, help="bare Celery no-op tasks per repetition (default 3000)")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions; min and median are printed (default 3)")
    parser.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument(
        "--pool",
        choices=("solo", "prefork", "threads"),
        default="solo",
        help="Celery pool, as make start runs it (default solo)",
    )
    parser.add_argument(
        "--concurrency", type=int, default=4, help="child processes (prefork) or threads per worker (default 4)"
    )
    parser.add_argument(
        "--latency-ms",
        type=int,
        default=0,
        help="the sandbox answers each measured refund after this delay (its slow fault; default 0)",
    )
    parser.add_argument(
        "--dispatchers",
        type=int,
        default=0,
        help="the dispatcher profile: this many `manage.py dispatcher` processes, each with --concurrency "
        "calls in flight, do the dispatch and end-to-end phases (tests/bench/dispatcher_profile.py; default 0: "
        "a Celery task per action)",
    )
    parser.add_argument(
        "--batch", type=int, default=16, help="with --dispatchers: actions claimed per transaction (default 16)"
    )
    parser.add_argument(
        "--dbos",
        action="store_true",
        help="also run the refund as a DBOS workflow in every repetition (tests/bench/bench_dbos.py)",
    )
    parser.add_argument(
        "--dbos-workers", type=int, default=None, help="DBOS processes (default: --dispatchers, else --workers)"
    )
    parser.add_argument(
        "--dbos-threads",
        type=int,
        default=None,
        help="threads per DBOS process (default: --concurrency with --pool threads or --dispatchers, else 1)",
    )
    parser.add_argument("--idle-seconds", type=float, default=5.0, help="length of the idle baseline (default 5)")
    parser.add_argument("--keep-logs", action="store_true", help="keep the worker and sandbox logs")
    parser.add_argument(
        "--profile-dispatchers",
        metavar="DIR",
        help="with --dispatchers: profile each dispatcher process's CPU by function (yappi, from "
        "tests/bench/requirements-bench.txt) and write dispatcher-<pid>.pstat files to DIR; read them "
        "with `python -m pstats`. The profiler slows the dispatchers: its rates are not the benchmark's",
    )
    args = parser.parse_args(argv)
    if args.dispatchers < 0 or args.batch < 1:
        parser.error("--dispatchers must not be negative and --batch must be at least 1")
    if args.profile_dispatchers and not args.dispatchers:
        parser.error("--profile-dispatchers needs --dispatchers")
    if args.profile_dispatchers and importlib.util.find_spec("yappi") is None:
        parser.error("--profile-dispatchers needs yappi: .venv/bin/pip install -r tests/bench/requirements-bench.txt")
    if min(args.actions, args.noops, args.repeat, args.workers, args.concurrency) < 1:
        parser.error("--actions, --noops, --repeat, --workers and --concurrency must be at least 1")
    # DBOS gets the console's shape: as many processes and calls in flight per process.
    args.dbos_workers = args.dbos_workers or args.dispatchers or args.workers
    args.dbos_threads = args.dbos_threads or (args.concurrency if args.pool == "threads" or args.dispatchers else 1)
    if args.latency_ms < 0:
        parser.error("--latency-ms must not be negative")
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
    # The benchmark's one agent proposes every refund of the run; the agent's daily cap on
    # auto-approved amounts (EUR 250 by default) would leave all but the first 25 to a
    # manager. The cap is still checked on every proposal (its statements are counted), it is only
    # set out of reach.
    os.environ.setdefault("AUTO_APPROVAL_AGENT_DAILY_AMOUNTS", "EUR:1000000000")
    import django

    django.setup()
    if args.dispatchers:
        from django.conf import settings

        # The dispatcher processes find the authorized actions themselves (DISPATCH_PUBLISH).
        settings.DISPATCH_PUBLISH = False


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
        # The dispatcher profile's processes and the database readings that tell when they are done.
        self.dispatchers: Dispatchers | None = None
        self.completion: Completion | None = None
        self.completion_readings = 0
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
                str(args.concurrency if args.pool != "solo" else 1),
                "--loglevel",
                os.environ.get("BENCH_WORKER_LOGLEVEL", "WARNING"),
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
    def pids(self) -> list[int]:
        return [process.pid for process in self.processes] + (self.dispatchers.pids if self.dispatchers else [])

    def cpu_seconds(self) -> float:
        return process_tree_cpu(self.pids)

    @property
    def alive(self) -> bool:
        dispatchers_alive = self.dispatchers.alive if self.dispatchers else True
        return dispatchers_alive and all(process.poll() is None for process in self.processes)

    def stop(self) -> None:
        if self.dispatchers is not None:
            self.dispatchers.stop()
        if self.completion is not None:
            self.completion_readings = self.completion.readings
            self.completion.close()
            self.completion = None
        sessions_stop(self.processes)

    def log_tail(self) -> str:
        tail = logs_tail(self.log_paths)
        return tail + ("\n" + self.dispatchers.log_tail() if self.dispatchers else "")


def worker_environment(
    *, settings_dict: dict[str, Any], broker_url: str, sandbox_url: str, counters: Path, pool_max: int
) -> dict[str, str]:
    credentials = settings_dict["USER"] + (f":{settings_dict['PASSWORD']}" if settings_dict.get("PASSWORD") else "")
    host = settings_dict.get("HOST") or "127.0.0.1"
    port = settings_dict.get("PORT") or 5432
    return {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "DJANGO_SETTINGS_MODULE": "console.settings",
        "DATABASE_URL": f"postgres://{credentials}@{host}:{port}/{settings_dict['NAME']}",
        "DATABASE_POOL": "1",  # the production default: psycopg's pool
        # Every task in flight holds a pooled connection until it ends: a pool smaller than the
        # threads silently caps the calls in flight (PERFORMANCE.md).
        "DATABASE_POOL_MAX": str(pool_max),
        COUNTERS_ENV: str(counters),
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
    from actions.kinds.refund.proposal import action_propose_refund
    from actions.models import ActionStatus

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
    import actions.foundation.publish

    held: list[int] = []
    publish = actions.foundation.publish.dispatch_enqueue
    actions.foundation.publish.dispatch_enqueue = held.append  # type: ignore[assignment]  # looked up at call time
    try:
        propose_all(fixture)
    finally:
        actions.foundation.publish.dispatch_enqueue = publish
    return held


@contextmanager
def counting_statements() -> Iterator[list[int]]:
    """Count the SQL statements this process sends through Django inside the block."""
    from django.db import connection

    counted = [0]

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        counted[0] += 1
        return execute(sql, params, many, context)

    with connection.execute_wrapper(count):
        yield counted


def publish_dispatches(action_pks: list[int]) -> None:
    from actions.foundation.publish import dispatch_enqueue

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
class Repetition:
    n: int
    noops: int
    noop_seconds: float
    noop_cpu: float
    dispatch_seconds: float
    dispatch_cpu: float
    proposal_statements: int
    worker_statements: int
    end_to_end_seconds: float
    proposing_seconds: float
    run_commits: float = 0.0  # the dispatcher profile's completion readings already subtracted

    @property
    def noop_rate(self) -> float:
        return self.noops / self.noop_seconds

    @property
    def dispatch_rate(self) -> float:
        return self.n / self.dispatch_seconds

    @property
    def ratio(self) -> float:
        return self.dispatch_rate / self.noop_rate

    @property
    def noop_cpu_ms(self) -> float:
        return 1000 * self.noop_cpu / self.noops

    @property
    def dispatch_cpu_ms(self) -> float:
        return 1000 * self.dispatch_cpu / self.n

    @property
    def statements_per_action(self) -> float:
        return (self.proposal_statements + self.worker_statements) / self.n

    @property
    def end_to_end_rate(self) -> float:
        return self.n / self.end_to_end_seconds


@dataclass
class Measured:
    n: int
    background_rate: float
    lifecycle_commits: float
    repetitions: list[Repetition] = field(default_factory=list)

    def commits_per_action(self, repetition: Repetition) -> float:
        # Each repetition proposed and dispatched 2N actions: N held back, N end to end.
        return (repetition.run_commits - self.lifecycle_commits) / (2 * self.n)


def start_warm_workers(
    *, args: argparse.Namespace, workdir: Path, env: dict[str, str], broker: Any, warm: Fixture
) -> Workers:
    """Workers whose every process (and thread) has imported everything and opened its database pool."""
    workers = Workers(args=args, workdir=workdir, env=env)
    publish_noops(len(warm.orders))
    wait_drained(broker, workers=workers, timeout=120)
    if args.dispatchers:
        from django.db import connection

        if args.profile_dispatchers:
            Path(args.profile_dispatchers).mkdir(parents=True, exist_ok=True)
            env = {**env, PROFILE_ENV: str(Path(args.profile_dispatchers).resolve())}
        workers.dispatchers = Dispatchers(
            count=args.dispatchers, concurrency=args.concurrency, batch=args.batch, workdir=workdir, env=env
        )
        workers.completion = Completion(connection.settings_dict)
        propose_all(warm)
        workers.completion.wait(label_of(warm), len(warm.orders), dispatchers=workers.dispatchers)
        return workers
    propose_all(warm)
    wait_drained(broker, workers=workers)
    return workers


def run_repetition(
    *,
    args: argparse.Namespace,
    workdir: Path,
    env: dict[str, str],
    broker: Any,
    sandbox: Any,
    counters: Path,
    warm: Fixture,
    held_back: Fixture,
    end_to_end: Fixture,
) -> tuple[Workers, Repetition]:
    n = args.actions
    workers = start_warm_workers(args=args, workdir=workdir, env=env, broker=broker, warm=warm)
    # A repetition that fails midway must not leave its workers (and dispatchers) running
    # against a database that is about to be dropped.
    try:
        cpu_before = workers.cpu_seconds()
        noop_seconds = timed(lambda: publish_noops(args.noops), broker=broker, workers=workers)
        noop_cpu = workers.cpu_seconds() - cpu_before

        dispatchers, completion = workers.dispatchers, workers.completion
        if dispatchers is not None:
            dispatchers.pause()  # the N actions wait authorized, as the Celery profile's N held-back messages
        with counting_statements() as proposal_statements:
            held = propose_held_back(held_back)
        if args.latency_ms:
            # Every measured refund (the held-back ones, then the end-to-end ones) answers late.
            sandbox.fault(mode="slow", sleep_seconds=args.latency_ms / 1000, times=2 * n)
        time.sleep(0.2)  # the warm-up's last task has written its statement count
        statements_before = worker_statements(counters)
        cpu_before = workers.cpu_seconds()
        if dispatchers is not None and completion is not None:
            started = time.monotonic()
            dispatchers.resume()
            dispatch_seconds = completion.wait(label_of(held_back), n, dispatchers=dispatchers) - started
        else:
            dispatch_seconds = timed(lambda: publish_dispatches(held), broker=broker, workers=workers)
        dispatch_cpu = workers.cpu_seconds() - cpu_before
        time.sleep(0.2)
        statements = worker_statements(counters) - statements_before

        proposing: list[float] = []

        def propose_end_to_end() -> None:
            started = time.monotonic()
            propose_all(end_to_end)
            proposing.append(time.monotonic() - started)

        if dispatchers is not None and completion is not None:
            started = time.monotonic()
            propose_end_to_end()
            end_to_end_seconds = completion.wait(label_of(end_to_end), n, dispatchers=dispatchers) - started
        else:
            end_to_end_seconds = timed(propose_end_to_end, broker=broker, workers=workers)
        return workers, Repetition(
            n=n,
            noops=args.noops,
            noop_seconds=noop_seconds,
            noop_cpu=noop_cpu,
            dispatch_seconds=dispatch_seconds,
            dispatch_cpu=dispatch_cpu,
            proposal_statements=proposal_statements[0],
            worker_statements=statements,
            end_to_end_seconds=end_to_end_seconds,
            proposing_seconds=proposing[0],
        )
    except BaseException:
        workers.stop()
        raise


def label_of(fixture: Fixture) -> str:
    """The label its orders' numbers start with (``seed``'s ``label``)."""
    return str(fixture.orders[0].number).rsplit("-", 1)[0]


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
    processes = args.workers * (args.concurrency if args.pool != "solo" else 1)
    warm_count = WARMUP_PER_PROCESS * processes
    original_name = connection.settings_dict["NAME"]
    sandbox_process = SandboxProcess(workdir)
    counters = workdir / "counters"
    counters.mkdir()
    workers: Workers | None = None
    counter: CommitCounter | None = None
    dbos: bench_dbos.DbosBench | None = None
    database_created = False
    ok = False
    session = requests.Session()
    try:
        total = warm_count + args.repeat * (warm_count + 2 * n)
        print(f"setting up: database, migrations, sandbox, {total} orders ...", flush=True)
        connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
        database_created = True
        sandbox_process.start()
        sandbox = SandboxClient(sandbox_process.url, session)
        warm_alone = seed(count=warm_count, sandbox=sandbox, label="warm0")
        fixtures = [
            (
                seed(count=warm_count, sandbox=sandbox, label=f"warm{rep}"),
                seed(count=n, sandbox=sandbox, label=f"held{rep}"),
                seed(count=n, sandbox=sandbox, label=f"e2e{rep}"),
            )
            for rep in range(1, args.repeat + 1)
        ]
        counter = CommitCounter(connection.settings_dict)
        env = worker_environment(
            settings_dict=connection.settings_dict,
            broker_url=args.broker_url,
            sandbox_url=sandbox_process.url,
            counters=counters,
            pool_max=max(10, args.concurrency + 2) if args.pool == "threads" else 10,
        )
        connection.close()
        if args.dbos and (reason := bench_dbos.unavailable()):
            print(reason, flush=True)
        elif args.dbos:
            print("DBOS: its databases, schema and orders ...", flush=True)
            dbos = bench_dbos.DbosBench(
                settings_dict=connection.settings_dict,
                workdir=workdir,
                sandbox=sandbox,
                sandbox_url=sandbox_process.url,
                n=n,
                repeat=args.repeat,
                workers=args.dbos_workers,
                threads=args.dbos_threads,
                latency_ms=args.latency_ms,
                cpu_seconds=process_tree_cpu,
            )
            print("DBOS: idle baseline and its processes' life cycle alone ...", flush=True)
            dbos.baselines(args.idle_seconds)

        print(f"idle baseline: {args.idle_seconds:.0f} s with nothing connected ...", flush=True)
        idle_start, idle_started = counter.quiescent()
        time.sleep(args.idle_seconds)
        last, last_read = counter.quiescent()
        background_rate = (last - idle_start) / (last_read - idle_started)

        print("worker life cycle alone: start, warm up, stop ...", flush=True)
        workers = start_warm_workers(args=args, workdir=workdir, env=env, broker=broker, warm=warm_alone)
        workers.stop()
        connection.close()
        reading, read_at = counter.quiescent()
        measured = Measured(
            n=n,
            background_rate=background_rate,
            lifecycle_commits=reading - last - background_rate * (read_at - last_read) - workers.completion_readings,
        )
        last, last_read = reading, read_at

        for rep, (warm, held_back, end_to_end) in enumerate(fixtures, start=1):
            print(
                f"repetition {rep}/{args.repeat}: the same life cycle with {args.noops} no-ops, {n} dispatches "
                f"and {n} refunds end to end ...",
                flush=True,
            )
            workers, repetition = run_repetition(
                args=args,
                workdir=workdir,
                env=env,
                broker=broker,
                sandbox=sandbox,
                counters=counters,
                warm=warm,
                held_back=held_back,
                end_to_end=end_to_end,
            )
            workers.stop()
            connection.close()
            reading, read_at = counter.quiescent()
            repetition.run_commits = (
                reading - last - background_rate * (read_at - last_read) - workers.completion_readings
            )
            last, last_read = reading, read_at
            measured.repetitions.append(repetition)
            if dbos is not None:
                print(f"repetition {rep}/{args.repeat}: DBOS, {n} refund workflows ...", flush=True)
                dbos.run_repetition(rep)

        problems = verify([fixture for _, *pair in fixtures for fixture in pair], sandbox)
        problems += dbos.verify() if dbos is not None else []
        report(args=args, database=counter.database, measured=measured, problems=problems, dbos=dbos)
        ok = not problems
        return 0 if ok else 1
    finally:
        if workers is not None:
            workers.stop()
            if not ok:
                print(f"--- worker logs (tail) ---\n{workers.log_tail()}")
        if dbos is not None:
            if not ok:
                print(f"--- DBOS logs (tail) ---\n{dbos.log_tail()}")
            dbos.close()
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


def _row(label: str, values: list[float], fmt: str, unit: str = "") -> str:
    cells = "".join(f"{value:>10{fmt}}" for value in values)
    return f"  {label:<30}{cells}{min(values):>10{fmt}}{statistics.median(values):>10{fmt}}  {unit}"


def in_flight(args: argparse.Namespace) -> int:
    """How many receiver calls the console's workers can have in flight at once."""
    if args.dispatchers:
        return args.dispatchers * args.concurrency
    return args.workers * (1 if args.pool == "solo" else args.concurrency)


def in_flight_bound(args: argparse.Namespace) -> float | None:
    """The most actions/s those calls allow at the provider's latency (None at zero latency)."""
    return in_flight(args) / (args.latency_ms / 1000) if args.latency_ms else None


def report(
    *,
    args: argparse.Namespace,
    database: str,
    measured: Measured,
    problems: list[str],
    dbos: bench_dbos.DbosBench | None = None,
) -> None:
    n = measured.n
    reps = measured.repetitions
    if args.dispatchers:
        shape = (
            f"{args.dispatchers} x dispatcher process ({args.concurrency} calls in flight, batches of {args.batch}); "
            f"the no-ops on {args.workers} x celery {args.pool}"
        )
    elif args.pool == "solo":
        shape = f"{args.workers} x celery solo"
    else:
        shape = f"{args.workers} x celery {args.pool} (concurrency {args.concurrency})"
    latency = f"{args.latency_ms} ms provider latency (sandbox slow fault)" if args.latency_ms else "zero latency"
    header = "".join(f"{'rep ' + str(i):>10}" for i in range(1, len(reps) + 1))
    commits = [measured.commits_per_action(rep) for rep in reps]
    rows = [
        _row("bare Celery: tasks/s", [rep.noop_rate for rep in reps], ".1f"),
        _row("bare Celery: CPU ms per task", [rep.noop_cpu_ms for rep in reps], ".2f", "(worker processes)"),
        _row("console: actions/s", [rep.dispatch_rate for rep in reps], ".1f", "(recorded)"),
        _row("console: CPU ms per action", [rep.dispatch_cpu_ms for rep in reps], ".2f", "(worker processes)"),
        _row("console: statements per action", [rep.statements_per_action for rep in reps], ".2f", "(see below)"),
        _row("console: commits per action", commits, ".2f", "(xact_commit, lone reads included)"),
        _row("ratio to bare Celery", [rep.ratio for rep in reps], ".3f", "(actions/s / tasks/s)"),
        _row("end to end: refunds/s", [rep.end_to_end_rate for rep in reps], ".1f", "(proposed one by one here)"),
    ]
    bound = in_flight_bound(args)
    if bound is not None:
        # P-d: the calls in flight cap the rate at calls / latency; how close the console comes.
        rows.append(
            _row(
                "share of the in-flight bound",
                [rep.dispatch_rate / bound for rep in reps],
                ".3f",
                f"(actions/s / {bound:.0f}: {in_flight(args)} calls in flight / {args.latency_ms} ms)",
            )
        )
    if dbos is not None:
        rows += dbos.rows(_row, [rep.dispatch_rate for rep in reps])
    proposal = statistics.median(rep.proposal_statements / n for rep in reps)
    worker = statistics.median(rep.worker_statements / n for rep in reps)
    table = "\n".join(rows)
    print(
        f"""
Effect console: dispatch benchmark, N = {n} actions and {args.noops} no-ops per repetition, {latency}
  workers: {shape}, prefetch 1, acks_late, Redis {args.broker_url}; sandbox provider; no beat

  {"":<30}{header}{"min":>10}{"median":>10}
{table}

  statements: SQL statements sent through Django, BEGIN and COMMIT not included: the proposal
  ({proposal:.2f} per action, median, in this process) and the claim and record ({worker:.2f}, in the workers).
  commits: pg_stat_database.xact_commit of {database} (created for this run and dropped after it),
  read with no session connected; idle rate {measured.background_rate:.3f}/s subtracted pro rata, and the
  workers' own life cycle ({measured.lifecycle_commits:.1f} commits) subtracted from each repetition's total
  ({", ".join(f"{rep.run_commits:.0f}" for rep in reps)}), over the 2N = {2 * n} refunds of each repetition.
"""
    )
    if dbos is not None:
        print(f"{dbos.notes()}\n")
    if problems:
        print(f"FAILED: {len(problems)} problems, e.g.:")
        for problem in problems[:10]:
            print(f"  {problem}")
    else:
        count = 2 * n * len(reps) + (len(dbos.orders) if dbos is not None else 0)
        print(f"verified: {count} refunds SUCCEEDED, one refund each at the sandbox, every order's money adds up")


if __name__ == "__main__":
    sys.exit(main())
