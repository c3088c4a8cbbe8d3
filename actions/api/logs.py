"""Structured logs for the API: one JSON object per line.

Each line carries the request's context (request id, method, path, the agent and token
prefix once known, and the action id once known), so that ``grep`` on an action id finds
every line of every request that concerned it. The context lives in a ContextVar: it follows
the request through the services without being passed around, and does not leak between
requests served by one thread.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from django.utils import timezone

from actions.foundation.tracing import current_trace_id

logger = logging.getLogger("actions.api")

_context: ContextVar[dict[str, Any] | None] = ContextVar("actions_api_log_context", default=None)


@contextmanager
def log_context(**fields: Any) -> Iterator[dict[str, Any]]:
    """Open the context of one request. Nested contexts start from a copy of the outer one."""
    context = {**(_context.get() or {}), **fields}
    token = _context.set(context)
    try:
        yield context
    finally:
        _context.reset(token)


def bind(**fields: Any) -> None:
    """Add fields (the action id, the agent) to every later line of the current request."""
    context = _context.get()
    if context is not None:
        context.update({key: value for key, value in fields.items() if value is not None})


def current(name: str) -> Any:
    return (_context.get() or {}).get(name)


def log_event(event: str, *, level: int = logging.INFO, **fields: Any) -> None:
    record: dict[str, Any] = {
        "ts": timezone.now().isoformat(timespec="milliseconds"),
        "level": logging.getLevelName(level).lower(),
        "event": event,
        **(_context.get() or {}),
        **fields,
    }
    trace_id = current_trace_id()
    if trace_id:
        # The line and the request's trace are found from each other (console.tracing).
        record["trace_id"] = trace_id
    # The JSON line is the message, so that it reads the same under any handler and formatter;
    # the dict rides along in ``extra`` for handlers that ship fields rather than text.
    logger.log(level, json.dumps(record, ensure_ascii=False, default=str), extra={"api": record})
