"""OpenTelemetry traces across an action's path: the agent's request, the proposal, the claim in a
worker, the receiver's call, the record and reconciliation.

Off by default. Set the standard ``OTEL_TRACES_EXPORTER`` to ``otlp`` (configured, like any
OpenTelemetry program, by ``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_SERVICE_NAME`` and the other
``OTEL_*`` variables) or ``console`` (one JSON span a line on standard output). Then every
process (web, worker, beat, dispatcher) installs OpenTelemetry's own instrumentations:

- Django: a server span per request;
- Celery: the trace context rides on each task message (its headers), so a dispatch published by
  the API's request continues that request's trace in the worker;
- psycopg: a span per statement;
- requests and urllib3: a client span per outgoing call, with the ``traceparent`` header (the
  accounting system's client goes through requests, Stripe's through urllib3 itself).

The engine adds its own spans (actions.foundation.tracing) with the kind, the action id and the
outcome as attributes, never customer data. While tracing is off they cost a no-op call.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

log = logging.getLogger(__name__)

_installed = False


def tracing_exporter() -> str:
    return os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()


def tracing_enabled() -> bool:
    return tracing_exporter() not in ("", "none")


def process_role() -> str:
    """What this process is, for the service name: a Celery worker or beat, or the web."""
    argv = " ".join(sys.argv)
    if "celery" in argv:
        return "beat" if " beat" in argv and " worker" not in argv else "worker"
    if "dispatcher" in argv:
        return "dispatcher"
    return "web"


def install_tracing(*, service: str, exporter: Any = None) -> bool:
    """Install the tracer provider and the instrumentations in this process, once. ``exporter``
    replaces the one the environment names (tests pass an in-memory one). Whether it did."""
    global _installed
    if _installed or (exporter is None and not tracing_enabled()):
        return False
    from opentelemetry import trace
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.instrumentation.requests import RequestsInstrumentor
    from opentelemetry.instrumentation.urllib3 import URLLib3Instrumentor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", f"effect-console-{service}")})
    provider = TracerProvider(resource=resource)
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    elif tracing_exporter() == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        # One compact JSON object a line, so that a log line is a span.
        console = ConsoleSpanExporter(out=sys.stdout, formatter=lambda span: span.to_json(indent=None) + os.linesep)
        provider.add_span_processor(SimpleSpanProcessor(console))
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    DjangoInstrumentor().instrument()
    CeleryInstrumentor().instrument()
    # Statements are named by their SQL (parameters are never recorded): no customer data.
    PsycopgInstrumentor().instrument(enable_commenter=False, skip_dep_check=True)
    RequestsInstrumentor().instrument()
    URLLib3Instrumentor().instrument()
    _installed = True
    log.info("tracing on: %s exporter", tracing_exporter() or type(exporter).__name__)
    return True
