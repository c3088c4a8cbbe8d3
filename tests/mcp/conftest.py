"""Fixtures for the MCP server: the real ASGI app served by uvicorn on a free port (in a thread
of the test process), and a small driver around the SDK's own client.

The tools reach the database from the server's thread, so these tests commit their data
(``django_db(transaction=True)``): a test transaction would hide it from that thread.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
import uvicorn
from django.core.cache import caches
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, Tool

from actions.agents.services import agent_token_issue
from actions.mcp.server import mcp_asgi_app
from tests.processes import wait_until


class McpServerThread:
    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/mcp"
        self.server = uvicorn.Server(uvicorn.Config(mcp_asgi_app(), log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def start(self) -> None:
        self.thread.start()
        wait_until(lambda: self.server.started, timeout=15, what="the MCP server to start")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


@pytest.fixture
def mcp_url() -> Iterator[str]:
    server = McpServerThread()
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def dispatched(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Action pks whose dispatch was published. The dispatcher is not part of these tests."""
    calls: list[int] = []
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", calls.append)
    return calls


@pytest.fixture(autouse=True)
def fresh_rate_limit_counters() -> None:
    caches["default"].clear()


@pytest.fixture
def token(agent: Any) -> str:
    return agent_token_issue(agent=agent).plain


async def _session_call(url: str, token: str | None, name: str | None, arguments: dict[str, Any]) -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        streamable_http_client(url, http_client=http) as streams,
        ClientSession(streams[0], streams[1]) as session,
    ):
        await session.initialize()
        if name is None:
            return (await session.list_tools()).tools
        return await session.call_tool(name, arguments)


def mcp_call(url: str, token: str | None, name: str, arguments: dict[str, Any]) -> CallToolResult:
    """One tool call on a fresh connection, through the SDK's client."""
    result = asyncio.run(_session_call(url, token, name, arguments))
    assert isinstance(result, CallToolResult)
    return result


def mcp_tools(url: str, token: str) -> list[Tool]:
    tools = asyncio.run(_session_call(url, token, None, {}))
    return list(tools)
