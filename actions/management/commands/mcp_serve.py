"""Serve the console's MCP server (streamable HTTP) as a process of its own.

    manage.py mcp_serve --host 127.0.0.1 --port 8001      # agents connect to http://127.0.0.1:8001/mcp

It uses the same settings, database and broker as the web process. ``--port 0`` picks a free
port and ``--port-file`` writes the chosen one, for tests and scripts.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import uvicorn
from django.core.management.base import BaseCommand, CommandParser

from actions.mcp.server import mcp_asgi_app


class Command(BaseCommand):
    help = "Serve the MCP server for agents (streamable HTTP, bearer token auth)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1", help="Address to bind (default 127.0.0.1).")
        parser.add_argument("--port", type=int, default=8001, help="Port to bind; 0 picks a free one (default 8001).")
        parser.add_argument("--port-file", help="Write the bound port to this file once listening.")
        parser.add_argument("--path", default="/mcp", help="The MCP endpoint's path (default /mcp).")

    def handle(self, *args: Any, **options: Any) -> None:
        host: str = options["host"]
        # Bind here rather than in uvicorn, so that the port is known (and written) before
        # serving: a port of 0 means "any free one".
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, options["port"]))
        port = sock.getsockname()[1]
        if options["port_file"]:
            Path(options["port_file"]).write_text(str(port))
        self.stderr.write(f"MCP server on http://{host}:{port}{options['path']}")
        config = uvicorn.Config(
            mcp_asgi_app(host=host, path=options["path"]),
            log_level="info",
            # Agents' retries arrive on new connections; a half-open one is dropped soon.
            timeout_keep_alive=5,
        )
        uvicorn.Server(config).run(sockets=[sock])
