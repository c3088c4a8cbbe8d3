"""A Stripe-compatible payment provider for development, demos and tests (stdlib only).

Run it with ``python -m harness.sandboxes.payment --port 12111 --db sandbox.sqlite3``; see
``__main__.py`` for every option and ``app.py`` for the behaviour and control endpoints.
"""

from __future__ import annotations

from harness.sandboxes.payment.app import Request, Response, Sandbox, SandboxConfig
from harness.sandboxes.payment.server import SandboxHTTPServer, make_server, start_in_thread

__all__ = [
    "Request",
    "Response",
    "Sandbox",
    "SandboxConfig",
    "SandboxHTTPServer",
    "make_server",
    "start_in_thread",
]
