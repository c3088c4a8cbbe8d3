"""The engine's own spans (console.tracing installs the provider; off by default).

Attributes are the action's kind, its id and the outcome: what an operator follows an action by,
never a customer's name, address or amount.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import Any, TypeVar

from opentelemetry import trace
from opentelemetry.trace import Span

_tracer = trace.get_tracer("effect-console")

Result = TypeVar("Result")


@contextmanager
def action_span(name: str, *, kind: str | None = None, action_id: str | None = None) -> Iterator[Span]:
    """A span around one step of an action's path; set the outcome with ``outcome_set``."""
    attributes = {"console.kind": kind, "console.action_id": action_id}
    with _tracer.start_as_current_span(name, attributes={k: v for k, v in attributes.items() if v}) as span:
        yield span


def outcome_set(span: Span, outcome: str) -> None:
    if span.is_recording():
        span.set_attribute("console.outcome", outcome)


def current_trace_id() -> str | None:
    """The current trace's id in hex, for log lines; None outside a recorded trace."""
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None


def traced(
    name: str, *, outcome: Callable[[Any], str | None] = lambda result: None
) -> Callable[[Callable[..., Result]], Callable[..., Result]]:
    """A span around each call of an engine step, named ``name``, with the action's key (the
    ``action_pk`` argument) and the step's outcome (``outcome(result)``) as attributes."""

    def decorate(function: Callable[..., Result]) -> Callable[..., Result]:
        @wraps(function)
        def run(*args: Any, **kwargs: Any) -> Result:
            pk = kwargs.get("action_pk")
            attributes = {"console.action_pk": pk} if pk is not None else {}
            with _tracer.start_as_current_span(name, attributes=attributes) as span:
                result = function(*args, **kwargs)
                if span.is_recording():
                    label = outcome(result)
                    if label:
                        span.set_attribute("console.outcome", label)
                return result

        return run

    return decorate
