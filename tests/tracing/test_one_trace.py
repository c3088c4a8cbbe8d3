"""One action's spans form one trace, from the agent's request to the receiver (console.tracing).

The API runs in this process with an in-memory exporter; the dispatch runs in a real Celery
worker that prints its spans (OTEL_TRACES_EXPORTER=console). The trace crosses the broker on
the dispatch message's headers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from actions.agents.services import agent_token_issue
from actions.models import Action, ActionStatus, Agent
from console import tracing
from tests.api.conftest import ApiClient
from tests.factories import make_order, make_request
from tests.processes import WorkerPool, wait_until
from tests.providers.sandbox_client import SandboxClient

pytestmark = [pytest.mark.postgres, pytest.mark.processes, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.instrumentation.requests import RequestsInstrumentor
    from opentelemetry.instrumentation.urllib3 import URLLib3Instrumentor

    exporter = InMemorySpanExporter()
    monkeypatch.setattr(tracing, "_installed", False)
    assert tracing.install_tracing(service="test", exporter=exporter)
    yield exporter
    instrumentors = (
        DjangoInstrumentor(),
        CeleryInstrumentor(),
        PsycopgInstrumentor(),
        RequestsInstrumentor(),
        URLLib3Instrumentor(),
    )
    for instrumentor in instrumentors:
        instrumentor.uninstrument()
    exporter.shutdown()


def worker_spans(log: str) -> list[dict[str, Any]]:
    found = []
    for line in log.splitlines():
        line = line.strip()
        if line.startswith("{") and '"trace_id"' in line:
            found.append(json.loads(line))
    return found


def test_one_actions_spans_form_one_trace_from_the_api_to_the_receiver(
    spans: InMemorySpanExporter,
    workers: WorkerPool,
    live_sandbox: SandboxClient,
    agent: Agent,
    settings: Any,
) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    worker = workers.start(OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="worker-under-test")
    order = make_order(number="7001", currency="EUR", captured="100.00")
    live_sandbox.seed_charge(order.charge_reference, 10000, "eur")
    make_request(order, 1, external_reference="ZD-7001")
    api = ApiClient(agent_token_issue(agent=agent, label="trace").plain)

    response = api.post(
        "/api/v1/refunds",
        {
            "order_number": "7001",
            "request_number": 1,
            "amount": "12.50",  # under the auto-approval threshold: dispatched at once
            "currency": "EUR",
            "reason_code": "damaged",
            "evidence": "Photo in ticket ZD-7001.",
        },
    )
    assert response.status_code == 201, response.content
    action_id = response.json()["action_id"]
    wait_until(
        lambda: Action.objects.get(action_id=action_id).status == ActionStatus.SUCCEEDED,
        timeout=30,
        what="the refund to succeed",
    )

    [server] = [span for span in spans.get_finished_spans() if span.kind.name == "SERVER"]
    trace_id = format(server.context.trace_id, "#034x")
    published = [span for span in spans.get_finished_spans() if span.name.startswith("apply_async/")]
    assert [span.name for span in published] == ["apply_async/actions.tasks.dispatch"]
    assert format(published[0].context.trace_id, "#034x") == trace_id

    # The worker flushes each span as it ends; wait for the dispatch's own span.
    def in_the_workers_log() -> list[dict[str, Any]]:
        found = [s for s in worker_spans(worker.log()) if s["context"]["trace_id"] == trace_id]
        return found if any(s["name"] == "run/actions.tasks.dispatch" for s in found) else []

    same_trace = wait_until(in_the_workers_log, timeout=15, what="the worker's spans of this trace")
    names = {span["name"] for span in same_trace}
    assert "run/actions.tasks.dispatch" in names
    # The engine's own steps, with the kind and the outcome as attributes.
    assert {"action.claim", "receiver.call", "action.record"} <= names, names
    [call] = [s for s in same_trace if s["name"] == "receiver.call"]
    assert call["attributes"]["console.kind"] == "refund"
    assert call["attributes"]["console.outcome"] == "succeeded"
    [proposed] = [span for span in spans.get_finished_spans() if span.name == "action.propose"]
    assert format(proposed.context.trace_id, "#034x") == trace_id
    # The receiver's call: the HTTP client span to the payment sandbox, in the same trace.
    receiver_calls = [s for s in same_trace if s["kind"] == "SpanKind.CLIENT" and s["attributes"].get("http.method")]
    assert receiver_calls, names
    assert any("/v1/refunds" in str(s["attributes"].get("http.url", "")) for s in receiver_calls), receiver_calls
    # No customer data in any attribute: the amount and the evidence never appear. Only what a
    # span says is searched; its random ids and timestamps may hold any run of digits.
    text = json.dumps([(s["name"], s["attributes"], s.get("events"), s.get("resource")) for s in same_trace])
    assert "ZD-7001" not in text and "12.50" not in text and "1250" not in text
