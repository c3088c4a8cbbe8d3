"""The retry test: an MCP client that loses its answer and calls again cannot refund twice.

Real processes: the MCP server (``manage.py mcp_serve``), Celery workers and the sandbox
provider. Between the client and the server sits a TCP proxy that can drop a connection
after the server has answered a ``tools/call`` and before the answer reaches the client: the
case where the client cannot know whether its call did anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import requests
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult

from actions.agents.services import agent_token_issue
from actions.models import Action, ActionStatus
from tests.factories import make_order, make_request
from tests.processes import REPO_ROOT, WorkerPool, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.processes, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

FINAL = {ActionStatus.SUCCEEDED, ActionStatus.FAILED_FINAL, ActionStatus.NEEDS_REVIEW}


class DroppingProxy:
    """Forwards TCP connections to ``upstream``. While ``drops`` is above zero, a connection
    that carried a ``tools/call`` is closed as soon as the server's answer starts to arrive,
    and the answer is thrown away."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.drops = 0
        self.dropped = 0
        self._lock = threading.Lock()
        self._closing = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            state = {"tool_call": False}
            threading.Thread(target=self._pump_up, args=(client, server, state), daemon=True).start()
            threading.Thread(target=self._pump_down, args=(server, client, state), daemon=True).start()

    def _pump_up(self, client: socket.socket, server: socket.socket, state: dict[str, bool]) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                if b"tools/call" in data:
                    state["tool_call"] = True
                server.sendall(data)
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_WR)

    def _pump_down(self, server: socket.socket, client: socket.socket, state: dict[str, bool]) -> None:
        with contextlib.suppress(OSError):
            while data := server.recv(65536):
                if state["tool_call"]:
                    with self._lock:
                        drop = self.drops > 0
                        if drop:
                            self.drops -= 1
                            self.dropped += 1
                    if drop:
                        # The server answered; the client never hears it.
                        client.shutdown(socket.SHUT_RDWR)
                        break
                    state["tool_call"] = False
                client.sendall(data)
        for sock in (client, server):
            with contextlib.suppress(OSError):
                sock.close()

    def close(self) -> None:
        self._closing = True
        self.listener.close()


@pytest.fixture
def mcp_process(workers: WorkerPool, tmp_path: Path) -> Iterator[str]:
    """``manage.py mcp_serve`` against the test database, broker and sandbox; yields its host:port."""
    port_file = tmp_path / "mcp-port"
    log_path = tmp_path / "mcp.log"
    env = workers.environment(API_RATE_LIMIT_PER_MINUTE="0")
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "mcp_serve", "--port", "0", "--port-file", str(port_file)],
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:

        def healthy() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"mcp_serve exited:\n{log_path.read_text()}")
            if not port_file.exists() or not port_file.read_text().strip():
                return False
            try:
                url = f"http://127.0.0.1:{port_file.read_text().strip()}/healthz"
                return requests.get(url, timeout=1).status_code == 200
            except requests.ConnectionError:
                return False

        wait_until(healthy, timeout=30, what="mcp_serve to listen")
        yield f"127.0.0.1:{port_file.read_text().strip()}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        sys.stderr.write(f"\n--- log of mcp_serve ---\n{log_path.read_text(errors='replace')[-4000:]}\n")


@pytest.fixture
def fast_policy(settings: Any) -> None:
    # Short leases and sweeps so that the recovery takes seconds; copied into the processes.
    settings.LEASE_SECONDS = 3
    settings.SWEEP_INTERVAL_SECONDS = 1
    settings.PROVIDER_TIMEOUT_SECONDS = 1
    settings.RECONCILE_BASE_BACKOFF_SECONDS = 1
    settings.PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS = 0


async def _propose(url: str, token: str, arguments: dict[str, Any]) -> CallToolResult:
    # A fresh HTTP client, transport and session for every call: a reconnecting agent.
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=20) as http,
        streamable_http_client(url, http_client=http) as streams,
        ClientSession(streams[0], streams[1]) as session,
    ):
        await session.initialize()
        return await session.call_tool("propose_refund", arguments, read_timeout_seconds=20)


def propose(url: str, token: str, arguments: dict[str, Any]) -> CallToolResult:
    return asyncio.run(asyncio.wait_for(_propose(url, token, arguments), timeout=60))


def test_a_dropped_answer_and_five_repeats_with_a_worker_killed_make_one_refund(
    workers: WorkerPool, live_sandbox: Any, mcp_process: str, agent: Any, fast_policy: None, finance: Any
) -> None:
    """Invariant 1 through MCP: the client loses the answer to propose_refund, reconnects and
    calls again five times while the worker that sent the refund is SIGKILLed before
    recording it. Every answer names the same action, and the provider has one refund."""
    order = make_order(captured="100.00")
    live_sandbox.seed_charge(order.charge_reference, 10000, "eur")
    request = make_request(order)
    token = agent_token_issue(agent=agent).plain
    arguments = {
        "order_number": order.number,
        "request_number": request.number,
        "amount": "20.00",  # under the auto-approval threshold: approved by policy at once
        "currency": "EUR",
        "reason_code": "damaged",
        "evidence": "The lid arrived broken.",
    }
    host, port = mcp_process.split(":")
    proxy = DroppingProxy((host, int(port)))
    url = f"http://127.0.0.1:{proxy.port}/mcp"
    # This worker sends the refund, then dies (SIGKILL) before recording the provider's answer.
    doomed = workers.start(fault_points="after_provider_answer")
    try:
        proxy.drops = 1
        with pytest.raises(BaseExceptionGroup) as lost:
            propose(url, token, arguments)
        # The SDK's transport reports the lost answer as the HTTP client's protocol error.
        assert lost.group_contains(httpx2.RemoteProtocolError), repr(lost.value)
        assert proxy.dropped == 1
        # The server did record the proposal; the client cannot know that.
        assert Action.objects.filter(order=order).count() == 1

        wait_until(lambda: not doomed.alive, timeout=30, what="the worker to die after the provider answered")
        assert doomed.process.returncode == -9, f"the worker exited with {doomed.process.returncode}, not SIGKILL"

        answers = []
        for attempt in range(5):
            if attempt == 2:
                # A fresh worker (and beat) recovers the action while the agent keeps calling.
                workers.start(beat=True)
            result = propose(url, token, arguments)
            assert not result.is_error, result.content
            assert result.structured_content is not None
            answers.append(result.structured_content["action_id"])
    finally:
        proxy.close()

    expected = f"refund:order-{order.number}:request-{request.number}"
    assert answers == [expected] * 5
    final = wait_until(
        lambda: Action.objects.filter(action_id=expected, status__in=FINAL).first(),
        timeout=60,
        what="the action to be recovered",
    )
    refunds = [r for r in live_sandbox.ledger() if r["metadata"].get("action_id") == expected]
    assert len(refunds) == 1, f"{len(refunds)} refunds at the sandbox"
    assert final.status == ActionStatus.SUCCEEDED
    assert final.provider_reference == refunds[0]["id"]
    assert Action.objects.filter(order=order).count() == 1
    assert os.environ.get("CONSOLE_FAULT_POINTS", "") == ""  # the test process itself never dies
