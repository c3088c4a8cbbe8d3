"""Fixtures for the provider tests: one sandbox process per test session, reset per test.

The sandbox runs as a real subprocess (``python -m harness.sandboxes.payment``) on a port it
picks itself, so these tests also prove the command that development and CI use.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import requests

from actions.providers.stripe_adapter import StripeProvider
from tests.providers.sandbox_client import API_KEY, SandboxClient

REPO_ROOT = Path(__file__).resolve().parents[2]
STARTUP_DEADLINE_SECONDS = 20.0
POLL_INTERVAL_SECONDS = 0.05


@pytest.fixture(scope="session")
def sandbox_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp("sandbox")
    port_file = workdir / "port"
    log_path = workdir / "sandbox.log"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "harness.sandboxes.payment",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--port-file",
                str(port_file),
                "--db",
                str(workdir / "sandbox.sqlite3"),
            ],
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        url = _wait_until_healthy(process, port_file, log_path)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def _wait_until_healthy(process: subprocess.Popen[bytes], port_file: Path, log: Path) -> str:
    deadline = time.monotonic() + STARTUP_DEADLINE_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the sandbox exited with {process.returncode}:\n{log.read_text()}")
        if port_file.exists():
            url = f"http://127.0.0.1:{port_file.read_text().strip()}"
            try:
                if requests.get(f"{url}/_sandbox/health", timeout=1).status_code == 200:
                    return url
            except requests.ConnectionError:
                pass
        time.sleep(POLL_INTERVAL_SECONDS)
    process.kill()
    pytest.fail(f"the sandbox was not healthy within {STARTUP_DEADLINE_SECONDS}s:\n{log.read_text()}")


@pytest.fixture
def sandbox(sandbox_url: str) -> Iterator[SandboxClient]:
    """A clean sandbox: no charges, refunds, keys or faults, default config, clock at now."""
    with requests.Session() as session:
        client = SandboxClient(sandbox_url, session)
        client.reset()
        yield client


@pytest.fixture
def provider(sandbox: SandboxClient) -> StripeProvider:
    """The production Stripe adapter, pointed at the sandbox, with a short timeout."""
    return StripeProvider(
        api_key=API_KEY,
        api_base=sandbox.url,
        timeout_seconds=0.5,
        key_retention=timedelta(hours=24),
        lookup_visibility_delay=timedelta(seconds=2),
    )
