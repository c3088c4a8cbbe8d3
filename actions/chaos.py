"""The chaos run: real processes, real crashes, real faults, then an independent audit.

It starts the sandbox provider, the accounting sandbox, a web server, several Celery workers
and beat against the configured PostgreSQL database and Redis broker. It proposes N actions
through the agent API, refunds and invoice adjustments mixed (``adjustment_share`` of them
adjustments; small ones approved by the auto-approval policy, larger ones by a scripted
manager), and while they flow it:

- SIGKILLs a random worker every few seconds and starts a replacement;
- lets the workers kill themselves at the named fault points with a small probability;
- has both sandboxes inject every fault mode they know at configurable probabilities;
- restarts PostgreSQL once and flushes the Redis broker once.

Then it drains (faults off, no more kills) until every action is terminal or in NEEDS_REVIEW,
with a deadline, and checks invariants 1, 2, 5 and 8 against both sandboxes' own ledgers,
reporting duplicates and lost actions per kind.

Used by ``manage.py chaos_run`` (large runs) and by tests/chaos (a small run in CI).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import InterfaceError, OperationalError, connection
from django.db.models import Count, Q

from actions.agents import agent_create, agent_token_issue
from actions.engine.invariants import EffectsReport, check_effects
from actions.kinds.invoice_adjustment import AdjustmentReceiver
from actions.kinds.refund import RefundReceiver
from actions.models import Action, ActionStatus, AdjustmentRequest, Bill, Order, RefundRequest
from actions.models.actions import TERMINAL_STATUSES
from actions.providers.accounting.client import AccountingClient
from actions.providers.money import to_minor_units
from actions.providers.stripe_adapter import StripeProvider
from approvals.models import ApprovalLimit, Decision
from approvals.services import DecisionRefused, action_reopen, approval_decide
from console.roles import ensure_roles

REPO_ROOT = Path(__file__).resolve().parent.parent
FINAL_STATUSES = {*TERMINAL_STATUSES, ActionStatus.NEEDS_REVIEW}
CREATE_FAULT_MODES = (
    "commit_then_timeout",
    "commit_then_500",
    "commit_then_drop",
    "fail_before_commit",
    "reject_invalid",
    "rate_limit",
    "pending",
)
LOOKUP_FAULT_MODES = ("fail_before_commit", "commit_then_drop", "rate_limit", "commit_then_timeout")
# Credit notes do not settle later: the accounting sandbox has no "pending" mode.
ACCOUNTING_CREATE_FAULT_MODES = tuple(mode for mode in CREATE_FAULT_MODES if mode != "pending")
REFUND, ADJUSTMENT = "refund", "invoice-adjustment"
WORKER_FAULT_POINTS = ("before_provider_call", "after_provider_answer", "during_reconciliation", "after_record")


@dataclass
class ChaosConfig:
    """Defaults sized for a 2-core machine: a few hundred actions in a few minutes."""

    actions: int = 300
    workers: int = 3
    kill_every_seconds: float = 5.0
    create_fault_probability: float = 0.04  # per mode, on refund creation
    lookup_fault_probability: float = 0.03  # per mode, on lookups
    worker_fault_probability: float = 0.02  # per fault point, per pass
    restart_postgres: bool = True
    flush_redis: bool = True
    drain_deadline_seconds: float = 600.0
    manager_share: float = 0.2  # proposals above the auto-approval threshold
    adjustment_share: float = 0.4  # invoice adjustments among the actions; the rest are refunds
    proposers: int = 4  # concurrent API clients
    seed: int = 1
    # Timings shrunk so that leases, sweeps and reconciliation all happen within the run.
    lease_seconds: int = 8
    sweep_interval_seconds: int = 1
    provider_timeout_seconds: int = 1
    key_retention_seconds: int = 30
    visibility_delay_seconds: int = 1
    reconcile_max_failures: int = 4
    # Shorter than the provider's, as the accounting system's keys are.
    accounting_key_retention_seconds: int = 20


@dataclass
class ChaosReport:
    config: dict[str, Any]
    proposed: int = 0
    proposal_errors: int = 0
    kills: int = 0
    self_kills: int = 0
    worker_exits: int = 0  # workers that exited without being killed by the run (replaced)
    postgres_restarts: int = 0
    redis_flushes: int = 0
    faults_fired: dict[str, int] = field(default_factory=dict)
    drained: bool = False
    seconds: float = 0.0
    audit: EffectsReport | None = None
    # Per kind: actions, succeeded, duplicates, lost (from the audit's violations).
    per_kind: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.drained and self.audit is not None and self.audit.ok

    def lines(self) -> list[str]:
        audit = self.audit
        states = ", ".join(f"{k} {v}" for k, v in sorted((audit.states if audit else {}).items()))
        throughput = (audit.actions / self.seconds) if audit and self.seconds else 0.0
        out = [
            "chaos run report",
            f"  actions          {audit.actions if audit else 0} ({self.proposed} proposed, "
            f"{self.proposal_errors} proposal errors)",
            f"  effects          {audit.effects if audit else 0} at the provider",
            f"  duplicates       {audit.duplicates if audit else '?'}   (must be 0)",
            f"  lost             {audit.lost if audit else '?'}   (must be 0)",
            f"  drained          {'yes' if self.drained else 'NO: deadline passed'}",
            f"  states           {states}",
            f"  kills            {self.kills} workers by the run, {self.self_kills} at worker fault points, "
            f"{self.worker_exits} other worker exits",
            f"  postgres         {self.postgres_restarts} restart(s); redis {self.redis_flushes} flush(es)",
            "  provider faults  " + ", ".join(f"{k} {v}" for k, v in sorted(self.faults_fired.items())),
            f"  time             {self.seconds:.1f} s, {throughput:.1f} actions/s end to end",
            f"  invariants       {'all hold' if audit and audit.ok else 'VIOLATED'}",
        ]
        for kind, numbers in sorted(self.per_kind.items()):
            out.append(
                f"  {kind:<19}{numbers.get('actions', 0)} actions, {numbers.get('succeeded', 0)} succeeded, "
                f"{numbers.get('duplicates', 0)} duplicates, {numbers.get('lost', 0)} lost"
            )
        for violation in (audit.violations if audit else [])[:50]:
            out.append(f"    [{violation.invariant}] {violation.subject}: {violation.message}")
        return out


# --- processes -----------------------------------------------------------------------------


class Process:
    """A child process in its own session, so a kill takes its children (the pool) with it.

    Workers run Celery's prefork pool with one child: a fault point kills the child that runs
    the task, and Celery's reject_on_worker_lost must requeue the message (the production
    set-up under test); the run's own kills take the whole worker down.
    """

    def __init__(self, name: str, command: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.command = command
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.popen = subprocess.Popen(
                command, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(timeout=10)

    def stop(self) -> None:
        if not self.alive:
            return
        try:
            os.killpg(self.popen.pid, signal.SIGTERM)
            self.popen.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            self.kill()


def _http(method: str, url: str, body: dict[str, Any] | None = None, headers: dict[str, str] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(  # noqa: S310 - local processes started by this run
        url, data=data, method=method, headers={"Content-Type": "application/json", **(headers or {})}
    )
    with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
        return json.loads(response.read() or b"null")


def _wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _db_retry(fn: Callable[[], Any], attempts: int = 60) -> Any:
    """Run a query, reconnecting while PostgreSQL restarts."""
    for attempt in range(attempts):
        try:
            return fn()
        except (OperationalError, InterfaceError):
            connection.close()
            if attempt == attempts - 1:
                raise
            time.sleep(0.5)
    return None


class ChaosRun:
    def __init__(self, config: ChaosConfig, *, workdir: Path | None = None) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="chaos-"))
        self.report = ChaosReport(config=vars(config).copy())
        self.workers: list[Process] = []
        self.worker_numbers = itertools.count(1)
        self.others: list[Process] = []
        self.sandbox_url = ""
        self.accounting_url = ""
        self.web_url = ""
        self.token = ""
        self.lock = threading.Lock()
        db = connection.settings_dict
        self.database_url = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
        self.broker_url = settings.CELERY_BROKER_URL

    # --- set-up ------------------------------------------------------------------------------

    def environment(self, *, fault_points: str = "") -> dict[str, str]:
        c = self.config
        return {
            **os.environ,
            "PYTHONPATH": str(REPO_ROOT),
            "DJANGO_SETTINGS_MODULE": "console.settings",
            "DATABASE_URL": self.database_url,
            "DATABASE_POOL": "0",
            "CELERY_BROKER_URL": self.broker_url,
            "CONSOLE_DATA_DIR": str(self.workdir / "data"),
            "PROVIDER_API_BASE": self.sandbox_url,
            "PROVIDER_TIMEOUT_SECONDS": str(c.provider_timeout_seconds),
            "PROVIDER_KEY_RETENTION_SECONDS": str(c.key_retention_seconds),
            "PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS": str(c.visibility_delay_seconds),
            "ACCOUNTING_API_BASE": self.accounting_url,
            "ACCOUNTING_TIMEOUT_SECONDS": str(c.provider_timeout_seconds),
            "ACCOUNTING_KEY_RETENTION_SECONDS": str(c.accounting_key_retention_seconds),
            "ACCOUNTING_LOOKUP_VISIBILITY_DELAY_SECONDS": str(c.visibility_delay_seconds),
            "KEY_RETENTION_MARGIN_SECONDS": "5",
            "LEASE_SECONDS": str(c.lease_seconds),
            "SWEEP_INTERVAL_SECONDS": str(c.sweep_interval_seconds),
            "RECONCILE_BASE_BACKOFF_SECONDS": "1",
            "RECONCILE_MAX_FAILURES": str(c.reconcile_max_failures),
            "API_RATE_LIMIT_PER_MINUTE": "1000000",
            "CONSOLE_FAULT_POINTS": fault_points,
        }

    def _checks(self) -> None:
        if connection.vendor != "postgresql":
            raise RuntimeError("the chaos run needs PostgreSQL: set DATABASE_URL=postgres://...")
        if not self.broker_url.startswith("redis://"):
            raise RuntimeError("the chaos run needs a Redis broker: set CELERY_BROKER_URL=redis://...")

    def start_sandbox(self) -> None:
        port = _free_port()
        self.sandbox_url = f"http://127.0.0.1:{port}"
        process = Process(
            "sandbox",
            [
                sys.executable,
                "-m",
                "actions.providers.sandbox",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--db",
                str(self.workdir / "sandbox.sqlite3"),
                "--fault-seed",
                str(self.config.seed),
                "--pending-settle-after-seconds",
                "3",
            ],
            self.environment(),
            self.workdir / "sandbox.log",
        )
        self.others.append(process)
        _wait_for(lambda: self._healthy(f"{self.sandbox_url}/_sandbox/health"), 30, "the sandbox")
        _http(
            "POST",
            f"{self.sandbox_url}/_sandbox/config",
            {
                "key_retention_seconds": self.config.key_retention_seconds,
                "lookup_visibility_delay_seconds": self.config.visibility_delay_seconds,
            },
        )

    def start_accounting(self) -> None:
        port = _free_port()
        self.accounting_url = f"http://127.0.0.1:{port}"
        process = Process(
            "accounting",
            [
                sys.executable,
                "-m",
                "actions.providers.accounting",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--db",
                str(self.workdir / "accounting.sqlite3"),
                "--fault-seed",
                str(self.config.seed),
                "--key-retention-seconds",
                str(self.config.accounting_key_retention_seconds),
                "--lookup-visibility-delay-seconds",
                str(self.config.visibility_delay_seconds),
            ],
            self.environment(),
            self.workdir / "accounting.log",
        )
        self.others.append(process)
        _wait_for(lambda: self._healthy(f"{self.accounting_url}/_sandbox/health"), 30, "the accounting sandbox")

    def start_web(self) -> None:
        port = _free_port()
        self.web_url = f"http://127.0.0.1:{port}"
        process = Process(
            "web",
            [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload", "--nothreading"],
            {**self.environment(), "DEBUG": "0"},
            self.workdir / "web.log",
        )
        self.others.append(process)
        _wait_for(lambda: self._healthy(f"{self.web_url}/api/v1/openapi.json"), 60, "the web server")

    @staticmethod
    def _healthy(url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def start_worker(self, *, with_faults: bool = True) -> Process:
        p = self.config.worker_fault_probability
        points = ",".join(f"{name}@{p}" for name in WORKER_FAULT_POINTS) if with_faults and p > 0 else ""
        name = f"worker{next(self.worker_numbers)}"
        process = Process(
            name,
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "console",
                "worker",
                "--pool",
                "prefork",
                "--concurrency",
                "1",
                "--loglevel",
                "INFO",
                "--hostname",
                f"{name}@%h",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ],
            self.environment(fault_points=points),
            self.workdir / f"{name}.log",
        )
        self.workers.append(process)
        return process

    def start_beat(self) -> None:
        self.others.append(
            Process(
                "beat",
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "console",
                    "beat",
                    "--loglevel",
                    "INFO",
                    "--schedule",
                    str(self.workdir / "beat-schedule"),
                ],
                self.environment(),
                self.workdir / "beat.log",
            )
        )

    def seed(self) -> list[tuple[str, str, int, str, str]]:
        """Orders and charges, bills (in both systems), requests on them, an agent with a token
        and a scripted manager. Each proposal is (kind, order or bill, request number, amount, reason)."""
        ensure_roles()
        user_model = get_user_model()
        owner, _ = user_model.objects.get_or_create(username="chaos.owner")
        manager, _ = user_model.objects.get_or_create(username="chaos.manager")
        manager.groups.add(Group.objects.get(name="manager"))
        ApprovalLimit.objects.get_or_create(user=manager, currency="EUR", defaults={"max_amount": Decimal("100000")})
        finance, _ = user_model.objects.get_or_create(username="chaos.finance")
        finance.groups.add(Group.objects.get(name="finance"))
        self.manager = manager
        agent = agent_create(
            name=f"chaos-bot-{self.config.seed}-{int(time.time())}",
            owner=owner,
            scopes=["refund", "invoice_adjustment"],
        )
        self.token = agent_token_issue(agent=agent).plain

        proposals: list[tuple[str, str, int, str, str]] = []
        stamp = f"{int(time.time()) % 100000:05d}"
        per_order = 2
        adjustments = round(self.config.actions * self.config.adjustment_share)
        refunds = self.config.actions - adjustments
        orders = (refunds + per_order - 1) // per_order
        for index in range(orders):
            number = f"C{stamp}-{index:05d}"
            order = Order.objects.create(
                number=number,
                customer_name=f"Chaos customer {index}",
                currency="EUR",
                captured_amount=Decimal("200.00"),
                charge_reference=f"ch_chaos_{stamp}_{index}",
                paid_at=_now() - timedelta(days=1),
            )
            _http(
                "POST",
                f"{self.sandbox_url}/_sandbox/charges",
                {
                    "id": order.charge_reference,
                    "amount": to_minor_units(order.captured_amount, "EUR"),
                    "currency": "eur",
                },
            )
            for request_number in range(1, per_order + 1):
                if len(proposals) >= refunds:
                    break
                RefundRequest.objects.create(order=order, number=request_number)
                proposals.append((REFUND, number, request_number, self._amount(), "damaged"))
        for index in range((adjustments + per_order - 1) // per_order):
            number = f"CB{stamp}-{index:05d}"
            bill = Bill.objects.create(
                number=number,
                supplier_name=f"Chaos supplier {index}",
                currency="EUR",
                amount=Decimal("200.00"),
                amount_due=Decimal("200.00"),
                accounting_reference=f"chaos-{stamp}-{index}",
                purchase_order=f"PO-{number}",
                po_mismatch={"summary": "chaos run"},
                issued_at=_now() - timedelta(days=1),
            )
            _http(
                "POST",
                f"{self.accounting_url}/_sandbox/invoices",
                {
                    "InvoiceID": bill.accounting_reference,
                    "InvoiceNumber": number,
                    "Contact": bill.supplier_name,
                    "CurrencyCode": "EUR",
                    "Total": "200.00",
                },
            )
            for request_number in range(1, per_order + 1):
                if len(proposals) >= self.config.actions:
                    break
                AdjustmentRequest.objects.create(bill=bill, number=request_number)
                proposals.append((ADJUSTMENT, number, request_number, self._amount(), "price_mismatch"))
        # Interleaved, so that both kinds flow through the workers at the same time.
        self.rng.shuffle(proposals)
        return proposals

    def _amount(self) -> str:
        if self.rng.random() < self.config.manager_share:
            return f"{self.rng.randint(60, 90)}.00"
        return f"{self.rng.randint(1, 24)}.{self.rng.randint(0, 99):02d}"

    # --- chaos -------------------------------------------------------------------------------

    def configure_faults(self, on: bool) -> None:
        for url, create_modes in (
            (self.sandbox_url, CREATE_FAULT_MODES),
            (self.accounting_url, ACCOUNTING_CREATE_FAULT_MODES),
        ):
            _http("DELETE", f"{url}/_sandbox/faults")
            if not on:
                continue
            c = self.config
            _http(
                "POST",
                f"{url}/_sandbox/faults",
                {
                    "seed": c.seed,
                    "applies_to": "create",
                    "sleep_seconds": c.provider_timeout_seconds + 0.5,
                    "settle_after_seconds": 3,
                    "probabilities": dict.fromkeys(create_modes, c.create_fault_probability),
                },
            )
            _http(
                "POST",
                f"{url}/_sandbox/faults",
                {
                    "applies_to": "lookup",
                    "sleep_seconds": c.provider_timeout_seconds + 0.5,
                    "probabilities": dict.fromkeys(LOOKUP_FAULT_MODES, c.lookup_fault_probability),
                },
            )

    def propose_all(self, proposals: list[tuple[str, str, int, str, str]]) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}

        def propose(item: tuple[str, str, int, str, str]) -> None:
            kind, target, request_number, amount, reason = item
            body: dict[str, Any] = {"amount": amount, "currency": "EUR", "reason_code": reason, "evidence": "chaos run"}
            if kind == ADJUSTMENT:
                body.update(bill_number=target, adjustment_number=request_number)
                path = "invoice-adjustments"
            else:
                body.update(order_number=target, request_number=request_number)
                path = "refunds"
            # An agent's retry is always safe: the same proposal returns the same action.
            for _attempt in range(20):
                try:
                    _http("POST", f"{self.web_url}/api/v1/{path}", body, headers)
                    with self.lock:
                        self.report.proposed += 1
                    return
                except urllib.error.HTTPError as error:
                    if error.code in (409, 400, 422, 401, 403):
                        with self.lock:
                            self.report.proposal_errors += 1
                        return
                except (urllib.error.URLError, OSError):
                    pass
                time.sleep(0.5)
            with self.lock:
                self.report.proposal_errors += 1

        with ThreadPoolExecutor(max_workers=self.config.proposers) as pool:
            list(pool.map(propose, proposals))

    def approve_waiting(self) -> None:
        """The scripted manager: approves whatever waits for a decision, and asks for a new
        decision on what went stale (then approves that too, against the order as it is now)."""

        def waiting() -> list[int]:
            return list(
                Action.objects.filter(status__in=[ActionStatus.PROPOSED, ActionStatus.STALE]).values_list(
                    "pk", flat=True
                )[:200]
            )

        def approve(pk: int) -> None:
            with contextlib.suppress(DecisionRefused):
                if Action.objects.filter(pk=pk, status=ActionStatus.STALE).exists():
                    action_reopen(action_pk=pk, user=self.manager, note="chaos: new decision")
                approval_decide(action_pk=pk, user=self.manager, decision=Decision.APPROVE)

        for pk in _db_retry(waiting) or []:
            _db_retry(functools.partial(approve, pk))

    def restart_postgres(self) -> None:
        cluster = sorted(os.listdir("/etc/postgresql"))[0]
        subprocess.run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", cluster, "main", "restart"],
            check=True,
            capture_output=True,
            timeout=120,
        )
        connection.close()
        self.report.postgres_restarts += 1

    def flush_redis(self) -> None:
        import redis

        redis.Redis.from_url(self.broker_url).flushdb()
        self.report.redis_flushes += 1

    def counts(self) -> tuple[int, int]:
        def query() -> tuple[int, int]:
            ours = Action.objects.filter(Q(order__number__startswith="C") | Q(bill__number__startswith="CB"))
            return ours.count(), ours.filter(status__in=FINAL_STATUSES).count()

        return _db_retry(query)

    def progress(self, phase: str) -> None:
        """A one-line progress bar on stderr (the report itself goes to ``out``)."""
        total, final = self.counts()
        width = 30
        done = int(width * final / max(self.config.actions, 1))
        alive = sum(1 for w in self.workers if w.alive)
        sys.stderr.write(
            f"\r[{'#' * done}{'.' * (width - done)}] {final}/{self.config.actions} final, {total} proposed  "
            f"{phase:<9} workers {alive}  kills {self.report.kills}+{self.report.self_kills}   "
        )
        sys.stderr.flush()

    # --- the run -----------------------------------------------------------------------------

    def run(self) -> ChaosReport:
        self._checks()
        started = time.monotonic()
        try:
            # The run owns its broker database: messages left by an earlier run (for actions of
            # another database) would only delay this one.
            import redis

            redis.Redis.from_url(self.broker_url).flushdb()
            self.start_sandbox()
            self.start_accounting()
            proposals = self.seed()
            self.start_web()
            self.configure_faults(on=True)
            for _ in range(self.config.workers):
                self.start_worker()
            self.start_beat()

            proposer = threading.Thread(target=self.propose_all, args=(proposals,), daemon=True)
            proposer.start()
            next_kill = time.monotonic() + self.config.kill_every_seconds
            restarted = flushed = False
            while proposer.is_alive() or self.counts()[1] < self.report.proposed * 0.6:
                self.approve_waiting()
                self._reap(with_faults=True)
                if time.monotonic() >= next_kill and self.workers:
                    victim = self.rng.choice(self.workers)
                    victim.kill()
                    self.workers.remove(victim)
                    self.report.kills += 1
                    self.start_worker()
                    next_kill = time.monotonic() + self.config.kill_every_seconds
                total, _final = self.counts()
                if self.config.restart_postgres and not restarted and total >= self.config.actions // 3:
                    self.restart_postgres()
                    restarted = True
                if self.config.flush_redis and not flushed and total >= self.config.actions // 2:
                    self.flush_redis()
                    flushed = True
                self.progress("chaos")
                time.sleep(0.5)
                if time.monotonic() - started > self.config.drain_deadline_seconds:
                    break
            proposer.join(timeout=60)

            # Drain: no more injected faults or kills; replace fault-point workers with clean ones.
            fired = _http("GET", f"{self.sandbox_url}/_sandbox/faults").get("fired", {})
            self.report.faults_fired = {str(k): int(v) for k, v in fired.items()}
            fired = _http("GET", f"{self.accounting_url}/_sandbox/faults").get("fired", {})
            self.report.faults_fired.update({f"accounting {k}": int(v) for k, v in fired.items()})
            self.configure_faults(on=False)
            for worker in self.workers:
                worker.kill()
            self.workers.clear()
            for _ in range(self.config.workers):
                self.start_worker(with_faults=False)
            deadline = time.monotonic() + self.config.drain_deadline_seconds
            while time.monotonic() < deadline:
                self.approve_waiting()
                self._reap(with_faults=False)
                total, final = self.counts()
                self.progress("draining")
                if final >= total and total >= self.report.proposed:
                    self.report.drained = True
                    break
                time.sleep(0.5)
            sys.stderr.write("\n")
            self.report.seconds = time.monotonic() - started
            # Each pool child a fault point killed left a line in its worker's log.
            self.report.self_kills += sum(
                log.read_text(errors="replace").count("fault point ") for log in self.workdir.glob("worker*.log")
            )
            provider = StripeProvider(
                api_key="sk_test_chaos",
                api_base=self.sandbox_url,
                timeout_seconds=30,
                key_retention=timedelta(seconds=self.config.key_retention_seconds),
                lookup_visibility_delay=timedelta(seconds=self.config.visibility_delay_seconds),
            )
            # The provider's lists lag by its lookup visibility delay: a refund created just
            # before the drain ended is not listed yet. Read the ledger only once the last
            # change is older than that delay, so the audit sees every effect.
            self._wait_until_ledger_settles()
            ledger = list(RefundReceiver(provider).ledger())
            accounting = AccountingClient(
                api_base=self.accounting_url,
                access_token="chaos",  # noqa: S106 - the sandbox takes any token
                tenant_id="chaos",
                timeout_seconds=30,
            )
            ledger += list(AdjustmentReceiver(accounting).ledger())
            # The audit uses the run's own policy timings (leases, escalation) to judge "stuck".
            with _override(
                LEASE_SECONDS=self.config.lease_seconds,
                SWEEP_INTERVAL_SECONDS=self.config.sweep_interval_seconds,
                RECONCILE_BASE_BACKOFF_SECONDS=1,
                RECONCILE_MAX_FAILURES=self.config.reconcile_max_failures,
                PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS=self.config.visibility_delay_seconds,
                ACCOUNTING_API_BASE=self.accounting_url,
            ):
                self.report.audit = _db_retry(lambda: check_effects(ledger=ledger))
            self.report.per_kind = _db_retry(lambda: per_kind_numbers(self.report.audit))
            return self.report
        finally:
            for process in [*self.workers, *self.others]:
                process.stop()

    def _wait_until_ledger_settles(self) -> None:
        from django.db.models import Max
        from django.utils import timezone

        last_change = _db_retry(lambda: Action.objects.aggregate(last=Max("status_changed_at"))["last"])
        if last_change is None:
            return
        settled_at = last_change + timedelta(seconds=self.config.visibility_delay_seconds + 0.5)
        _wait_for(lambda: timezone.now() >= settled_at, timeout=60, what="the provider's list to catch up")

    def _reap(self, *, with_faults: bool) -> None:
        for worker in list(self.workers):
            if not worker.alive:
                self.workers.remove(worker)
                self.report.worker_exits += 1
                self.start_worker(with_faults=with_faults)


def per_kind_numbers(audit: EffectsReport | None) -> dict[str, dict[str, int]]:
    """Actions, successes, duplicates and lost actions per kind: the audit's violations name the
    action, whose id starts with its kind."""
    numbers: dict[str, dict[str, int]] = {}
    rows = Action.objects.values_list("kind", "status").annotate(n=Count("pk")).order_by()
    for kind, status, count in rows:
        entry = numbers.setdefault(kind, {"actions": 0, "succeeded": 0, "duplicates": 0, "lost": 0})
        entry["actions"] += count
        if status == ActionStatus.SUCCEEDED:
            entry["succeeded"] += count
    for violation in audit.violations if audit is not None else []:
        kind = violation.subject.split(":", 1)[0]
        entry = numbers.setdefault(kind, {"actions": 0, "succeeded": 0, "duplicates": 0, "lost": 0})
        if violation.invariant == 1:
            entry["duplicates"] += 1
        elif violation.invariant == 8:
            entry["lost"] += 1
    return numbers


class _override:
    def __init__(self, **values: Any) -> None:
        self.values = values
        self.saved: dict[str, Any] = {}

    def __enter__(self) -> None:
        for name, value in self.values.items():
            self.saved[name] = getattr(settings, name)
            setattr(settings, name, value)

    def __exit__(self, *exc: object) -> None:
        for name, value in self.saved.items():
            setattr(settings, name, value)


def _now() -> Any:
    from django.utils import timezone

    return timezone.now()


def chaos_workdir_cleanup(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
