"""Real processes for the tests that need them: the sandbox provider and Celery workers.

Registered as a pytest plugin by tests/conftest.py. A worker is a real ``celery worker``
process (solo pool, so the process that runs the task is the one a test kills), connected to
the test database and a Redis broker database of its own, and to the sandbox.

Fixtures:
- ``sandbox_process`` (session): one sandbox on a free port.
- ``live_sandbox``: a SandboxClient for it, reset before the test, and the console's provider
  settings pointed at it (in this process and in every worker started by the test).
- ``workers``: a WorkerPool; ``workers.start(fault_points="after_provider_answer")`` starts one.
  All are killed at the end of the test.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import requests
from django.conf import settings
from django.db import connection

from tests.providers.accounting_client import AccountingSandboxClient
from tests.providers.sandbox_client import SandboxClient

REPO_ROOT = Path(__file__).resolve().parents[1]
STARTUP_DEADLINE_SECONDS = 30.0


def every_queue() -> str:
    """``--queues`` for a test's worker: the workers' queue and the periodic tasks' queue.

    Production gives the periodic tasks a worker of their own (console/deploy). A test's worker
    takes both queues, so that the process a test kills is the one that ran its sweep too, and a
    test starts one process per worker, not two, on a small machine.
    """
    return f"{settings.CELERY_TASK_DEFAULT_QUEUE},{settings.PERIODIC_QUEUE}"


def wait_until(predicate: Callable[[], Any], *, timeout: float = 30.0, interval: float = 0.1, what: str = "it") -> Any:
    """Poll until ``predicate()`` is truthy; fail with ``what`` after the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class SandboxProcess:
    def __init__(self, workdir: Path, module: str = "harness.sandboxes.payment") -> None:
        self.workdir = workdir
        self.module = module
        self.port_file = workdir / "port"
        self.log_path = workdir / "sandbox.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    self.module,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    "0",
                    "--port-file",
                    str(self.port_file),
                    "--db",
                    str(self.workdir / "sandbox.sqlite3"),
                ],
                cwd=REPO_ROOT,
                env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + STARTUP_DEADLINE_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the sandbox exited with {self.process.returncode}:\n{self.log_path.read_text()}")
            if self.port_file.exists() and self.port_file.read_text().strip():
                url = f"http://127.0.0.1:{self.port_file.read_text().strip()}"
                try:
                    if requests.get(f"{url}/_sandbox/health", timeout=1).status_code == 200:
                        self.url = url
                        return
                except requests.ConnectionError:
                    pass
            time.sleep(0.05)
        raise RuntimeError(f"the sandbox was not healthy in time:\n{self.log_path.read_text()}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


@pytest.fixture(scope="session")
def sandbox_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxProcess]:
    process = SandboxProcess(tmp_path_factory.mktemp("sandbox-process"))
    process.start()
    yield process
    process.stop()


@pytest.fixture
def live_sandbox(sandbox_process: SandboxProcess, settings: Any) -> Iterator[SandboxClient]:
    """A reset sandbox, with this process's provider settings pointed at it."""
    from actions.kinds.refund.contract import provider_from_settings

    settings.PROVIDER_API_BASE = sandbox_process.url
    settings.PROVIDER_TIMEOUT_SECONDS = 2
    provider_from_settings.cache_clear()
    with requests.Session() as session:
        client = SandboxClient(sandbox_process.url, session)
        client.reset()
        yield client
    provider_from_settings.cache_clear()


@pytest.fixture(scope="session")
def accounting_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxProcess]:
    """One accounting sandbox (``harness.sandboxes.accounting``) on a free port."""
    process = SandboxProcess(tmp_path_factory.mktemp("accounting-process"), module="harness.sandboxes.accounting")
    process.start()
    yield process
    process.stop()


@pytest.fixture
def live_accounting(accounting_process: SandboxProcess, settings: Any) -> Iterator[AccountingSandboxClient]:
    """A reset accounting sandbox, with this process's accounting settings pointed at it. Its
    lookup lag and the console's visibility delay are both 0 unless a test sets them."""
    from actions.kinds.invoice_adjustment.contract import accounting_from_settings

    settings.ACCOUNTING_API_BASE = accounting_process.url
    settings.ACCOUNTING_TIMEOUT_SECONDS = 2
    settings.ACCOUNTING_LOOKUP_VISIBILITY_DELAY_SECONDS = 0
    accounting_from_settings.cache_clear()
    with requests.Session() as session:
        client = AccountingSandboxClient(accounting_process.url, session)
        client.reset()
        client.configure(lookup_visibility_delay_seconds=0)
        yield client
    accounting_from_settings.cache_clear()


class Worker:
    def __init__(self, name: str, process: subprocess.Popen[bytes], log_path: Path) -> None:
        self.name = name
        self.process = process
        self.log_path = log_path

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        # The whole process group: ``--beat`` runs beat in a child process that outlives a
        # SIGKILLed worker and would keep publishing sweeps to the broker for ever.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        if self.process.poll() is None:
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.alive:
            os.killpg(self.process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=15)
        self.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_killed_at_fault_point(self) -> None:
        """Wait for this process to die at the fault point it was started with, by SIGKILL."""
        wait_until(lambda: not self.alive, timeout=30, what=f"{self.name} to die at its fault point")
        assert self.process.returncode == -9, f"{self.name} exited with {self.process.returncode}, not SIGKILL"


class WorkerPool:
    """Celery workers for one test, on a broker database nobody else uses during the test."""

    def __init__(self, tmp_path: Path, sandbox_url: str, broker_url: str) -> None:
        self.tmp_path = tmp_path
        self.sandbox_url = sandbox_url
        self.broker_url = broker_url
        self.workers: list[Worker] = []
        self.extra_env: dict[str, str] = {}

    def environment(self, fault_points: str = "", **overrides: str) -> dict[str, str]:
        db = connection.settings_dict
        database_url = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO_ROOT),
            "DJANGO_SETTINGS_MODULE": "console.settings",
            "DATABASE_URL": database_url,
            "DATABASE_POOL": "0",
            "CELERY_BROKER_URL": self.broker_url,
            "PROVIDER_API_BASE": self.sandbox_url,
            "PROVIDER_TIMEOUT_SECONDS": str(settings.PROVIDER_TIMEOUT_SECONDS),
            "LEASE_SECONDS": str(settings.LEASE_SECONDS),
            "SWEEP_INTERVAL_SECONDS": str(settings.SWEEP_INTERVAL_SECONDS),
            "RECONCILE_BASE_BACKOFF_SECONDS": str(settings.RECONCILE_BASE_BACKOFF_SECONDS),
            "PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS": str(settings.PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS),
            "PROVIDER_KEY_RETENTION_SECONDS": str(settings.PROVIDER_KEY_RETENTION_SECONDS),
            "ACCOUNTING_API_BASE": settings.ACCOUNTING_API_BASE,
            "ACCOUNTING_TIMEOUT_SECONDS": str(settings.ACCOUNTING_TIMEOUT_SECONDS),
            "ACCOUNTING_KEY_RETENTION_SECONDS": str(settings.ACCOUNTING_KEY_RETENTION_SECONDS),
            "ACCOUNTING_LOOKUP_VISIBILITY_DELAY_SECONDS": str(settings.ACCOUNTING_LOOKUP_VISIBILITY_DELAY_SECONDS),
            "CONSOLE_FAULT_POINTS": fault_points,
            **self.extra_env,
            **overrides,
        }
        return env

    def start(self, *, fault_points: str = "", beat: bool = False, **overrides: str) -> Worker:
        name = f"w{len(self.workers) + 1}-{uuid.uuid4().hex[:6]}"
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "console",
            "worker",
            "--pool",
            "solo",
            "--loglevel",
            "INFO",
            "--queues",
            every_queue(),
            "--hostname",
            f"{name}@%h",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
        if beat:
            command += ["--beat", "--schedule", str(self.tmp_path / f"beat-{name}")]
        return self._launch(name, command, ready="ready", env=self.environment(fault_points, **overrides))

    def start_dispatcher(
        self, *, fault_points: str = "", concurrency: int = 4, batch: int = 4, **overrides: str
    ) -> Worker:
        """A dispatcher process (``manage.py dispatcher``), killed like a worker at the end."""
        name = f"d{len(self.workers) + 1}-{uuid.uuid4().hex[:6]}"
        command = [
            sys.executable,
            "manage.py",
            "dispatcher",
            "--concurrency",
            str(concurrency),
            "--batch",
            str(batch),
            "--idle",
            "0.02",
        ]
        return self._launch(name, command, ready="dispatcher ready", env=self.environment(fault_points, **overrides))

    def _launch(self, name: str, command: list[str], *, ready: str, env: dict[str, str]) -> Worker:
        """Start ``command`` and wait until its log says ``ready``."""
        log_path = self.tmp_path / f"worker-{name}.log"
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                command,
                cwd=REPO_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                # A process group of its own, so that kill() also reaches the embedded beat.
                start_new_session=True,
            )
        worker = Worker(name, process, log_path)
        self.workers.append(worker)
        wait_until(
            lambda: ready in worker.log() or not worker.alive, timeout=STARTUP_DEADLINE_SECONDS, what=f"process {name}"
        )
        # A process started with a fault point may take work and die at it within milliseconds
        # of being ready, before this poll sees it alive: that is the kill the test asked for,
        # not a failed start.
        if not worker.alive and ready not in worker.log():
            raise RuntimeError(f"{name} exited at start:\n{worker.log()}")
        return worker

    def stop_all(self) -> None:
        for worker in self.workers:
            worker.kill()


@pytest.fixture
def broker_url() -> Iterator[str]:
    """A Redis database flushed before and after the test, so no message crosses tests."""
    url = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/15")
    if not url.startswith("redis://"):
        pytest.fail("process tests need a Redis broker: set CELERY_BROKER_URL=redis://...")
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield url
    client.flushdb()


@pytest.fixture
def workers(tmp_path: Path, live_sandbox: SandboxClient, broker_url: str, settings: Any) -> Iterator[WorkerPool]:
    """Start real Celery workers; tests publish to the same broker from this process."""
    from console.celery import app

    settings.CELERY_BROKER_URL = broker_url
    app.conf.broker_url = broker_url
    pool = WorkerPool(tmp_path, live_sandbox.url, broker_url)
    try:
        yield pool
    finally:
        pool.stop_all()
        # Show the workers' logs on failure: they are the only record of what a killed worker did.
        for worker in pool.workers:
            sys.stderr.write(f"\n--- log of worker {worker.name} ---\n{worker.log()[-4000:]}\n")
