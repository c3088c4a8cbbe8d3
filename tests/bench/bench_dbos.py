"""The DBOS side of the dispatch benchmark: the same refund as a DBOS durable workflow.

    python -m tests.bench.bench_dispatch --actions 300 --repeat 3 --dbos

``bench_dispatch --dbos`` runs this next to the console and bare Celery, in every repetition,
against the same sandbox provider and the same PostgreSQL server. DBOS (the ``dbos`` package,
``tests/bench/requirements-bench.txt``) is installed only for the benchmark; without it the
phase is skipped with a message.

What a refund is here, as DBOS's documentation builds one: a workflow whose id is the action id
(``SetWorkflowID``), made of three steps.

1. ``reserve``, a datasource transaction (``SQLAlchemyDatasource.transaction``, READ COMMITTED as
   the console's): the same money check as the console's claim, one conditional UPDATE of the
   order's reserved amount (only while captured - refunded - reserved covers it), and an intent
   row in SUBMITTING. DBOS writes the step's checkpoint in the same transaction.
2. ``send``, a step (``DBOS.step``, no retries: an ambiguous answer is recorded, not re-sent): the
   console's own provider adapter (``StripeProvider``, the stripe SDK with the same options)
   creates the refund at the sandbox with the action id as its idempotency key.
3. ``record``, a datasource transaction: the intent row gets the outcome, fenced on SUBMITTING,
   and a success moves the amount from reserved to refunded.

The application's tables live in a database of their own, and DBOS's system database is another
one on the same server (both created for the run and dropped after it). Each repetition starts
fresh DBOS processes (``--dbos-workers``, each with ``--dbos-threads`` threads that call the
workflow function directly, as an application's request handlers would), warms them up, then
sends every process its share of N refunds and times them until the last process has finished.

Measured as on the console's side: DBOS processes' CPU from /proc; statements (each process counts
what it sends through SQLAlchemy, BEGIN and COMMIT not included); and ``xact_commit`` (plus
``xact_rollback``: DBOS ends its read-only checks with a ROLLBACK) of the two databases, read with
no session connected, less an idle rate and the processes' own life cycle with no measured work.

Run as ``python -m tests.bench.bench_dbos worker ...`` it is one DBOS process (started by the
benchmark, not by hand); only that side imports ``dbos``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import IO, Any

REPO_ROOT = Path(__file__).resolve().parents[2]
REFUND = Decimal("10.00")  # the console's refund, below its auto-approval threshold
CAPTURED = Decimal("100.00")
WARMUP_PER_THREAD = 10
API_KEY = "sk_test_sandbox"  # the console's default PROVIDER_API_KEY; the sandbox accepts any test key

APP_SCHEMA = """
CREATE TABLE orders (
    number text PRIMARY KEY,
    charge_reference text NOT NULL,
    currency text NOT NULL,
    captured_amount numeric(12, 2) NOT NULL,
    refunded_amount numeric(12, 2) NOT NULL DEFAULT 0,
    reserved_amount numeric(12, 2) NOT NULL DEFAULT 0,
    version integer NOT NULL DEFAULT 1,
    CHECK (refunded_amount >= 0 AND reserved_amount >= 0 AND refunded_amount + reserved_amount <= captured_amount)
);
CREATE TABLE refunds (
    action_id text PRIMARY KEY,
    order_number text NOT NULL REFERENCES orders (number),
    amount numeric(12, 2) NOT NULL,
    currency text NOT NULL,
    status text NOT NULL,
    provider_reference text,
    error text,
    created_at timestamptz NOT NULL DEFAULT now(),
    recorded_at timestamptz
);
"""


def unavailable() -> str | None:
    """Why the DBOS phase cannot run here, or None when it can."""
    if importlib.util.find_spec("dbos") is None:
        return (
            "skipping DBOS: the dbos package is not installed "
            "(.venv/bin/pip install -r tests/bench/requirements-bench.txt)"
        )
    return None


def action_id_for(order_number: str) -> str:
    """The console's action id for the first refund request of an order (``refund_action_id``)."""
    return f"refund:order-{order_number}:request-1"


# --- in a DBOS process --------------------------------------------------------------------------


class StatementCounter:
    """SQL statements sent through every SQLAlchemy engine in this process, per database.

    Each thread counts in its own slot (no lock on the hot path); totals are read between phases.
    """

    def __init__(self) -> None:
        import sqlalchemy as sa

        self._counts: dict[tuple[int, str], int] = {}

        def count(conn: Any, cursor: Any, statement: Any, parameters: Any, context: Any, executemany: Any) -> None:
            key = (threading.get_ident(), str(conn.engine.url.database))
            self._counts[key] = self._counts.get(key, 0) + 1

        sa.event.listen(sa.engine.Engine, "before_cursor_execute", count)

    def totals(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for (_, database), value in list(self._counts.items()):
            totals[database] = totals.get(database, 0) + value
        return totals


def register_refund_workflow(*, app_url: str, sandbox_url: str, pool_size: int) -> Callable[..., str]:
    """Register the refund workflow and its steps with DBOS (before launch) and return it."""
    import sqlalchemy as sa
    from dbos import DBOS, SQLAlchemyDatasource

    from actions.providers.base import AmbiguousError, CreateRefund, DefinitiveError, ProviderError
    from actions.providers.stripe_adapter import StripeProvider

    datasource = SQLAlchemyDatasource.create(
        app_url, engine_kwargs={"pool_size": pool_size, "max_overflow": 0}, run_migrations=False
    )
    # The console's adapter with the console's settings (PROVIDER_TIMEOUT_SECONDS defaults to 10).
    provider = StripeProvider(api_key=API_KEY, api_base=sandbox_url, timeout_seconds=10)

    @datasource.transaction(name="reserve", isolation_level="READ COMMITTED")
    def reserve(action_id: str, order_number: str, amount: str, currency: str) -> bool:
        session = datasource.sql_session()
        taken = session.execute(
            sa.text(
                "UPDATE orders SET reserved_amount = reserved_amount + :amount, version = version + 1 "
                "WHERE number = :number AND currency = :currency "
                "AND captured_amount - refunded_amount - reserved_amount >= :amount"
            ),
            {"amount": amount, "number": order_number, "currency": currency},
        )
        if taken.rowcount != 1:  # type: ignore[attr-defined]  # a CursorResult
            return False
        session.execute(
            sa.text(
                "INSERT INTO refunds (action_id, order_number, amount, currency, status) "
                "VALUES (:action_id, :number, :amount, :currency, 'SUBMITTING')"
            ),
            {"action_id": action_id, "number": order_number, "amount": amount, "currency": currency},
        )
        return True

    @DBOS.step(name="send")
    def send(action_id: str, charge: str, amount_minor: int, currency: str) -> dict[str, str]:
        request = CreateRefund(
            idempotency_key=action_id,
            charge=charge,
            amount_minor=amount_minor,
            currency=currency.lower(),
            metadata={"action_id": action_id},
        )
        try:
            refund = provider.create_refund(request)
        except DefinitiveError as error:
            return {"outcome": "FAILED", "error": str(error)}
        except (AmbiguousError, ProviderError) as error:
            return {"outcome": "UNKNOWN", "error": str(error)}
        outcome = {"succeeded": "SUCCEEDED", "pending": "SETTLING", "requires_action": "SETTLING"}
        return {"outcome": outcome.get(str(refund.status), "FAILED"), "reference": refund.id}

    @datasource.transaction(name="record", isolation_level="READ COMMITTED")
    def record(action_id: str, order_number: str, amount: str, answer: dict[str, str]) -> str:
        session = datasource.sql_session()
        outcome = answer["outcome"]
        fenced = session.execute(
            sa.text(
                "UPDATE refunds SET status = :status, provider_reference = :reference, error = :error, "
                "recorded_at = now() WHERE action_id = :action_id AND status = 'SUBMITTING'"
            ),
            {
                "status": outcome,
                "reference": answer.get("reference"),
                "error": answer.get("error"),
                "action_id": action_id,
            },
        )
        if fenced.rowcount != 1:  # type: ignore[attr-defined]  # a CursorResult
            return "NOT_SUBMITTING"
        if outcome in ("SUCCEEDED", "FAILED"):
            booked = "refunded_amount + :amount" if outcome == "SUCCEEDED" else "refunded_amount"
            session.execute(
                sa.text(
                    f"UPDATE orders SET refunded_amount = {booked}, "  # noqa: S608  # one of two fixed fragments
                    "reserved_amount = reserved_amount - :amount WHERE number = :number"
                ),
                {"amount": amount, "number": order_number},
            )
        return outcome

    @DBOS.workflow(name="bench_refund")
    def refund_workflow(order_number: str, charge: str, amount: str, currency: str) -> str:
        action_id = DBOS.workflow_id
        assert action_id is not None
        if not reserve(action_id, order_number, amount, currency):
            return "REFUSED"
        answer = send(action_id, charge, int(Decimal(amount) * 100), currency)
        return record(action_id, order_number, amount, answer)

    return refund_workflow


def dbos_config(*, sys_url: str, executor_id: str, pool_size: int) -> Any:
    from dbos import DBOSConfig

    config: DBOSConfig = {
        "name": "bench-refunds",
        "system_database_url": sys_url,
        "sys_db_pool_size": pool_size,
        "executor_id": executor_id,
        "application_version": "bench",
        "log_level": "WARNING",
    }
    return config


def worker_main(args: argparse.Namespace) -> int:
    """One DBOS process: launch, warm up, then on "go" run its share of the measured refunds."""
    from dbos import DBOS, SetWorkflowID

    orders = json.loads(Path(args.orders).read_text())
    counter = StatementCounter()
    workflow = register_refund_workflow(app_url=args.app_url, sandbox_url=args.sandbox_url, pool_size=args.threads + 2)
    DBOS(config=dbos_config(sys_url=args.sys_url, executor_id=args.executor_id, pool_size=args.threads + 10))
    DBOS.launch()
    pool = ThreadPoolExecutor(max_workers=args.threads)

    def run(order: dict[str, str]) -> str:
        with SetWorkflowID(action_id_for(order["number"])):
            return workflow(order["number"], order["charge"], str(REFUND), "EUR")

    def run_all(batch: list[dict[str, str]]) -> list[str]:
        return list(pool.map(run, batch))

    outcomes = run_all(orders["warm"])
    print(json.dumps({"ready": True, "outcomes": sorted(set(outcomes))}), flush=True)
    for line in sys.stdin:
        if line.strip() != "go":
            break
        before = counter.totals()
        started = time.monotonic()
        outcomes = run_all(orders["measured"])
        seconds = time.monotonic() - started
        after = counter.totals()
        statements = {database: after.get(database, 0) - before.get(database, 0) for database in after}
        print(json.dumps({"seconds": seconds, "statements": statements, "outcomes": outcomes}), flush=True)
    pool.shutdown()
    DBOS.destroy()
    return 0


def setup_main(args: argparse.Namespace) -> int:
    """Create DBOS's system database schema and the datasource's checkpoint table, once."""
    from dbos import DBOS, SQLAlchemyDatasource

    SQLAlchemyDatasource.create(args.app_url)
    DBOS(config=dbos_config(sys_url=args.sys_url, executor_id="bench-setup", pool_size=5))
    DBOS.launch()
    DBOS.destroy()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.bench_dbos", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("setup", "worker"):
        command = commands.add_parser(name)
        command.add_argument("--app-url", required=True)
        command.add_argument("--sys-url", required=True)
        if name == "worker":
            command.add_argument("--sandbox-url", required=True)
            command.add_argument("--threads", type=int, default=1)
            command.add_argument("--executor-id", required=True)
            command.add_argument("--orders", required=True, help="a JSON file: {warm: [...], measured: [...]}")
    args = parser.parse_args(argv)
    return setup_main(args) if args.command == "setup" else worker_main(args)


# --- in the benchmark's process ------------------------------------------------------------------


def _url(settings_dict: dict[str, Any], database: str) -> str:
    user = settings_dict.get("USER") or "postgres"
    password = f":{settings_dict['PASSWORD']}" if settings_dict.get("PASSWORD") else ""
    host = settings_dict.get("HOST") or "127.0.0.1"
    port = settings_dict.get("PORT") or 5432
    return f"postgresql://{user}{password}@{host}:{port}/{database}"


class Counters:
    """``xact_commit`` and ``xact_rollback`` of some databases, read from a connection to another."""

    def __init__(self, admin: Any, databases: list[str]) -> None:
        self._admin = admin
        self.databases = databases

    def quiescent(self, timeout: float = 60.0) -> tuple[dict[str, tuple[int, int]], float]:
        deadline = time.monotonic() + timeout
        while self._admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = ANY(%s)", [self.databases]
        ).fetchone()[0]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"sessions still connected to {self.databases} after {timeout:.0f}s")
            time.sleep(0.05)
        rows = self._admin.execute(
            "SELECT datname, xact_commit, xact_rollback FROM pg_stat_database WHERE datname = ANY(%s)",
            [self.databases],
        ).fetchall()
        return {name: (int(commits), int(rollbacks)) for name, commits, rollbacks in rows}, time.monotonic()


@dataclass
class DbosRepetition:
    n: int
    seconds: float
    cpu: float
    statements: dict[str, int]
    commits: dict[str, float] = field(default_factory=dict)
    rollbacks: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.n / self.seconds

    @property
    def cpu_ms(self) -> float:
        return 1000 * self.cpu / self.n


class DbosProcesses:
    """``--dbos-workers`` DBOS processes, each given its warm-up and its share of the refunds."""

    def __init__(self, bench: DbosBench, warm: list[dict[str, str]], measured: list[dict[str, str]]) -> None:
        self.processes: list[subprocess.Popen[str]] = []
        self.logs: list[Path] = []
        count = bench.workers
        for index in range(count):
            orders = bench.workdir / f"dbos-orders-{index}-{uuid.uuid4().hex[:6]}.json"
            orders.write_text(json.dumps({"warm": warm[index::count], "measured": measured[index::count]}))
            log = bench.workdir / f"dbos-{index}-{uuid.uuid4().hex[:6]}.log"
            command = [
                sys.executable,
                "-m",
                "tests.bench.bench_dbos",
                "worker",
                "--app-url",
                bench.app_url,
                "--sys-url",
                bench.sys_url,
                "--sandbox-url",
                bench.sandbox_url,
                "--threads",
                str(bench.threads),
                "--executor-id",
                f"bench-{index}-{uuid.uuid4().hex[:6]}",
                "--orders",
                str(orders),
            ]
            with open(log, "ab") as stderr:
                process = subprocess.Popen(
                    command,
                    cwd=REPO_ROOT,
                    env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=stderr,
                    text=True,
                )
            self.processes.append(process)
            self.logs.append(log)
        for process in self.processes:
            ready = self._answer(process)
            if ready.get("outcomes") not in ([], ["SUCCEEDED"]):
                raise RuntimeError(f"DBOS warm-up refunds ended {ready.get('outcomes')}:\n{self.log_tail()}")

    @property
    def pids(self) -> list[int]:
        return [process.pid for process in self.processes]

    def _answer(self, process: subprocess.Popen[str]) -> dict[str, Any]:
        stdout: IO[str] | None = process.stdout
        assert stdout is not None
        line = stdout.readline()
        if not line:
            raise RuntimeError(f"a DBOS process exited ({process.wait()}):\n{self.log_tail()}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def go(self) -> list[dict[str, Any]]:
        for process in self.processes:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        return [self._answer(process) for process in self.processes]

    def stop(self) -> None:
        for process in self.processes:
            if process.stdin is not None and not process.stdin.closed:
                process.stdin.close()
        for process in self.processes:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)

    def log_tail(self) -> str:
        return "\n".join(path.read_text(errors="replace")[-3000:] for path in self.logs if path.exists())


class DbosBench:
    """The DBOS phase of ``bench_dispatch``: its databases, its orders, its repetitions."""

    def __init__(
        self,
        *,
        settings_dict: dict[str, Any],
        workdir: Path,
        sandbox: Any,
        sandbox_url: str,
        n: int,
        repeat: int,
        workers: int,
        threads: int,
        latency_ms: int,
        cpu_seconds: Callable[[list[int]], float],
    ) -> None:
        import psycopg

        self.workdir = workdir
        self.sandbox = sandbox
        self.sandbox_url = sandbox_url
        self.n = n
        self.workers = workers
        self.threads = threads
        self.latency_ms = latency_ms
        self.cpu_seconds = cpu_seconds
        self.app_database = f"bench_dbos_app_{os.getpid()}"
        self.sys_database = f"bench_dbos_sys_{os.getpid()}"
        self.app_url = _url(settings_dict, self.app_database)
        self.sys_url = _url(settings_dict, self.sys_database)
        self.repetitions: list[DbosRepetition] = []
        self.orders: list[dict[str, str]] = []
        self._created: list[str] = []
        self._processes: DbosProcesses | None = None
        self._admin = psycopg.connect(_url(settings_dict, "postgres"), autocommit=True)
        self.warm_count = WARMUP_PER_THREAD * threads * workers
        self.counters = Counters(self._admin, [self.app_database, self.sys_database])
        self._fixtures: dict[str, list[dict[str, str]]] = {}
        self.background: dict[str, tuple[float, float]] = {}
        self.lifecycle: dict[str, tuple[float, float]] = {}
        try:
            self._set_up(repeat)
        except BaseException:
            self.close()
            raise

    def _set_up(self, repeat: int) -> None:
        """The two databases, the application's tables, DBOS's schema, and every order of the run."""
        import psycopg

        for database in (self.app_database, self.sys_database):
            self._admin.execute(f'CREATE DATABASE "{database}"')
            self._created.append(database)
        with psycopg.connect(self.app_url, autocommit=True) as app:
            app.execute(APP_SCHEMA)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "tests.bench.bench_dbos",
                "setup",
                "--app-url",
                self.app_url,
                "--sys-url",
                self.sys_url,
            ],
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            check=True,
            stdout=subprocess.DEVNULL,
        )
        self._fixtures["warm0"] = self._seed("dbos-warm0", self.warm_count)
        for rep in range(1, repeat + 1):
            self._fixtures[f"warm{rep}"] = self._seed(f"dbos-warm{rep}", self.warm_count)
            self._fixtures[f"measured{rep}"] = self._seed(f"dbos-held{rep}", self.n)

    def _seed(self, label: str, count: int) -> list[dict[str, str]]:
        import psycopg

        orders = [
            {"number": f"{label}-{index}", "charge": f"ch_{label}_{index}".replace("-", "_")} for index in range(count)
        ]
        with psycopg.connect(self.app_url) as app, app.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO orders (number, charge_reference, currency, captured_amount) VALUES (%s, %s, 'EUR', %s)",
                [(order["number"], order["charge"], CAPTURED) for order in orders],
            )
        for order in orders:
            self.sandbox.seed_charge(order["charge"], int(CAPTURED * 100), "eur")
        self.orders.extend(orders)
        return orders

    def _since(
        self, start: tuple[dict[str, tuple[int, int]], float], end: tuple[dict[str, tuple[int, int]], float]
    ) -> tuple[dict[str, float], dict[str, float]]:
        """Commits and rollbacks per database between two readings, less the idle rate."""
        (first, first_at), (last, last_at) = start, end
        elapsed = last_at - first_at
        commits = {}
        rollbacks = {}
        for database in self.counters.databases:
            commit_rate, rollback_rate = self.background.get(database, (0.0, 0.0))
            commits[database] = last[database][0] - first[database][0] - commit_rate * elapsed
            rollbacks[database] = last[database][1] - first[database][1] - rollback_rate * elapsed
        return commits, rollbacks

    def baselines(self, idle_seconds: float) -> None:
        """The idle rate of the two databases, then one life cycle of the processes with no measured work."""
        start = self.counters.quiescent()
        time.sleep(idle_seconds)
        end = self.counters.quiescent()
        elapsed = end[1] - start[1]
        self.background = {
            database: (
                (end[0][database][0] - start[0][database][0]) / elapsed,
                (end[0][database][1] - start[0][database][1]) / elapsed,
            )
            for database in self.counters.databases
        }
        processes = DbosProcesses(self, self._fixtures["warm0"], [])
        processes.stop()
        commits, rollbacks = self._since(end, self.counters.quiescent())
        self.lifecycle = {database: (commits[database], rollbacks[database]) for database in self.counters.databases}

    def run_repetition(self, rep: int) -> DbosRepetition:
        """Fresh processes, warmed up; then N refunds timed until the last process has finished them."""
        before = self.counters.quiescent()
        self._processes = DbosProcesses(self, self._fixtures[f"warm{rep}"], self._fixtures[f"measured{rep}"])
        if self.latency_ms:
            self.sandbox.fault(mode="slow", sleep_seconds=self.latency_ms / 1000, times=self.n)
        cpu_before = self.cpu_seconds(self._processes.pids)
        started = time.monotonic()
        answers = self._processes.go()
        seconds = time.monotonic() - started
        cpu = self.cpu_seconds(self._processes.pids) - cpu_before
        self._processes.stop()
        self._processes = None
        commits, rollbacks = self._since(before, self.counters.quiescent())
        statements: dict[str, int] = {}
        for answer in answers:
            for database, count in answer["statements"].items():
                statements[database] = statements.get(database, 0) + count
        repetition = DbosRepetition(
            n=self.n,
            seconds=seconds,
            cpu=cpu,
            statements=statements,
            commits={database: commits[database] - self.lifecycle[database][0] for database in commits},
            rollbacks={database: rollbacks[database] - self.lifecycle[database][1] for database in rollbacks},
        )
        self.repetitions.append(repetition)
        return repetition

    def verify(self) -> list[str]:
        """Every DBOS refund SUCCEEDED with one refund at the sandbox, and every order's money adds up."""
        import psycopg

        problems = []
        refunds: dict[str, list[dict[str, Any]]] = {}
        for refund in self.sandbox.ledger():
            refunds.setdefault(refund["metadata"].get("action_id", ""), []).append(refund)
        with psycopg.connect(self.app_url) as app:
            rows = {
                row[0]: row[1:]
                for row in app.execute(
                    "SELECT o.number, o.refunded_amount, o.reserved_amount, r.action_id, r.status, "
                    "r.provider_reference FROM orders o LEFT JOIN refunds r ON r.order_number = o.number"
                )
            }
        for order in self.orders:
            refunded, reserved, action_id, status, reference = rows[order["number"]]
            found = refunds.get(action_id_for(order["number"]), [])
            if status != "SUCCEEDED" or action_id != action_id_for(order["number"]):
                problems.append(f"DBOS {order['number']}: refund {action_id} is {status}")
            if len(found) != 1 or found[0]["id"] != reference or found[0]["amount"] != 1000:
                problems.append(f"DBOS {order['number']}: {len(found)} refunds at the sandbox")
            if (refunded, reserved) != (REFUND, 0):
                problems.append(f"DBOS order {order['number']}: refunded {refunded}, reserved {reserved}")
        return problems

    def close(self) -> None:
        if self._processes is not None:
            self._processes.stop()
        for database in self._created:
            self._admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        self._admin.close()

    def log_tail(self) -> str:
        return self._processes.log_tail() if self._processes is not None else ""

    # -- the printed rows --------------------------------------------------------------------

    def shape(self) -> str:
        return (
            f"{self.workers} x DBOS process, {self.threads} thread{'s' if self.threads > 1 else ''} each calling the "
            f"workflow; system database {self.sys_database}, application database {self.app_database}"
        )

    def rows(self, row: Callable[..., str], console_rates: list[float]) -> list[str]:
        reps = self.repetitions
        n = self.n
        app, system = self.app_database, self.sys_database
        return [
            row("DBOS: actions/s", [rep.rate for rep in reps], ".1f", "(workflows finished)"),
            row("DBOS: CPU ms per action", [rep.cpu_ms for rep in reps], ".2f", "(DBOS processes)"),
            row(
                "DBOS: statements per action",
                [sum(rep.statements.values()) / n for rep in reps],
                ".2f",
                "(through SQLAlchemy, both databases)",
            ),
            row("DBOS: commits per action", [sum(rep.commits.values()) / n for rep in reps], ".2f", "(xact_commit)"),
            row("  of which system database", [rep.commits[system] / n for rep in reps], ".2f"),
            row("  of which application db", [rep.commits[app] / n for rep in reps], ".2f"),
            row(
                "DBOS: rollbacks per action",
                [sum(rep.rollbacks.values()) / n for rep in reps],
                ".2f",
                "(xact_rollback: read-only checks)",
            ),
            row(
                "console / DBOS actions/s",
                [console / rep.rate for console, rep in zip(console_rates, reps, strict=True)],
                ".2f",
                "(P-b: at least 2)",
            ),
        ]

    def notes(self) -> str:
        reps = self.repetitions
        app, system = self.app_database, self.sys_database
        statements_app = statistics.median(rep.statements.get(app, 0) / self.n for rep in reps)
        statements_sys = statistics.median(rep.statements.get(system, 0) / self.n for rep in reps)
        return (
            f"  DBOS: {self.shape()}.\n"
            f"  statements per action (median): {statements_sys:.2f} system database, "
            f"{statements_app:.2f} application.\n"
            f"  commits: idle rate and the processes' own life cycle (commits "
            f"{self.lifecycle[system][0]:.0f} system + {self.lifecycle[app][0]:.0f} application) subtracted, "
            f"over the N = {self.n} workflows."
        )


if __name__ == "__main__":
    sys.exit(main())
