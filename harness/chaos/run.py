"""The chaos run: real processes, real crashes, real faults, then an independent audit.

It starts the sandbox provider, a web server, several Celery workers and beat against the
configured PostgreSQL database and Redis broker. It proposes N refunds through the agent API
(small ones approved by the auto-approval policy, larger ones by a scripted manager), and
while they flow it:

- SIGKILLs a random worker every few seconds and starts a replacement;
- lets the workers kill themselves at the named fault points with a small probability;
- has the sandbox inject every fault mode it knows at configurable probabilities;
- restarts PostgreSQL once and flushes the Redis broker once;
- has refunds made outside the console (at the sandbox) arrive by signed webhook, so approvals
  bound to the old order version go stale and the orders' money must still add up;
- takes the receiver down for a while (every create and lookup fails, then lookups only), long
  enough that the reconciliation policy escalates some actions to NEEDS_REVIEW; after the drain, a scripted
  finance clerk resolves them with the receiver's evidence (found: succeeded; not found: retry).

Then it drains (faults off, no more kills) until every action is terminal or in NEEDS_REVIEW,
with a deadline, and checks invariants 1, 2, 5 and 8 against the sandbox's own ledger.

Invoice adjustments go through the same run, so that a second receiver's faults are proven too:
a share of the actions (at least a third by default) are credit notes against supplier bills in
the accounting sandbox, a second receiver with its own faults, outage and ledger. The report
gives duplicates and lost per kind, and audits the accounting sandbox's own ledger on its own
terms: at most one live credit note per action, exactly one for every SUCCEEDED adjustment, and
per bill no more credited than its original amount due.

Supplier emails go through the same run, for a receiver with no lookup and no keys: the agent
proposes them through the API, the scripted manager approves them, and the mail sandbox refuses
some before DATA, rejects some, and stores some and drops the connection. Every ambiguous send
must end in NEEDS_REVIEW with an owner; after the drain a scripted member of finance resolves
each one (confirm delivered when the relay's list has the message, else send again, a recorded
decision), and the audit checks that no email reached the relay twice without such a decision.

Used by ``manage.py chaos_run`` (large runs) and by tests/chaos (a small run in CI).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import random
import secrets
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
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import InterfaceError, OperationalError, connection

from actions.agents.services import INVOICE_ADJUSTMENT_SCOPE, agent_create, agent_token_issue
from actions.engine.dispatcher import DISPATCHER_PROCESS
from actions.engine.invariants import EffectsReport, check_effects
from actions.engine.resolution_checks import ReviewRefused
from actions.engine.resolutions import (
    action_lookup,
    action_resolve_resend,
    action_resolve_retry,
    action_resolve_succeeded,
)
from actions.kinds.base import Effect, LookupVerdict, Outcome, Receiver
from actions.kinds.invoice_adjustment.contract import AdjustmentReceiver, accounting_from_settings
from actions.kinds.refund.contract import RefundReceiver
from actions.kinds.supplier_email.contract import MailRelay, message_reference
from actions.models import (
    Action,
    ActionEvent,
    ActionKind,
    ActionStatus,
    AdjustmentRequest,
    Bill,
    Order,
    OutsideRefund,
    RefundRequest,
    Supplier,
    SupplierContact,
)
from actions.models.actions import TERMINAL_STATUSES
from actions.providers.accounting.client import AccountingClient
from actions.providers.mail.smtp import SmtpMailer
from actions.providers.money import to_minor_units
from actions.providers.stripe_adapter import StripeProvider
from approvals.models import ApprovalLimit, ApprovalPolicy, Decision
from approvals.policy import latest_approval
from approvals.services import DecisionRefused, action_reopen, approval_decide
from console.roles import ACCOUNTS_PAYABLE, ensure_roles
from harness.chaos.hosts import (
    HOST_ENV,
    Host,
    ScheduleSampler,
    hosts_report_lines,
    hosts_summary,
    kill_host,
    measured_skew,
    round_robin,
    skew_environment,
)
from harness.chaos.workflows import WorkflowChaos, workflow_report_lines

REPO_ROOT = Path(__file__).resolve().parents[2]
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
# Credit notes do not settle later: the accounting sandbox has every create fault but "pending".
ACCOUNTING_CREATE_FAULT_MODES = tuple(mode for mode in CREATE_FAULT_MODES if mode != "pending")
MAIL_FAULT_MODES = ("defer", "reject", "drop_after_data")
CHAOS_SUPPLIER = "CHAOS"
CHAOS_CONTACT = "ap@chaos-supplier.example"
# Secrets between the local processes of one run, new for each run: the web process refuses a
# secret written in the repository once DEBUG is off (console.checks.refuse_known_secrets).
WEBHOOK_SECRET = "whsec_chaos_" + secrets.token_hex(16)
WEB_SECRET_KEY = secrets.token_urlsafe(50)
WORKER_FAULT_POINTS = (
    "before_provider_call",
    "after_provider_answer",
    "during_reconciliation",
    "after_record",
    # The workflow coordinator's: between a step's record and the next step's claim, and
    # in the middle of compensation (actions.workflows.coordinator).
    "workflow_before_next_step",
    "workflow_after_next_step",
    "workflow_during_compensation",
)


@dataclass
class ChaosConfig:
    """Defaults sized for a 2-core machine: a few hundred actions in a few minutes."""

    actions: int = 300  # refunds and invoice adjustments together (the emails come on top)
    # The share of ``actions`` that are invoice adjustments (at least a third, so that the second
    # receiver's faults are exercised as often as the first's); 0 runs refunds only and starts no accounting sandbox.
    adjustment_share: float = 0.4
    workers: int = 3
    # The concurrent profile: this many dispatcher processes (manage.py dispatcher) beside the
    # workers, killed like them, each with this many calls in flight; approvals then publish no
    # Celery dispatch (DISPATCH_PUBLISH=0). 0 dispatches through Celery tasks only.
    dispatchers: int = 0
    dispatcher_concurrency: int = 8
    # Each host's worker for the periodic tasks' queue: its prefork children. One, as in
    # production: the sweeps run one after another, never behind a dispatch.
    periodic_concurrency: int = 1
    kill_every_seconds: float = 5.0
    create_fault_probability: float = 0.04  # per mode, on refund creation
    lookup_fault_probability: float = 0.03  # per mode, on lookups
    worker_fault_probability: float = 0.02  # per fault point, per pass
    restart_postgres: bool = True
    flush_redis: bool = True
    # Restart the Redis server at the broker's address (shutdown without saving, start again)
    # instead of flushing its database: connections drop and every queued message is lost. Only
    # for a Redis the run owns (its own port): CI's shared Redis is flushed, never restarted.
    restart_redis: bool = False
    drain_deadline_seconds: float = 600.0
    manager_share: float = 0.2  # proposals above the auto-approval threshold
    proposers: int = 4  # concurrent API clients
    seed: int = 1
    # Timings shrunk so that leases, sweeps and reconciliation all happen within the run.
    lease_seconds: int = 8
    sweep_interval_seconds: int = 1
    provider_timeout_seconds: int = 1
    key_retention_seconds: int = 30
    visibility_delay_seconds: int = 1
    reconcile_max_failures: int = 4
    # Supplier emails proposed alongside the refunds, and the mail sandbox's fault rate per mode.
    emails: int = 40
    mail_fault_probability: float = 0.08
    # Refunds made outside the console: this share of the orders gets one, spread over the run.
    outside_refund_share: float = 0.05
    # The receiver outage: every create and lookup fails for this long, starting once this share
    # of the actions exists. 0 turns it off. The default outlasts the escalation policy of the
    # run (4 failed lookups with backoff: about 90 s when the workers keep up).
    outage_seconds: float = 90.0
    outage_at_share: float = 0.4
    outage_min_review: int = 5  # the outage goes on (up to 4 x outage_seconds) until this many escalated
    outage_creates_seconds: float = 20.0  # creates fail for this first part of the outage, lookups for all of it
    finance_resolves: bool = True
    # Workflows (po_mismatch_resolution) as a share of the run's work: single actions, emails and
    # workflows together (at least 10%, enough coordinators to crash mid-step). Needs the accounting sandbox.
    workflow_share: float = 0.12
    # The hosts mode (harness.chaos.hosts): this many simulated hosts, each with its own web
    # process, ``workers`` workers, ``dispatchers`` dispatchers and a beat, on the same
    # PostgreSQL and Redis; the proposers spread their requests over the hosts' web processes.
    # 1 is the single-host run.
    hosts: int = 1
    # The first host is SIGKILLed whole (beat included) once this share of the actions exists
    # (0: never), and comes back, every process restarted, this many seconds later.
    lose_host_at: float = 0.0
    host_back_after_seconds: float = 20.0
    # The last host's wall clock runs this many seconds ahead (or behind, negative) for all its
    # processes, through libfaketime.
    skew_seconds: int = 0

    @property
    def adjustments(self) -> int:
        return round(self.actions * self.adjustment_share)

    @property
    def refunds(self) -> int:
        return self.actions - self.adjustments


@dataclass
class ChaosReport:
    config: dict[str, Any]
    proposed: int = 0  # refunds
    adjustments_proposed: int = 0
    proposal_errors: int = 0
    kills: int = 0
    self_kills: int = 0
    worker_exits: int = 0  # workers that exited without being killed by the run (replaced)
    dispatcher_claims: int = 0  # actions claimed by the dispatcher processes (the concurrent profile)
    postgres_restarts: int = 0
    redis_flushes: int = 0
    redis_restarts: int = 0
    faults_fired: dict[str, int] = field(default_factory=dict)
    drained: bool = False
    seconds: float = 0.0
    audit: EffectsReport | None = None
    emails_proposed: int = 0
    mail_faults_fired: dict[str, int] = field(default_factory=dict)
    messages_at_relay: int = 0
    ambiguous_sends: int = 0  # emails escalated to a person by the engine (no keys, no lookup)
    ambiguous_unowned: int = 0  # of those, without a named owner (must be 0)
    not_sent_retries: int = 0  # sends the relay refused before DATA, sent again under the approval
    resolved_confirmed: int = 0
    resolved_sent_again: int = 0

    outside_refunds: int = 0  # made at the sandbox during the run
    outside_refunds_booked: int = 0  # booked on their orders from the webhooks
    webhooks: dict[str, Any] = field(default_factory=dict)
    outage_seconds: float = 0.0
    reached_review: int = 0  # actions that were ever in NEEDS_REVIEW
    finance: dict[str, int] = field(default_factory=dict)
    money_mismatches: list[str] = field(default_factory=list)
    stale_by_policy: int = 0
    accounting_faults_fired: dict[str, int] = field(default_factory=dict)
    credit_notes: int = 0  # in the accounting sandbox's own ledger, voided ones included
    bills_checked: int = 0
    accounting_problems: list[str] = field(default_factory=list)  # the accounting ledger's own audit
    # Actions already in the database when the run began: the audit covers every action, and an
    # earlier run's receivers are gone, so their effects read as missing. Use a fresh database.
    actions_before: int = 0
    workflows: dict[str, Any] = field(default_factory=dict)  # harness.chaos.workflows' audit
    hosts: dict[str, Any] = field(default_factory=dict)  # harness.chaos.hosts' summary

    def per_kind(self) -> list[tuple[str, str, int, int]]:
        """(label, kind, duplicates, lost) for each kind the run proposes."""
        audit = self.audit
        rows = []
        for label, kind in (
            ("refunds", ActionKind.REFUND.value),
            ("adjustments", ActionKind.INVOICE_ADJUSTMENT.value),
            ("supplier emails", ActionKind.SUPPLIER_EMAIL.value),
        ):
            duplicates = audit.duplicates_by_kind.get(kind, 0) if audit else -1
            lost = audit.lost_by_kind.get(kind, 0) if audit else -1
            rows.append((label, kind, duplicates, lost))
        return rows

    @property
    def ok(self) -> bool:
        return (
            self.drained
            and self.audit is not None
            and self.audit.ok
            and not self.accounting_problems
            and self.ambiguous_unowned == 0
            and not self.money_mismatches
            and self.webhooks.get("pending", 0) == 0
            and self.workflows.get("ok", True)
            and self.hosts_ok
        )

    @property
    def hosts_ok(self) -> bool:
        """A lost host came back, and the sweeps never went stale while the survivor ran alone."""
        if not self.hosts.get("lost"):
            return True
        lost = next(host for host in self.hosts["hosts"] if host["name"] == self.hosts["lost"])
        return lost["back_at"] is not None and bool(self.hosts.get("sweeps_kept_running"))

    def work(self) -> int:
        """Everything the run proposed: single actions, emails and workflows."""
        return self.proposed + self.adjustments_proposed + self.emails_proposed + self.workflows.get("proposed", 0)

    def lines(self) -> list[str]:
        audit = self.audit
        states = ", ".join(f"{k} {v}" for k, v in sorted((audit.states if audit else {}).items()))
        throughput = (audit.actions / self.seconds) if audit and self.seconds else 0.0
        out = [
            "chaos run report",
            f"  actions          {audit.actions if audit else 0} ({self.proposed} refunds, {self.adjustments_proposed} "
            f"invoice adjustments and {self.emails_proposed} emails proposed, {self.proposal_errors} proposal errors)",
            f"  effects          {audit.effects if audit else 0} at the receivers (refunds, credit notes and messages)",
            f"  duplicates       {audit.duplicates if audit else '?'}   (must be 0)",
            f"  lost             {audit.lost if audit else '?'}   (must be 0)",
            *(
                f"    {label:<15} {kind_states(audit, kind)}; duplicates {dup}, lost {lost} (must be 0)"
                for label, kind, dup, lost in self.per_kind()
            ),
            f"  drained          {'yes' if self.drained else 'NO: deadline passed'}",
            f"  states           {states}",
            f"  kills            {self.kills} workers by the run, {self.self_kills} at worker fault points, "
            f"{self.worker_exits} other worker exits",
            f"  dispatchers      {self.config.get('dispatchers', 0)} process(es) with "
            f"{self.config.get('dispatcher_concurrency', 0)} calls in flight each; "
            f"{self.dispatcher_claims} claims by them",
            f"  postgres         {self.postgres_restarts} restart(s); redis {self.redis_flushes} flush(es), "
            f"{self.redis_restarts} restart(s)",
            "  provider faults  " + ", ".join(f"{k} {v}" for k, v in sorted(self.faults_fired.items())),
            f"  outage           {self.outage_seconds:.0f} s of every lookup failing (creates too for the first "
            f"{self.config['outage_creates_seconds']:.0f} s); "
            f"{self.reached_review} action(s) reached NEEDS_REVIEW",
            "  finance          " + (", ".join(f"{k} {v}" for k, v in sorted(self.finance.items())) or "-"),
            f"  outside refunds  {self.outside_refunds} made at the provider, {self.outside_refunds_booked} booked "
            f"from webhooks; webhooks {self.webhooks.get('delivered', 0)}/{self.webhooks.get('events', 0)} "
            f"delivered in {self.webhooks.get('delivery_attempts', 0)} attempts, {self.webhooks.get('pending', '?')} "
            "pending (must be 0)",
            f"  money per order  {len(self.money_mismatches)} order(s) where the provider's refunds differ from "
            f"refunded + refunded outside (must be 0); {audit.targets if audit else 0} orders checked",
            f"  waiting          {audit.decisions_due if audit else 0} decision(s) due from a person who may make "
            f"them; {self.stale_by_policy} STALE after the policy's approval (must be 0)",
            f"  time             {self.seconds:.1f} s, {throughput:.1f} actions/s end to end",
            f"  emails           {self.emails_proposed} proposed, {self.messages_at_relay} messages at the relay, "
            f"{self.not_sent_retries} refused before DATA and sent again",
            "  mail faults      " + ", ".join(f"{k} {v}" for k, v in sorted(self.mail_faults_fired.items())),
            f"  ambiguous sends  {self.ambiguous_sends} held for a person ({self.ambiguous_unowned} without an owner: "
            f"must be 0); resolved: {self.resolved_confirmed} confirmed delivered, "
            f"{self.resolved_sent_again} sent again by decision",
            f"  repeats          {audit.repeats_by_decision if audit else '?'} by a person's decision "
            "(any other second message is a duplicate above)",
            f"  adjustments      {self.adjustments_proposed} proposed of "
            f"{round(self.config['actions'] * self.config['adjustment_share'])} planned; accounting ledger: "
            f"{self.credit_notes} credit note(s) on {self.bills_checked} bill(s), "
            f"{len(self.accounting_problems)} problem(s) (must be 0)",
            "  accounting faults " + ", ".join(f"{k} {v}" for k, v in sorted(self.accounting_faults_fired.items())),
            *workflow_report_lines(self.workflows, work=self.work()),
            *hosts_report_lines(self.hosts),
            f"  invariants       {'all hold' if audit and audit.ok and not self.accounting_problems else 'VIOLATED'}",
        ]
        if self.actions_before:
            out.append(
                f"  WARNING          the database held {self.actions_before} action(s) before this run; the audit "
                "reads only this run's receivers, so theirs show as violations: use a fresh database"
            )
        for violation in (audit.violations if audit else [])[:50]:
            out.append(f"    [{violation.invariant}] {violation.subject}: {violation.message}")
        for mismatch in self.money_mismatches[:20]:
            out.append(f"    [money] {mismatch}")
        for problem in self.accounting_problems[:20]:
            out.append(f"    [accounting ledger] {problem}")
        return out


def kind_states(audit: EffectsReport | None, kind: str) -> str:
    """How many actions of one kind the run made, for its line of the report."""
    count = audit.actions_by_kind.get(kind, 0) if audit is not None else 0
    return f"{count:>5} actions"


# --- processes -----------------------------------------------------------------------------


class Process:
    """A child process in its own session, so a kill takes its children (the pool) with it.

    Workers run Celery's prefork pool with one child: a fault point kills the child that runs
    the task, and Celery's reject_on_worker_lost must requeue the message (the production
    set-up under test); the run's own kills take the whole worker down.
    """

    def __init__(self, name: str, command: list[str], env: dict[str, str], log_path: Path, host: str = "") -> None:
        self.name = name
        self.host = host  # the simulated host it belongs to (harness.chaos.hosts)
        self.started = time.monotonic()
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


@dataclass
class _Storm:
    """Where the storm phase of a run stands: the next kill, the outage, the restarts done."""

    next_kill: float
    outside_total: int
    outage_over: bool
    outage_started: float | None = None
    creates_down: bool = False
    restarted: bool = False
    restarted_at: float | None = None
    flushed: bool = False


class ChaosRun:
    def __init__(self, config: ChaosConfig, *, workdir: Path | None = None) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="chaos-"))
        self.report = ChaosReport(config=vars(config).copy())
        self.workers: list[Process] = []
        self.dispatchers: list[Process] = []
        self.worker_numbers = itertools.count(1)
        self.others: list[Process] = []
        self.sandbox_url = ""
        self.accounting_url = ""  # empty: no adjustments in this run
        self.adjustment_proposals: list[tuple[str, int, str]] = []
        self.workflow_chaos = WorkflowChaos(self)
        self.mail_url = ""
        self.mail_smtp_port = 0
        self.stamp = ""
        self.web_url = ""  # the web process the sandbox's webhooks go to (the host never lost)
        self.token = ""
        # Simulated hosts (harness.chaos.hosts): the first is the one lost in the hosts mode, the
        # last the one whose clock is skewed. A single-host run has one, with no skew.
        self.hosts = (
            [
                Host(name=chr(ord("a") + index), skew_seconds=config.skew_seconds if index == config.hosts - 1 else 0)
                for index in range(config.hosts)
            ]
            if config.hosts > 1
            else [Host(name="a")]
        )
        self.api_url = round_robin(lambda: [host.web_url for host in self.hosts])
        self.started = time.monotonic()
        self.sampler: ScheduleSampler | None = None
        self.drain_at: float | None = None
        self.loss_due_at: float | None = None  # when the host's loss became due (time.monotonic())
        self.lock = threading.Lock()
        db = connection.settings_dict
        self.database_url = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
        self.broker_url = settings.CELERY_BROKER_URL

    # --- set-up ------------------------------------------------------------------------------

    def environment(self, *, fault_points: str = "", host: Host | None = None) -> dict[str, str]:
        """The processes' environment; a host's processes also carry its name and its clock's skew."""
        c = self.config
        on_host = {HOST_ENV: host.name, **skew_environment(host.skew_seconds)} if host is not None else {}
        return {
            **os.environ,
            **on_host,
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
            "KEY_RETENTION_MARGIN_SECONDS": "5",
            "LEASE_SECONDS": str(c.lease_seconds),
            "SWEEP_INTERVAL_SECONDS": str(c.sweep_interval_seconds),
            "RECONCILE_BASE_BACKOFF_SECONDS": "1",
            "RECONCILE_MAX_FAILURES": str(c.reconcile_max_failures),
            "API_RATE_LIMIT_PER_MINUTE": "1000000",
            "CONSOLE_FAULT_POINTS": fault_points,
            "DISPATCH_PUBLISH": "0" if c.dispatchers else "1",
            "EMAIL_BACKEND": "actions.providers.mail.backend.EmailBackend",
            "EMAIL_HOST": "127.0.0.1",
            "EMAIL_PORT": str(self.mail_smtp_port),
            "EMAIL_TIMEOUT": str(c.provider_timeout_seconds),
            "MAIL_SANDBOX_URL": self.mail_url,
            "PROVIDER_WEBHOOK_SECRET": WEBHOOK_SECRET,
            "SECRET_KEY": WEB_SECRET_KEY,
            # The accounting system: the same shrunk timings as the payment provider's.
            "ACCOUNTING_API_BASE": self.accounting_url,
            "ACCOUNTING_TIMEOUT_SECONDS": str(c.provider_timeout_seconds),
            "ACCOUNTING_KEY_RETENTION_SECONDS": str(c.key_retention_seconds),
            "ACCOUNTING_LOOKUP_VISIBILITY_DELAY_SECONDS": str(c.visibility_delay_seconds),
        }

    def _checks(self) -> None:
        if connection.vendor != "postgresql":
            raise RuntimeError("the chaos run needs PostgreSQL: set DATABASE_URL=postgres://...")
        if not self.broker_url.startswith("redis://"):
            raise RuntimeError("the chaos run needs a Redis broker: set CELERY_BROKER_URL=redis://...")
        if self.config.restart_postgres:
            # Before anything starts: a cluster name that does not exist would fail a third of
            # the way into the run.
            postgres_restart_command()
        c = self.config
        if c.hosts < 1:
            raise RuntimeError(f"hosts={c.hosts}: a run needs at least one host")
        if c.hosts == 1 and (c.lose_host_at or c.skew_seconds):
            raise RuntimeError("losing a host or skewing a host's clock needs the hosts mode: hosts=2 or more")
        if not 0 <= c.lose_host_at < 1:
            raise RuntimeError(f"lose_host_at={c.lose_host_at}: a share of the actions, at least 0 and below 1")
        for host in self.hosts:
            if host.skew_seconds:
                # Fails here, naming the package, if libfaketime is missing; then checks that the
                # skew really applies to a process started with the host's environment.
                host.measured_skew = measured_skew(self.environment(host=host))
                if abs(host.measured_skew - host.skew_seconds) > 5:
                    raise RuntimeError(
                        f"host {host.name}: its clock should be {host.skew_seconds:+d} s off, a process started "
                        f"with its environment sees {host.measured_skew:+.1f} s: libfaketime is not preloaded"
                    )

    def start_sandbox(self) -> None:
        port = _free_port()
        self.sandbox_url = f"http://127.0.0.1:{port}"
        process = Process(
            "sandbox",
            [
                sys.executable,
                "-m",
                "harness.sandboxes.payment",
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

    def start_accounting_sandbox(self) -> None:
        """The accounting sandbox (the invoice adjustments' receiver), with the run's key retention and lookup lag; this
        process's accounting settings point at it too (finance's lookups, the audit's ledger)."""
        port = _free_port()
        self.accounting_url = f"http://127.0.0.1:{port}"
        self.others.append(
            Process(
                "accounting-sandbox",
                [
                    sys.executable,
                    "-m",
                    "harness.sandboxes.accounting",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--db",
                    str(self.workdir / "accounting-sandbox.sqlite3"),
                    "--fault-seed",
                    str(self.config.seed),
                    "--key-retention-seconds",
                    str(self.config.key_retention_seconds),
                    "--lookup-visibility-delay-seconds",
                    str(self.config.visibility_delay_seconds),
                ],
                self.environment(),
                self.workdir / "accounting-sandbox.log",
            )
        )
        _wait_for(lambda: self._healthy(f"{self.accounting_url}/_sandbox/health"), 30, "the accounting sandbox")
        settings.ACCOUNTING_API_BASE = self.accounting_url
        settings.ACCOUNTING_TIMEOUT_SECONDS = self.config.provider_timeout_seconds
        settings.ACCOUNTING_KEY_RETENTION_SECONDS = self.config.key_retention_seconds
        settings.ACCOUNTING_LOOKUP_VISIBILITY_DELAY_SECONDS = self.config.visibility_delay_seconds
        accounting_from_settings.cache_clear()

    def _fault_sandboxes(self) -> list[tuple[str, tuple[str, ...]]]:
        """(control URL, create fault modes) of each receiver that takes the run's faults."""
        sandboxes: list[tuple[str, tuple[str, ...]]] = [(f"{self.sandbox_url}/_sandbox", CREATE_FAULT_MODES)]
        if self.accounting_url:
            sandboxes.append((f"{self.accounting_url}/_sandbox", ACCOUNTING_CREATE_FAULT_MODES))
        return sandboxes

    def start_mail_sandbox(self) -> None:
        self.mail_smtp_port = _free_port()
        http_port = _free_port()
        self.mail_url = f"http://127.0.0.1:{http_port}"
        self.others.append(
            Process(
                "mail-sandbox",
                [
                    sys.executable,
                    "-m",
                    "harness.sandboxes.mail",
                    "--smtp-port",
                    str(self.mail_smtp_port),
                    "--http-port",
                    str(http_port),
                    "--db",
                    str(self.workdir / "mail-sandbox.sqlite3"),
                    "--fault-seed",
                    str(self.config.seed),
                ],
                self.environment(),
                self.workdir / "mail-sandbox.log",
            )
        )
        _wait_for(lambda: self._healthy(f"{self.mail_url}/health"), 30, "the mail sandbox")
        # This process sends too (finance's "send again" after the drain).
        settings.EMAIL_BACKEND = "actions.providers.mail.backend.EmailBackend"
        settings.EMAIL_HOST = "127.0.0.1"
        settings.EMAIL_PORT = self.mail_smtp_port
        settings.EMAIL_TIMEOUT = self.config.provider_timeout_seconds
        settings.MAIL_SANDBOX_URL = self.mail_url

    def _suffix(self, host: Host) -> str:
        return f"-{host.name}" if len(self.hosts) > 1 else ""

    def start_host_web(self, host: Host) -> None:
        """A host's web process; one that comes back keeps its address."""
        host.web_port = host.web_port or _free_port()
        name = f"web{self._suffix(host)}"
        host.web = Process(
            name,
            [sys.executable, "manage.py", "runserver", f"127.0.0.1:{host.web_port}", "--noreload", "--nothreading"],
            {**self.environment(host=host), "DEBUG": "0"},
            self.workdir / f"{name}.log",
            host=host.name,
        )

    def wait_host_web(self, host: Host) -> None:
        _wait_for(lambda: self._healthy(f"{host.web_url}/api/v1/openapi.json"), 90, f"host {host.name}'s web server")

    def start_web(self) -> None:
        for host in self.hosts:
            self.start_host_web(host)
        for host in self.hosts:
            self.wait_host_web(host)
        # The webhooks go to the host that is never lost (the last one).
        self.web_url = self.hosts[-1].web_url
        # The sandbox signs its events for the web server's endpoint, and retries until a 2xx.
        _http(
            "POST",
            f"{self.sandbox_url}/_sandbox/webhooks",
            {
                "url": f"{self.web_url}/webhooks/stripe",
                "secret": WEBHOOK_SECRET,
                "retry_max_seconds": 5,
                # charge.refunded repeats what refund.created says (tested on its own); leaving it
                # out halves the events the single-threaded web server of the run must take.
                "enabled_events": ["refund.created", "refund.updated", "refund.failed"],
            },
        )

    @staticmethod
    def _healthy(url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def start_worker(self, *, with_faults: bool = True, host: Host | None = None) -> Process:
        host = host or self.hosts[0]
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
            self.environment(fault_points=points, host=host),
            self.workdir / f"{name}.log",
            host=host.name,
        )
        self.workers.append(process)
        return process

    def start_dispatcher(self, *, with_faults: bool = True, host: Host | None = None) -> Process:
        """A dispatcher process: batched claims, many calls in flight, the workers' fault points
        (one kill takes every call it has in flight down with it)."""
        host = host or self.hosts[0]
        p = self.config.worker_fault_probability
        points = ",".join(f"{name}@{p}" for name in WORKER_FAULT_POINTS) if with_faults and p > 0 else ""
        name = f"dispatcher{next(self.worker_numbers)}"
        concurrency = self.config.dispatcher_concurrency
        process = Process(
            name,
            [
                sys.executable,
                "manage.py",
                "dispatcher",
                "--concurrency",
                str(concurrency),
                "--batch",
                str(concurrency),
                "--idle",
                "0.05",
            ],
            self.environment(fault_points=points, host=host),
            self.workdir / f"{name}.log",
            host=host.name,
        )
        self.dispatchers.append(process)
        return process

    def _replace(self, process: Process, *, with_faults: bool) -> None:
        """Start a fresh process of the same kind in place of one that died or was killed."""
        host = self._host(process.host)
        if process in self.dispatchers:
            self.dispatchers.remove(process)
            self.start_dispatcher(with_faults=with_faults, host=host)
        else:
            self.workers.remove(process)
            self.start_worker(with_faults=with_faults, host=host)

    def _host(self, name: str) -> Host:
        return next((host for host in self.hosts if host.name == name), self.hosts[0])

    def start_periodic_worker(self, host: Host | None = None) -> None:
        """A host's worker for the periodic tasks' queue (settings.PERIODIC_QUEUE), as production
        runs one beside beat, so that the sweeps never wait behind the dispatches queued for the
        run's workers. No fault points and none of the run's random kills: it goes down with its
        host. Prefork (Celery's time limits apply), with ``periodic_concurrency`` children."""
        host = host or self.hosts[0]
        name = f"periodic{self._suffix(host)}"
        host.periodic = Process(
            name,
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "console",
                "worker",
                "--queues",
                settings.PERIODIC_QUEUE,
                "--pool",
                "prefork",
                "--concurrency",
                str(self.config.periodic_concurrency),
                "--loglevel",
                "INFO",
                "--hostname",
                f"{name}@%h",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ],
            self.environment(host=host),
            self.workdir / f"{name}.log",
            host=host.name,
        )

    def start_beat(self, host: Host | None = None) -> None:
        """A host's ``celery beat``: every host runs one, and each periodic task claims its period
        in the database (actions.foundation.schedule)."""
        host = host or self.hosts[0]
        name = f"beat{self._suffix(host)}"
        host.beat = Process(
            name,
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
                str(self.workdir / f"{name}-schedule"),
            ],
            self.environment(host=host),
            self.workdir / f"{name}.log",
            host=host.name,
        )

    def seed(self) -> list[tuple[str, int, str, str]]:
        """Orders, charges, refund requests, an agent with a token and a scripted manager."""
        self.report.actions_before = Action.objects.count()
        ensure_roles()
        user_model = get_user_model()
        owner, _ = user_model.objects.get_or_create(username="chaos.owner")
        manager, _ = user_model.objects.get_or_create(username="chaos.manager")
        manager.groups.add(Group.objects.get(name="manager"))
        ApprovalLimit.objects.get_or_create(user=manager, currency="EUR", defaults={"max_amount": Decimal("100000")})
        finance, _ = user_model.objects.get_or_create(username="chaos.finance")
        finance.groups.add(Group.objects.get(name="finance"))
        # Accounts payable owns the adjustments that escalate (the kind's owner group).
        payable, _ = user_model.objects.get_or_create(username="chaos.payable")
        payable.groups.add(Group.objects.get(name=ACCOUNTS_PAYABLE))
        self.manager = manager
        self.finance = finance
        supplier, _ = Supplier.objects.get_or_create(code=CHAOS_SUPPLIER, defaults={"name": "Chaos Supplies"})
        SupplierContact.objects.get_or_create(supplier=supplier, email=CHAOS_CONTACT)
        agent = agent_create(
            name=f"chaos-bot-{self.config.seed}-{int(time.time())}",
            owner=owner,
            scopes=["refund", ActionKind.SUPPLIER_EMAIL.value, INVOICE_ADJUSTMENT_SCOPE],
        )
        self.token = agent_token_issue(agent=agent).plain

        proposals: list[tuple[str, int, str, str]] = []
        self.charges: list[str] = []
        stamp = f"{int(time.time()) % 100000:05d}"
        self.stamp = stamp
        per_order = 2
        orders = (self.config.refunds + per_order - 1) // per_order
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
            self.charges.append(order.charge_reference)
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
                if len(proposals) >= self.config.refunds:
                    break
                RefundRequest.objects.create(order=order, number=request_number)
                large = self.rng.random() < self.config.manager_share
                if large:
                    amount = f"{self.rng.randint(40, 90)}.00"
                else:
                    amount = f"{self.rng.randint(1, 24)}.{self.rng.randint(0, 99):02d}"
                proposals.append((number, request_number, amount, "damaged"))
        self.adjustment_proposals = self.seed_bills()
        self.workflow_chaos.seed()
        return proposals

    def seed_bills(self) -> list[tuple[str, int, str]]:
        """Supplier bills in both systems (the console's Bill and the accounting sandbox's
        invoice), two adjustment requests each, and one proposal per request: mostly small
        (auto-approved under the kind's threshold and per-bill cap), some for the manager."""
        proposals: list[tuple[str, int, str]] = []
        if not self.config.adjustments:
            return proposals
        per_bill = 2
        bills = (self.config.adjustments + per_bill - 1) // per_bill
        for index in range(bills):
            number = f"CB{self.stamp}-{index:05d}"
            bill = Bill.objects.create(
                number=number,
                supplier_name="Chaos Supplies",
                currency="EUR",
                amount=Decimal("200.00"),
                amount_due=Decimal("200.00"),
                accounting_reference=f"inv-chaos-{self.stamp}-{index:05d}",
                purchase_order=f"PO-{number}",
                po_mismatch={"summary": "Chaos run: unit price above the purchase order."},
                issued_at=_now() - timedelta(days=1),
            )
            _http(
                "POST",
                f"{self.accounting_url}/_sandbox/invoices",
                {
                    "InvoiceID": bill.accounting_reference,
                    "InvoiceNumber": bill.number,
                    "Contact": bill.supplier_name,
                    "CurrencyCode": "EUR",
                    "Total": "200.00",
                },
            )
            for request_number in range(1, per_bill + 1):
                if len(proposals) >= self.config.adjustments:
                    break
                AdjustmentRequest.objects.create(bill=bill, number=request_number)
                # Two adjustments on a bill of 200.00 never exceed it: at most 2 x 90.00.
                if self.rng.random() < self.config.manager_share:
                    amount = f"{self.rng.randint(55, 90)}.00"
                else:
                    amount = f"{self.rng.randint(1, 24)}.{self.rng.randint(0, 99):02d}"
                proposals.append((number, request_number, amount))
        return proposals

    # --- chaos -------------------------------------------------------------------------------

    def collect_fired(self) -> None:
        """Add the sandboxes' fault counts to the report; clearing the faults resets them."""
        fired = _http("GET", f"{self.sandbox_url}/_sandbox/faults").get("fired", {})
        for mode, count in fired.items():
            self.report.faults_fired[str(mode)] = self.report.faults_fired.get(str(mode), 0) + int(count)
        if self.accounting_url:
            fired = _http("GET", f"{self.accounting_url}/_sandbox/faults").get("fired", {})
            tally = self.report.accounting_faults_fired
            for mode, count in fired.items():
                tally[str(mode)] = tally.get(str(mode), 0) + int(count)

    def receiver_outage(self, *, creates: bool) -> None:
        """Every lookup fails before anything is read, and with ``creates`` every create fails
        before anything is stored too (a provider outage); otherwise creates see the run's usual
        faults (the provider's lookups still down: the tail of the outage)."""
        self.collect_fired()
        self.configure_faults(on=not creates, mail=False)
        targets = ("create", "lookup") if creates else ("lookup",)
        # Both receivers go down together: adjustments escalate to accounts payable as refunds do to finance.
        for control, _modes in self._fault_sandboxes():
            for target in targets:
                _http(
                    "POST",
                    f"{control}/faults",
                    {"applies_to": target, "probabilities": {"fail_before_commit": 1.0}},
                )

    def _outage_may_end(self, started: float) -> bool:
        """The outage lasts its configured time and then until some actions have escalated to
        NEEDS_REVIEW (how long that takes depends on how many the workers must reconcile), up
        to four times its configured time."""
        elapsed = time.monotonic() - started
        if elapsed < self.config.outage_seconds:
            return False
        if elapsed >= 4 * self.config.outage_seconds:
            return True
        in_review = _db_retry(lambda: Action.objects.filter(status=ActionStatus.NEEDS_REVIEW).count())
        return bool(in_review >= self.config.outage_min_review)

    def outside_refund(self) -> None:
        """A refund made at the provider without the console, on an order not used before."""
        if not self.charges:
            return
        charge = self.charges.pop(self.rng.randrange(len(self.charges)))
        body = {
            "charge": charge,
            # Orders capture 200.00 and the run refunds at most 2 x 90.00 on one: 10.00 always fits.
            "amount": self.rng.randint(100, 1000),
            "status": "pending" if self.rng.random() < 0.2 else "succeeded",
        }
        with contextlib.suppress(urllib.error.URLError, OSError):
            _http("POST", f"{self.sandbox_url}/_sandbox/outside_refunds", body)
            self.report.outside_refunds += 1

    def configure_faults(self, on: bool, *, mail: bool = True) -> None:
        """Switch the sandboxes' faults on or off. ``mail=False`` leaves the mail sandbox's faults
        as they are: the payment provider's outage is no reason to stop the mail faults."""
        for control, _modes in self._fault_sandboxes():
            _http("DELETE", f"{control}/faults")
        if mail:
            _http("DELETE", f"{self.mail_url}/faults")
        if not on:
            return
        c = self.config
        for control, create_modes in self._fault_sandboxes():
            create: dict[str, Any] = {
                "seed": c.seed,
                "applies_to": "create",
                "sleep_seconds": c.provider_timeout_seconds + 0.5,
                "probabilities": dict.fromkeys(create_modes, c.create_fault_probability),
            }
            if "pending" in create_modes:
                create["settle_after_seconds"] = 3
            _http("POST", f"{control}/faults", create)
            _http(
                "POST",
                f"{control}/faults",
                {
                    "applies_to": "lookup",
                    "sleep_seconds": c.provider_timeout_seconds + 0.5,
                    "probabilities": dict.fromkeys(LOOKUP_FAULT_MODES, c.lookup_fault_probability),
                },
            )
        for mode in MAIL_FAULT_MODES if mail else ():
            _http("POST", f"{self.mail_url}/faults", {"mode": mode, "probability": c.mail_fault_probability})

    def propose_all(self, proposals: list[tuple[str, int, str, str]]) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}

        def propose(item: tuple[str, int, str, str]) -> None:
            order_number, request_number, amount, reason = item
            body = {
                "order_number": order_number,
                "request_number": request_number,
                "amount": amount,
                "currency": "EUR",
                "reason_code": reason,
                "evidence": "chaos run",
            }
            # An agent's retry is always safe: the same proposal returns the same action.
            for _attempt in range(20):
                try:
                    _http("POST", f"{self.api_url()}/api/v1/refunds", body, headers)
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

        def propose_email(number: int) -> None:
            body = {
                "supplier": CHAOS_SUPPLIER,
                "reference": f"bill-{self.stamp}-{number:05d}",
                "template": "bill_adjusted",
                "parameters": {
                    "supplier_name": "Chaos Supplies",
                    "bill_number": f"CB-{number}",
                    "amount": "10.00",
                    "currency": "EUR",
                    "reason": "chaos run",
                },
                "to": CHAOS_CONTACT,
            }
            for _attempt in range(20):
                try:
                    _http("POST", f"{self.api_url()}/api/v1/supplier-emails", body, headers)
                    with self.lock:
                        self.report.emails_proposed += 1
                    return
                except urllib.error.HTTPError as error:
                    # A 5xx (the database restarting) is retried like the refunds: the same
                    # proposal returns the same action.
                    if error.code < 500:
                        with self.lock:
                            self.report.proposal_errors += 1
                        return
                except (urllib.error.URLError, OSError):
                    pass
                time.sleep(0.5)
            with self.lock:
                self.report.proposal_errors += 1

        def propose_adjustment(item: tuple[str, int, str]) -> None:
            bill_number, adjustment_number, amount = item
            body = {
                "bill_number": bill_number,
                "adjustment_number": adjustment_number,
                "amount": amount,
                "currency": "EUR",
                "reason_code": "price_mismatch",
                "evidence": "chaos run",
            }
            for _attempt in range(20):
                try:
                    _http("POST", f"{self.api_url()}/api/v1/invoice-adjustments", body, headers)
                    with self.lock:
                        self.report.adjustments_proposed += 1
                    return
                except urllib.error.HTTPError as error:
                    # A 5xx (the database restarting) is retried: the same proposal returns the same action.
                    if error.code < 500:
                        with self.lock:
                            self.report.proposal_errors += 1
                        return
                except (urllib.error.URLError, OSError):
                    pass
                time.sleep(0.5)
            with self.lock:
                self.report.proposal_errors += 1

        # Refunds, adjustments and emails interleaved, so every kind is in flight through every
        # kill, fault, restart and outage of the run (emails queued after everything else were
        # sent during the drain, with the mail faults already off).
        mixed: list[Callable[[], None]] = [functools.partial(propose, item) for item in proposals]
        mixed = _interleave(mixed, [functools.partial(propose_adjustment, item) for item in self.adjustment_proposals])
        mixed = _interleave(mixed, [functools.partial(propose_email, number) for number in range(self.config.emails)])
        mixed = _interleave(mixed, self.workflow_chaos.jobs())
        with ThreadPoolExecutor(max_workers=self.config.proposers) as pool:
            futures = [pool.submit(job) for job in mixed]
            for future in futures:
                future.result()

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
        self.workflow_chaos.approve_waiting()

    def restart_postgres(self) -> None:
        subprocess.run(
            postgres_restart_command(),
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

    def restart_redis(self) -> None:
        """Stop the broker's Redis without saving and start it again: every connection drops and
        every queued or unacknowledged message is gone, as after a crash of a non-persistent Redis."""
        import redis

        address = urlsplit(self.broker_url)
        host, port = address.hostname or "127.0.0.1", str(address.port or 6379)
        # SHUTDOWN closes the connection it came on: redis-cli then reports an error, as expected.
        subprocess.run(["redis-cli", "-h", host, "-p", port, "shutdown", "nosave"], capture_output=True, timeout=30)
        # The old server may still hold the port for a moment after redis-cli returns; a new one
        # started then fails to bind in the background (it daemonizes first) and the old one
        # answers the ping below. Wait until nothing answers.
        deadline = time.monotonic() + 30
        while True:
            try:
                redis.Redis.from_url(self.broker_url, socket_connect_timeout=1).ping()
            except redis.ConnectionError:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the broker's Redis at {host}:{port} still answers after SHUTDOWN")
            time.sleep(0.1)
        subprocess.run(
            ["redis-server", "--daemonize", "yes", "--bind", host, "--port", port, "--save", "", "--appendonly", "no"],
            check=True,
            capture_output=True,
            timeout=30,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                redis.Redis.from_url(self.broker_url).ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        self.report.redis_restarts += 1

    def _emails(self) -> Any:
        return Action.objects.filter(
            action_id__startswith=f"{ActionKind.SUPPLIER_EMAIL}:{CHAOS_SUPPLIER}:bill-{self.stamp}-"
        )

    def _adjustments(self) -> Any:
        return Action.objects.filter(action_id__startswith=f"{ActionKind.INVOICE_ADJUSTMENT}:bill-CB{self.stamp}-")

    def _run_actions(self) -> Any:
        # This run's own orders only: a database that held an earlier run keeps its actions.
        refunds = Action.objects.filter(order__number__startswith=f"C{self.stamp}-")
        return refunds | self._emails() | self._adjustments() | self.workflow_chaos.children()

    def _proposed(self) -> int:
        return self.report.proposed + self.report.adjustments_proposed + self.report.emails_proposed

    def counts(self) -> tuple[int, int]:
        def query() -> tuple[int, int]:
            total = self._run_actions().count()
            final = self._run_actions().filter(status__in=FINAL_STATUSES).count()
            return total, final

        return _db_retry(query)

    def progress(self, phase: str) -> None:
        """A one-line progress bar on stderr (the report itself goes to ``out``)."""
        total, final = self.counts()
        width = 30
        planned = self.config.actions + self.config.emails
        done = int(width * final / max(planned, 1))
        alive = sum(1 for w in self.workers if w.alive)
        sys.stderr.write(
            f"\r[{'#' * done}{'.' * (width - done)}] {final}/{planned} final, "
            f"{total} proposed  "
            f"{phase:<9} workers {alive}  kills {self.report.kills}+{self.report.self_kills}   "
        )
        sys.stderr.flush()

    # --- the run -----------------------------------------------------------------------------

    def run(self) -> ChaosReport:
        self._checks()
        started = self.started = time.monotonic()
        schedule = _override(CELERY_BEAT_SCHEDULE=self._run_schedule())
        schedule.__enter__()
        try:
            proposals = self._start_everything()
            if len(self.hosts) > 1:
                self.sampler = ScheduleSampler(started=started, every=1.0)
                self.sampler.start()
            self._storm(proposals, started=started)
            self._drain()
            sys.stderr.write("\n")
            self.report.seconds = time.monotonic() - started
            self._summarize_hosts()
            self._count_self_kills()
            return self._audit()
        finally:
            if self.sampler is not None:
                self.sampler.stop()
            schedule.__exit__()
            hosts = [process for host in self.hosts for process in host.own_processes()]
            for process in [*self.workers, *self.dispatchers, *hosts, *self.others]:
                process.stop()

    def _run_schedule(self) -> dict[str, Any]:
        """The beat schedule as the run's processes have it (their SWEEP_INTERVAL_SECONDS), so
        that this process reads the schedule's liveness against the run's own intervals."""
        ours = float(settings.SWEEP_INTERVAL_SECONDS)
        schedule: dict[str, dict[str, Any]] = settings.CELERY_BEAT_SCHEDULE
        return {
            name: {**entry, "schedule": float(self.config.sweep_interval_seconds)}
            if float(entry["schedule"]) == ours
            else entry
            for name, entry in schedule.items()
        }

    def _summarize_hosts(self) -> None:
        if len(self.hosts) > 1:
            if self.sampler is not None:
                self.sampler.stop()
                self.sampler.dump(str(self.workdir / "schedule-samples.jsonl"))
            self.report.hosts = hosts_summary(
                self.hosts,
                self.sampler,
                interval=float(self.config.sweep_interval_seconds),
                drain_at=self.drain_at,
                ended_at=time.monotonic() - self.started,
            )

    def _elapsed(self) -> float:
        return time.monotonic() - self.started

    def start_host_processes(self, host: Host, *, with_faults: bool) -> None:
        """A host's workers, dispatchers, periodic worker and beat (its web process is started on
        its own)."""
        for _ in range(self.config.workers):
            self.start_worker(with_faults=with_faults, host=host)
        for _ in range(self.config.dispatchers):
            self.start_dispatcher(with_faults=with_faults, host=host)
        self.start_periodic_worker(host)
        self.start_beat(host)

    def lose_host(self, host: Host) -> None:
        """SIGKILL every process of the host in the same instant: web, workers, dispatchers, the
        periodic worker, beat."""
        mine = [process for process in [*self.workers, *self.dispatchers] if process.host == host.name]
        processes = [*mine, *host.own_processes()]
        host.processes_killed = kill_host(processes)
        host.killed_at = self._elapsed()
        host.up = False
        self.workers = [process for process in self.workers if process.host != host.name]
        self.dispatchers = [process for process in self.dispatchers if process.host != host.name]

    def restore_host(self, host: Host, *, with_faults: bool) -> None:
        """The lost host comes back: every one of its processes started again, its web at the
        same address."""
        self.start_host_web(host)
        self.start_host_processes(host, with_faults=with_faults)
        host.back_at = self._elapsed()
        host.up = True

    def _host_loss_pending(self) -> bool:
        """The hosts mode loses a host during the storm: the storm goes on until it is back."""
        lost = self.hosts[0]
        return len(self.hosts) > 1 and bool(self.config.lose_host_at) and lost.back_at is None

    def _hosts_step(self, *, with_faults: bool, storm: _Storm | None = None) -> None:
        """The first host is lost once its share of the actions exists (not within five seconds
        of the PostgreSQL restart, so that the survivor's sweeps are judged on the host's loss
        alone), and comes back after the configured time. Only the storm loses it (``storm``);
        the drain only brings it back."""
        c = self.config
        host = self.hosts[0]
        if len(self.hosts) < 2 or not c.lose_host_at:
            return
        if host.killed_at is None:
            if storm is None:
                return
            total, _final = self.counts()
            settled = storm.restarted_at is None or time.monotonic() - storm.restarted_at >= 5
            due = c.restart_postgres and not storm.restarted
            if total < c.actions * c.lose_host_at or not settled or due:
                return
            self.loss_due_at = self.loss_due_at or time.monotonic()
            # The survivors' workers have been up a while (started, imported, consuming) and the
            # schedule runs (every sweep finished within its threshold): a survivor whose only
            # worker was killed just before, or a schedule not yet started, would be measured
            # instead of the host's loss. Past SURVIVOR_WAIT_SECONDS the host is lost anyway,
            # and the report shows what the survivor did.
            ready = all(
                time.monotonic() - process.started >= SURVIVOR_READY_SECONDS
                for process in self.workers
                if process.host != host.name
            ) and (self.sampler is None or self.sampler.fresh())
            if ready or time.monotonic() - self.loss_due_at >= SURVIVOR_WAIT_SECONDS:
                self.lose_host(host)
        elif host.back_at is None and self._elapsed() - host.killed_at >= c.host_back_after_seconds:
            self.restore_host(host, with_faults=with_faults)

    def _start_everything(self) -> list[tuple[str, int, str, str]]:
        """The receivers' sandboxes, the seeded orders, the web process, the workers, the
        dispatchers and beat; returns the proposals the run will make."""
        # The run owns its broker database: messages left by an earlier run (for actions of
        # another database) would only delay this one.
        import redis

        redis.Redis.from_url(self.broker_url).flushdb()
        self.start_sandbox()
        if self.config.adjustments:
            self.start_accounting_sandbox()
        self.start_mail_sandbox()
        proposals = self.seed()
        self.start_web()
        self.configure_faults(on=True)
        for host in self.hosts:
            self.start_host_processes(host, with_faults=True)
        return proposals

    def _storm(self, proposals: list[tuple[str, int, str, str]], *, started: float) -> None:
        """The proposals flow in while workers are killed, the receivers fail and go down, refunds
        are made outside the console, and the database and the broker restart."""
        proposer = threading.Thread(target=self.propose_all, args=(proposals,), daemon=True)
        proposer.start()
        storm = _Storm(
            next_kill=time.monotonic() + self.config.kill_every_seconds,
            outside_total=int(len(self.charges) * self.config.outside_refund_share),
            outage_over=self.config.outage_seconds <= 0,
        )
        while proposer.is_alive() or self.counts()[1] < self._proposed() * 0.6 or self._host_loss_pending():
            total, _final = self.counts()
            # Outside refunds keep pace with the proposals, so they land on orders under way.
            due_outside = storm.outside_total * min(total / max(self.config.actions, 1), 1.0)
            while self.report.outside_refunds < due_outside and self.charges:
                self.outside_refund()
            self._outage_step(storm, total)
            self.approve_waiting()
            self._reap(with_faults=True)
            # From the moment a host's loss is due until it is back, the run kills none of the
            # survivors' workers: what is measured then is the survivors' taking over, not a
            # survivor left without a worker.
            quiet = self.loss_due_at is not None and not all(host.up for host in self.hosts)
            quiet = quiet or (self.loss_due_at is not None and self.hosts[0].killed_at is None)
            if time.monotonic() >= storm.next_kill and self.workers and not quiet:
                victim = self.rng.choice(self.workers + self.dispatchers)
                victim.kill()
                self.report.kills += 1
                self._replace(victim, with_faults=True)
                storm.next_kill = time.monotonic() + self.config.kill_every_seconds
            self._restarts_step(storm)
            self._hosts_step(with_faults=True, storm=storm)
            self.progress("chaos")
            time.sleep(0.5)
            if time.monotonic() - started > self.config.drain_deadline_seconds:
                break
        proposer.join(timeout=60)
        if storm.outage_started is not None and not storm.outage_over:
            self.report.outage_seconds = time.monotonic() - storm.outage_started

    def _outage_step(self, storm: _Storm, total: int) -> None:
        """The receivers' outage: it starts once its share of the actions is proposed, creates
        come back first, and the rest once the outage may end."""
        outage_due = total >= self.config.actions * self.config.outage_at_share
        if not storm.outage_over and storm.outage_started is None and outage_due:
            self.receiver_outage(creates=True)
            storm.outage_started = time.monotonic()
            storm.creates_down = True
        elif (
            storm.outage_started is not None
            and storm.creates_down
            and time.monotonic() - storm.outage_started >= self.config.outage_creates_seconds
        ):
            # Creates come back first: the actions the outage left UNKNOWN are bounded, so their
            # reconciliations fail often enough to escalate.
            self.receiver_outage(creates=False)
            storm.creates_down = False
        elif storm.outage_started is not None and not storm.outage_over and self._outage_may_end(storm.outage_started):
            self.collect_fired()
            self.configure_faults(on=True, mail=False)
            self.report.outage_seconds = time.monotonic() - storm.outage_started
            storm.outage_over = True

    def _restarts_step(self, storm: _Storm) -> None:
        """PostgreSQL restarts a third of the way in, the broker is flushed (or restarted) half way."""
        total, _final = self.counts()
        if self.config.restart_postgres and not storm.restarted and total >= self.config.actions // 3:
            self.restart_postgres()
            storm.restarted = True
            storm.restarted_at = time.monotonic()
        if self.config.flush_redis and not storm.flushed and total >= self.config.actions // 2:
            if self.config.restart_redis:
                self.restart_redis()
            else:
                self.flush_redis()
            storm.flushed = True

    def _drain(self) -> None:
        """No more injected faults or kills: fault-point workers are replaced with clean ones, and
        the run waits until every action is final and every workflow settled."""
        self.collect_fired()
        # The mail sandbox counts for the whole run (clearing its faults keeps the counts).
        mail_fired = _http("GET", f"{self.mail_url}/faults").get("fired", {})
        self.report.mail_faults_fired = {str(k): int(v) for k, v in mail_fired.items()}
        self.configure_faults(on=False)
        self.drain_at = self._elapsed()
        for worker in [*self.workers, *self.dispatchers]:
            worker.kill()
        self.workers.clear()
        self.dispatchers.clear()
        for host in self.hosts:
            if not host.up:
                continue
            for _ in range(self.config.workers):
                self.start_worker(with_faults=False, host=host)
            for _ in range(self.config.dispatchers):
                self.start_dispatcher(with_faults=False, host=host)
        deadline = time.monotonic() + self.config.drain_deadline_seconds
        while time.monotonic() < deadline:
            self.approve_waiting()
            self._reap(with_faults=False)
            # A host lost late in the storm comes back during the drain; the run is not drained
            # before it is back.
            self._hosts_step(with_faults=False)
            total, final = self.counts()
            self.progress("draining")
            hosts_back = all(host.up for host in self.hosts)
            if final >= total and total >= self._proposed() and self.workflow_chaos.settled() and hosts_back:
                self.report.drained = True
                break
            time.sleep(0.5)

    def _count_self_kills(self) -> None:
        # Each pool child a fault point killed left a line in its worker's log.
        self.report.self_kills += sum(
            log.read_text(errors="replace").count("fault point ")
            for pattern in ("worker*.log", "dispatcher*.log")
            for log in self.workdir.glob(pattern)
        )

    def _audit(self) -> ChaosReport:
        """Finance resolves what waits for a person, then every invariant is checked against the
        receivers' own ledgers."""
        provider = StripeProvider(
            api_key="sk_test_chaos",
            api_base=self.sandbox_url,
            timeout_seconds=30,
            key_retention=timedelta(seconds=self.config.key_retention_seconds),
            lookup_visibility_delay=timedelta(seconds=self.config.visibility_delay_seconds),
        )
        self.report.dispatcher_claims = _db_retry(
            lambda: ActionEvent.objects.filter(
                transition="begin_submission", actor_label=DISPATCHER_PROCESS.label
            ).count()
        )
        self.report.reached_review = _db_retry(
            lambda: (
                ActionEvent.objects.filter(to_state=ActionStatus.NEEDS_REVIEW).values("action_id").distinct().count()
            )
        )
        receivers: dict[str, Receiver] = {ActionKind.REFUND.value: RefundReceiver(provider)}
        if self.accounting_url:
            receivers[ActionKind.INVOICE_ADJUSTMENT.value] = AdjustmentReceiver(self._accounting_client())
        if self.config.finance_resolves:
            self.finance_resolve(receivers)
        ledger, workflow_resolutions = self._settled_ledger(provider, receivers)
        # The audit uses the run's own policy timings (leases, escalation) to judge "stuck".
        with _override(
            LEASE_SECONDS=self.config.lease_seconds,
            SWEEP_INTERVAL_SECONDS=self.config.sweep_interval_seconds,
            RECONCILE_BASE_BACKOFF_SECONDS=1,
            RECONCILE_MAX_FAILURES=self.config.reconcile_max_failures,
            PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS=self.config.visibility_delay_seconds,
        ):
            self.report.audit = _db_retry(lambda: check_effects(ledger=ledger))
        self.report.workflows = self.workflow_chaos.audit(ledger, workflow_resolutions)
        return self.report

    def _settled_ledger(
        self, provider: StripeProvider, receivers: dict[str, Receiver]
    ) -> tuple[list[Effect], dict[str, int]]:
        """Every receiver's ledger, read once nothing is moving any more; with the workflows'
        resolutions made on the way."""
        # The provider's lists lag by its lookup visibility delay: a refund created just before
        # the drain ended is not listed yet. Read the ledger only once the last change is older
        # than that delay, so the audit sees every effect.
        self._wait_until_ledger_settles()
        self._emails_resolve()
        mail_ledger = list(MailRelay(SmtpMailer(), self.mail_url).ledger())
        # Workflow emails held for a person are settled by their own clerk, then the workflows
        # they paused run on (compensating where a step failed) before the audit.
        workflow_resolutions = self.workflow_chaos.resolve_reviews(mail_ledger)
        self.workflow_chaos.wait_settled(self.config.drain_deadline_seconds)
        self._wait_until_ledger_settles()
        mail_ledger = list(MailRelay(SmtpMailer(), self.mail_url).ledger())
        self.report.messages_at_relay = len(mail_ledger)
        ledger = list(RefundReceiver(provider).ledger())
        # Reading the ledger settles what was due; its events go out now. Every event must have
        # reached the console before its bookings are judged.
        self._wait_for_webhooks()
        self.report.outside_refunds_booked = _db_retry(lambda: OutsideRefund.objects.filter(booked=True).count())
        self.report.money_mismatches = _db_retry(lambda: money_per_order(ledger))
        self.report.stale_by_policy = _db_retry(stale_by_policy_count)
        ledger += mail_ledger
        if self.accounting_url:
            ledger += list(receivers[ActionKind.INVOICE_ADJUSTMENT.value].ledger())
            self._audit_accounting_ledger()
        return ledger, workflow_resolutions

    def _emails_resolve(self) -> None:
        """Count the ambiguous sends, then resolve each as a member of finance would: confirm it
        where the relay's list shows the message (its log line is the evidence), else decide to
        send it again, knowing it may be a repeat."""
        emails = self._emails()
        self.report.ambiguous_sends = _db_retry(
            ActionEvent.objects.filter(action__in=emails, transition="escalate").count
        )
        self.report.ambiguous_unowned = _db_retry(
            emails.filter(status=ActionStatus.NEEDS_REVIEW, owner__isnull=True).count
        )
        self.report.not_sent_retries = _db_retry(
            ActionEvent.objects.filter(action__in=emails, transition="record_not_sent").count
        )
        at_relay = {row["message_id"] for row in _http("GET", f"{self.mail_url}/messages")["messages"]}
        for action in _db_retry(lambda: list(emails.filter(status=ActionStatus.NEEDS_REVIEW))):
            user = action.owner or self.finance
            try:
                if action.payload["message_id"] in at_relay:
                    action_resolve_succeeded(
                        action_pk=action.pk,
                        user=user,
                        provider_reference=message_reference(action.action_id),
                        reason="chaos: the relay's list shows the message",
                        evidence=f"mail sandbox list: {action.payload['message_id']} accepted",
                    )
                    self.report.resolved_confirmed += 1
                else:
                    action_resolve_resend(
                        action_pk=action.pk, user=user, reason="chaos: the relay's list has no such message"
                    )
                    self.report.resolved_sent_again += 1
            except ReviewRefused:
                pass

    def _wait_for_webhooks(self, timeout: float = 600.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            status = _http("GET", f"{self.sandbox_url}/_sandbox/webhooks")
            self.report.webhooks = {
                k: status.get(k, 0) for k in ("events", "delivered", "pending", "delivery_attempts")
            }
            if status.get("pending", 0) == 0 or time.monotonic() > deadline:
                return
            time.sleep(0.5)

    def _accounting_client(self) -> AccountingClient:
        # Patient: the faults are off by now, and the audit must read the whole ledger.
        return AccountingClient(
            api_base=self.accounting_url,
            access_token=settings.ACCOUNTING_ACCESS_TOKEN,
            tenant_id=settings.ACCOUNTING_TENANT_ID,
            timeout_seconds=30,
        )

    def _audit_accounting_ledger(self) -> None:
        """The accounting sandbox's own ledger (its control endpoint, not the console's client),
        judged on its own terms:
        - at most one live (not voided) credit note per action;
        - every SUCCEEDED adjustment has exactly one, and it is the recorded reference;
        - per bill, the live credit notes allocated to it add up to no more than its original
          amount due, and the amount due left is the total less them."""
        data = _http("GET", f"{self.accounting_url}/_sandbox/ledger")
        notes = [note for note in data["CreditNotes"] if note["Status"] not in ("VOIDED", "DELETED")]
        self.report.credit_notes = len(data["CreditNotes"])
        problems = self.report.accounting_problems
        by_action: dict[str, list[dict[str, Any]]] = {}
        for note in notes:
            by_action.setdefault(note["Reference"], []).append(note)
        for reference, found in sorted(by_action.items()):
            if len(found) > 1:
                ids = ", ".join(note["CreditNoteID"] for note in found)
                problems.append(f"{reference}: {len(found)} live credit notes ({ids})")
        succeeded = _db_retry(
            lambda: list(
                self._adjustments().filter(status=ActionStatus.SUCCEEDED).values_list("action_id", "provider_reference")
            )
        )
        for action_id, provider_reference in succeeded:
            found = by_action.get(action_id, [])
            if len(found) != 1:
                problems.append(f"{action_id}: SUCCEEDED with {len(found)} live credit notes")
            elif found[0]["CreditNoteID"] != provider_reference:
                problems.append(
                    f"{action_id}: recorded {provider_reference or '(none)'}, the credit note is "
                    f"{found[0]['CreditNoteID']}"
                )
        for invoice in data["Invoices"]:
            self.report.bills_checked += 1
            total = Decimal(str(invoice["Total"]))
            allocated = sum(
                (Decimal(str(note["Total"])) for note in notes if note.get("InvoiceID") == invoice["InvoiceID"]),
                Decimal("0"),
            )
            if allocated > total:
                problems.append(f"bill {invoice['InvoiceNumber']}: {allocated} credited on an amount due of {total}")
            if Decimal(str(invoice["AmountDue"])) != total - allocated:
                problems.append(
                    f"bill {invoice['InvoiceNumber']}: amount due {invoice['AmountDue']}, but {total} less "
                    f"{allocated} credited"
                )

    def finance_resolve(self, receivers: dict[str, Receiver]) -> None:
        """The scripted finance clerk (and accounts payable, for adjustments): every action in
        NEEDS_REVIEW is looked up at its kind's receiver; one it has is resolved as succeeded,
        one it has not is sent again with the same key. An answer that proves neither (pending,
        several, inconclusive) leaves it with its owner."""
        counts: dict[str, int] = {}

        def bump(name: str) -> None:
            counts[name] = counts.get(name, 0) + 1

        pks = _db_retry(
            lambda: list(
                # Not the supplier emails: they have their own clerk (_emails_resolve).
                Action.objects.filter(status=ActionStatus.NEEDS_REVIEW, kind__in=list(receivers))
                .order_by("pk")
                .values_list("pk", "owner_id", "kind")
            )
        )
        user_model = get_user_model()
        for pk, owner_id, kind in pks:
            receiver = receivers[kind]
            clerk = user_model.objects.get(pk=owner_id) if owner_id else None
            if clerk is None:
                bump("left (no owner)")
                continue
            try:
                lookup = action_lookup(action_pk=pk, user=clerk, receiver=receiver).lookup
                effects = lookup.live_effects
                found = lookup.verdict == LookupVerdict.FOUND and len(effects) == 1
                if found and effects[0].outcome == Outcome.SUCCEEDED:
                    action_resolve_succeeded(
                        action_pk=pk,
                        user=clerk,
                        provider_reference=effects[0].reference,
                        reason="Chaos run: the receiver's record shows the effect succeeded.",
                        receiver=receiver,
                    )
                    bump(f"{kind} resolved succeeded")
                elif lookup.verdict == LookupVerdict.NOT_FOUND:
                    action_resolve_retry(
                        action_pk=pk,
                        user=clerk,
                        reason="Chaos run: the receiver has no effect for this action; sent again, same key.",
                        receiver=receiver,
                    )
                    bump(f"{kind} resolved by retry")
                else:
                    bump(f"{kind} left ({lookup.verdict})")
            except ReviewRefused as refused:
                bump(f"{kind} left ({refused.code})")
            except (OperationalError, InterfaceError):
                # PostgreSQL went away mid-way: the action keeps its owner; the audit still runs.
                connection.close()
                bump("left (database error)")
        self.report.finance = counts
        # A retry leaves its action SUBMITTING until its answer is recorded (in the call) or
        # its lease expires (then the workers reconcile): wait for every action to be final again.
        deadline = time.monotonic() + self.config.drain_deadline_seconds
        while time.monotonic() < deadline:
            total, final = self.counts()
            if final >= total:
                break
            time.sleep(0.5)

    def _wait_until_ledger_settles(self) -> None:
        from django.db.models import Max
        from django.utils import timezone

        last_change = _db_retry(lambda: Action.objects.aggregate(last=Max("status_changed_at"))["last"])
        if last_change is None:
            return
        # A host whose clock runs ahead stamps its changes in the future, one whose clock runs
        # behind in the past: the change happened no later than now, and no earlier than its
        # stamp less the largest skew behind.
        behind = max(0, *(-host.skew_seconds for host in self.hosts))
        changed = min(last_change + timedelta(seconds=behind), timezone.now())
        settled_at = changed + timedelta(seconds=self.config.visibility_delay_seconds + 0.5)
        _wait_for(lambda: timezone.now() >= settled_at, timeout=60, what="the provider's list to catch up")

    def _reap(self, *, with_faults: bool) -> None:
        for worker in [*self.workers, *self.dispatchers]:
            if not worker.alive:
                self.report.worker_exits += 1
                self._replace(worker, with_faults=with_faults)


def _interleave(base: list[Any], extra: list[Any]) -> list[Any]:
    """``extra`` spread evenly through ``base``, both in their own order."""
    mixed = list(base)
    if extra:
        step = (len(base) + len(extra)) / len(extra)
        for position, item in enumerate(extra):
            mixed.insert(min(int(position * step), len(mixed)), item)
    return mixed


POSTGRES_CONFIG_ROOT = Path("/etc/postgresql")
# How long the surviving hosts' workers must have been running before a host is lost (a worker
# takes a few seconds to start on a loaded machine).
SURVIVOR_READY_SECONDS = 10.0
SURVIVOR_WAIT_SECONDS = 90.0


def postgres_restart_command() -> list[str]:
    """The command that restarts the run's PostgreSQL cluster.

    CHAOS_POSTGRES_CLUSTER (default "main") names the cluster the run's database lives in, so a
    long run can restart a cluster of its own without cutting other clients of the machine. The
    version is the one that has such a cluster. A name no version has is refused, naming it.
    """
    cluster = os.environ.get("CHAOS_POSTGRES_CLUSTER", "").strip() or "main"
    versions = sorted(p.name for p in POSTGRES_CONFIG_ROOT.iterdir()) if POSTGRES_CONFIG_ROOT.is_dir() else []
    having = [version for version in versions if (POSTGRES_CONFIG_ROOT / version / cluster).is_dir()]
    if not having:
        raise RuntimeError(
            f"CHAOS_POSTGRES_CLUSTER={cluster!r}: no PostgreSQL cluster of that name under {POSTGRES_CONFIG_ROOT} "
            f"(versions: {', '.join(versions) or 'none'}). Name an existing cluster, or pass --no-postgres-restart."
        )
    return ["pg_ctlcluster", "--skip-systemctl-redirect", having[0], cluster, "restart"]


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


def money_per_order(ledger: list[Any]) -> list[str]:
    """Per order, the provider's refunds (succeeded or pending) must equal what the console
    booked: refunded by its actions plus refunded outside. The refunds of actions still in
    NEEDS_REVIEW are left out: their money is reserved, waiting for finance's word."""
    in_review = set(Action.objects.filter(status=ActionStatus.NEEDS_REVIEW).values_list("action_id", flat=True))
    by_charge: dict[str, int] = {}
    for effect in ledger:
        if effect.is_effect and (effect.action_id or "") not in in_review:
            charge = str(effect.raw.get("charge", ""))
            by_charge[charge] = by_charge.get(charge, 0) + int(effect.amount_minor or 0)
    problems = []
    for order in Order.objects.filter(number__startswith="C").exclude(charge_reference="").iterator(chunk_size=2000):
        booked = to_minor_units(order.refunded_amount + order.outside_refunded_amount, order.currency)
        at_provider = by_charge.get(order.charge_reference, 0)
        if booked != at_provider:
            problems.append(
                f"order {order.number}: provider {at_provider} minor units, console {booked} "
                f"(refunded {order.refunded_amount} + outside {order.outside_refunded_amount})"
            )
    return problems


def stale_by_policy_count() -> int:
    """STALE actions whose approval in force came from the policy: none may exist (invariant 8)."""
    count = 0
    for action in Action.objects.filter(status=ActionStatus.STALE).only("pk"):
        approval = latest_approval(action)
        if approval is not None and approval.policy == ApprovalPolicy.AUTO:
            count += 1
    return count


def _now() -> Any:
    from django.utils import timezone

    return timezone.now()


def chaos_workdir_cleanup(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
