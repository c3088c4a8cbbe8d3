"""Property-based fuzzing of the served OpenAPI document with schemathesis.

For every operation, schemathesis generates requests from the document the API serves (its
examples, boundary values, then random valid and invalid data; a fixed seed, a bounded number
of examples) and sends them through the WSGI application with a valid token. Each answer must
be no 5xx, conform to the document (status, content type, headers, body schema), and a
rejected request must have written nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, seed, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from actions.agents.services import agent_token_issue
from actions.models import Agent, Bill, Order, Supplier, SupplierContact
from tests.factories import make_adjustment_request, make_bill, make_order, make_request

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


@pytest.fixture
def keep_test_connection() -> Iterator[None]:
    """A WSGI request ends with Django closing "old" database connections, which would close
    the test's own connection in the middle of its transaction. Django's test client switches
    that off for its requests; this does the same for the requests schemathesis sends."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


@pytest.fixture
def fuzz_token(agent: Agent, settings: Any) -> str:
    # Hundreds of requests with one token: the limit is tested on its own elsewhere.
    settings.API_RATE_LIMIT_PER_MINUTE = 0
    # Every scope, so that every operation, the orders one included, gets past the scope check.
    agent.scopes = ["invoice_adjustment", "orders", "refund", "supplier_email"]
    agent.save(update_fields=["scopes"])
    return agent_token_issue(agent=agent, label="fuzz").plain


@pytest.fixture
def fuzz_order(db: Any) -> Order:
    """The order the document's examples name (4821, request 1, ticket ZD-48213), so that the
    examples phase reaches the success paths too."""
    order = make_order(number="4821", currency="EUR", captured="1000.00")
    make_request(order, 1, external_reference="ZD-48213")
    # The supplier the supplier-email example names, so that its example reaches the success path.
    acme = Supplier.objects.create(code="ACME", name="Acme Widgets")
    SupplierContact.objects.create(supplier=acme, email="ap@acme.example")
    return order


@pytest.fixture
def fuzz_bill(db: Any) -> Bill:
    """The bill the invoice-adjustment examples name (INV-2291, adjustment 1, MATCH-7731)."""
    bill = make_bill(number="INV-2291", amount="500.00")
    make_adjustment_request(bill, 1, external_reference="MATCH-7731")
    return bill


# Loaded when the module is collected, from the document the application serves (through its
# WSGI entry point, with no server). schemathesis's lazy loader (``from_fixture``) relies on a
# pytest internal that pytest 9 removed, so the eager loader is the one that works here.
schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", get_wsgi_application())

# Requests sent per operation in this session, checked by the last test of the module.
SENT: Counter[str] = Counter()
MIN_REQUESTS_IN_ALL = 1000


@schema.parametrize()
@seed(20240611)
@settings(
    # 200 per operation: with the six operations at least 1,000 requests in all (checked below).
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@pytest.mark.slow
def test_no_generated_request_breaks_the_contract_or_writes_when_rejected(
    case: Any,
    keep_test_connection: None,
    fuzz_token: str,
    fuzz_order: Order,
    fuzz_bill: Bill,
    row_counts: Callable[[], dict[str, int]],
) -> None:
    """Invariant 11: bad input gets a clear error (a problem document naming the field) and
    writes nothing; no input makes the API fail or answer outside its document."""
    before = row_counts()

    # The token goes on the case itself, not only on the wire: a negative case that dropped or
    # mangled the Authorization header is then judged by what was really sent (a valid token),
    # and schemathesis does not take our own header for data the API accepted by mistake.
    case.headers = {**(case.headers or {}), "Authorization": f"Bearer {fuzz_token}"}
    response = case.call()
    SENT[f"{case.method} {case.path}"] += 1

    case.validate_response(response, checks=CHECKS)
    if response.status_code >= 400:
        assert row_counts() == before, f"{case.method} {case.formatted_path} -> {response.status_code} wrote rows"
        content_type = {name.lower(): values for name, values in response.headers.items()}["content-type"]
        assert content_type[0].startswith("application/problem+json")


def test_the_fuzz_run_covered_every_operation_with_enough_requests() -> None:
    """Runs after the fuzz test above (pytest keeps a module's order): every operation in the
    document was called, and the run sent at least MIN_REQUESTS_IN_ALL requests in all."""
    if not SENT:
        pytest.skip("the fuzz test was deselected in this run")
    operations = {
        f"{method.upper()} {path}" for path, methods in schema.raw_schema["paths"].items() for method in methods
    }
    # schemathesis also sends undocumented methods to each path (each must be a 405 problem).
    assert operations <= set(SENT), operations - set(SENT)
    assert sum(SENT.values()) >= MIN_REQUESTS_IN_ALL, SENT
    print(f"fuzz: {sum(SENT.values())} requests, {sum(SENT[o] for o in operations)} to documented operations")
