"""The mail sandbox for tests: a pytest plugin registered by tests/conftest.py.

- ``mail_sandbox``: the aiosmtpd sandbox running in this process's threads on free ports,
  reset for the test, with the console's email settings pointed at it (the tracking SMTP
  backend, not Django's test outbox). Worker processes started by the test reach it over TCP.
- ``supplier``: supplier ACME with one known contact, ap@acme.example.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests

from actions.models import Supplier, SupplierContact
from harness.sandboxes.mail.sandbox import MailSandbox


class MailSandboxClient:
    def __init__(self, sandbox: MailSandbox) -> None:
        self.sandbox = sandbox
        self.url = f"http://127.0.0.1:{sandbox.http_port}"
        self.smtp_port = sandbox.smtp_port

    def messages(self, action_id: str | None = None) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = requests.get(f"{self.url}/messages", timeout=5).json()["messages"]
        return [row for row in rows if action_id is None or row["action_id"] == action_id]

    def fault(self, **fault: Any) -> None:
        requests.post(f"{self.url}/faults", json=fault, timeout=5).raise_for_status()

    def reset(self) -> None:
        requests.post(f"{self.url}/reset", timeout=5).raise_for_status()


@pytest.fixture(scope="session")
def mail_sandbox_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MailSandbox]:
    sandbox = MailSandbox(
        host="127.0.0.1",
        smtp_port=0,
        http_port=0,
        db_path=str(tmp_path_factory.mktemp("mail-sandbox") / "mail.sqlite3"),
    )
    sandbox.start()
    yield sandbox
    sandbox.stop()


@pytest.fixture
def mail_sandbox(mail_sandbox_server: MailSandbox, settings: Any) -> Iterator[MailSandboxClient]:
    client = MailSandboxClient(mail_sandbox_server)
    client.reset()
    settings.EMAIL_BACKEND = "actions.providers.mail.backend.EmailBackend"
    settings.EMAIL_HOST = "127.0.0.1"
    settings.EMAIL_PORT = client.smtp_port
    settings.EMAIL_TIMEOUT = 1
    settings.MAIL_SANDBOX_URL = client.url
    yield client
    client.reset()


@pytest.fixture
def supplier(db: Any) -> Supplier:
    acme = Supplier.objects.create(code="ACME", name="Acme Widgets")
    SupplierContact.objects.create(supplier=acme, email="ap@acme.example", name="Accounts payable")
    return acme


BILL_PARAMETERS = {
    "supplier_name": "Acme Widgets",
    "bill_number": "BL-1042",
    "amount": "120.00",
    "currency": "EUR",
    "reason": "Two pallets arrived damaged.",
}
