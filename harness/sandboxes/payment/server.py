"""HTTP plumbing for the sandbox: a threading server that feeds requests to ``Sandbox``."""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from harness.sandboxes.payment.app import Request, Response, Sandbox, SandboxConfig
from harness.sandboxes.payment.webhooks import WebhookEndpoint

__all__ = ["SandboxHTTPServer", "make_server", "start_in_thread"]


class SandboxHandler(BaseHTTPRequestHandler):
    # HTTP/1.1 keeps connections alive, as the stripe library's requests session expects.
    protocol_version = "HTTP/1.1"
    server_version = "effect-sandbox/1"
    # An idle keep-alive connection holds a thread; give it up after a while.
    timeout = 120
    # Headers and body go out in two writes; with Nagle on, the client's delayed ACK adds
    # about 40 ms to every answer.
    disable_nagle_algorithm = True
    server: SandboxHTTPServer

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length > 0 else b""
        url = urlsplit(self.path)
        request = Request(
            method=self.command,
            path=url.path,
            query=url.query,
            headers=dict(self.headers.items()),
            body=body,
        )
        try:
            response = self.server.sandbox.handle(request)
        except Exception:
            traceback.print_exc(file=sys.stderr)
            response = Response(
                500, {"error": {"type": "api_error", "message": "sandbox internal error"}}
            )
        if response.drop:
            self._drop_connection()
            return
        self._send(response)

    def _send(self, response: Response) -> None:
        payload = json.dumps(response.body).encode()
        try:
            self.send_response(response.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for name, value in response.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)
        except OSError:
            # The client gave up (a timeout fault, usually); the effect is already stored.
            self.close_connection = True

    def _drop_connection(self) -> None:
        # Close without a status line: the client sees the connection reset or closed mid-way,
        # exactly like a load balancer dying after the provider committed.
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def log_message(self, format: str, *args: object) -> None:
        if self.server.verbose:
            super().log_message(format, *args)


class SandboxHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # Chaos runs open many connections at once; the default backlog of 5 refuses some.
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], sandbox: Sandbox, *, verbose: bool = False):
        self.sandbox = sandbox
        self.verbose = verbose
        super().__init__(address, SandboxHandler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def server_close(self) -> None:
        super().server_close()
        self.sandbox.close()


def make_server(
    host: str,
    port: int,
    db_path: str,
    config: SandboxConfig | None = None,
    *,
    fault_seed: int | None = None,
    verbose: bool = False,
    webhook: WebhookEndpoint | None = None,
) -> SandboxHTTPServer:
    """Create (but do not start) a sandbox server; ``port=0`` picks a free port."""
    sandbox = Sandbox(db_path, config, fault_seed=fault_seed, webhook=webhook)
    try:
        return SandboxHTTPServer((host, port), sandbox, verbose=verbose)
    except BaseException:
        sandbox.close()
        raise


def start_in_thread(
    db_path: str,
    config: SandboxConfig | None = None,
    *,
    host: str = "127.0.0.1",
    fault_seed: int | None = None,
) -> SandboxHTTPServer:
    """Serve a sandbox on a free port from a daemon thread, for in-process tests.

    Stop it with ``server.shutdown(); server.server_close()``.
    """
    server = make_server(host, 0, db_path, config, fault_seed=fault_seed)
    thread = threading.Thread(target=server.serve_forever, name="sandbox", daemon=True)
    thread.start()
    return server
