"""HTTP plumbing for the accounting sandbox: the payment sandbox's handler, plus PUT."""

from __future__ import annotations

from http.server import ThreadingHTTPServer

from harness.sandboxes.accounting.sandbox import AccountingConfig, AccountingSandbox
from harness.sandboxes.payment.server import SandboxHandler

__all__ = ["AccountingHTTPServer", "make_server"]


class AccountingHandler(SandboxHandler):
    # Xero creates with PUT; the payment sandbox's handler only needed GET, POST and DELETE.
    def do_PUT(self) -> None:
        self._dispatch()


class AccountingHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], sandbox: AccountingSandbox, *, verbose: bool = False):
        self.sandbox = sandbox
        self.verbose = verbose
        super().__init__(address, AccountingHandler)

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
    config: AccountingConfig | None = None,
    *,
    fault_seed: int | None = None,
    verbose: bool = False,
) -> AccountingHTTPServer:
    """Create (but do not start) an accounting sandbox server; ``port=0`` picks a free port."""
    return AccountingHTTPServer(
        (host, port), AccountingSandbox(db_path, config, fault_seed=fault_seed), verbose=verbose
    )
