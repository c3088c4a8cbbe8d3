"""The client's typed errors, one per thing an agent does differently.

Every error has a ``kind``, the same three the MCP tools use:

- ``bad_input``: fix the named fields (``errors``); sending the same call again gives the
  same answer. Nothing was written.
- ``needs_person``: stop and report; a person must act (a different proposal already exists
  for the refund request, the token was revoked, the agent lacks a scope).
- ``retryable``: the console did not answer in time, even after the client's own retries.
  Whether a write happened is unknown; sending the same call again later is safe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

ErrorKind = Literal["retryable", "needs_person", "bad_input"]


@dataclass(frozen=True)
class FieldError:
    field: str
    code: str
    message: str


class ConsoleError(Exception):
    """An answer that is not the requested record. ``problem`` is the API's problem document."""

    kind: ErrorKind = "needs_person"

    def __init__(
        self, detail: str, *, status: int | None = None, code: str = "", problem: dict[str, Any] | None = None
    ):
        super().__init__(detail)
        self.detail = detail
        self.status = status
        self.code = code
        self.problem = problem or {}


class BadInput(ConsoleError):
    """422 (and 400, 413, 415): ``errors`` names each invalid field."""

    kind: ErrorKind = "bad_input"

    @property
    def errors(self) -> list[FieldError]:
        return [
            FieldError(field=str(e.get("field", "")), code=str(e.get("code", "")), message=str(e.get("message", "")))
            for e in self.problem.get("errors", [])
            if isinstance(e, dict)
        ]


class NotFound(BadInput):
    """404: not among this agent's records (the same answer whether it exists for another agent)."""


class Conflict(ConsoleError):
    """409: the business reference already names something different.

    ``payload_conflict``: this refund request already has a proposal with other values;
    ``differing`` maps each field to its existing and proposed value and ``action_id`` names
    the existing action. Read it and report; never change the request number to get a retry
    through. ``proposed_elsewhere``: another proposer owns the request. Both need a person.
    ``reference_conflict``: the ticket reference belongs to another order; that is the
    caller's input (``kind`` is ``bad_input``).
    """

    def __init__(
        self, detail: str, *, status: int | None = None, code: str = "", problem: dict[str, Any] | None = None
    ):
        super().__init__(detail, status=status, code=code, problem=problem)
        if code == "reference_conflict":
            self.kind = "bad_input"

    @property
    def action_id(self) -> str | None:
        value = self.problem.get("action_id")
        return str(value) if value else None

    @property
    def differing(self) -> dict[str, dict[str, Any]]:
        value = self.problem.get("differing") or {}
        return dict(value) if isinstance(value, dict) else {}


class NotAllowed(ConsoleError):
    """401 or 403: the token is missing, revoked or rotated, the agent is deactivated, or its
    scopes do not cover the call. Its owner must act."""


class Unavailable(ConsoleError):
    """No answer after every retry (timeouts, dropped connections, 5xx, 429). The outcome of a
    write is unknown; the same call is safe to send again later."""

    kind: ErrorKind = "retryable"


class OutcomeTimeout(TimeoutError):
    """``wait_for_outcome`` reached its timeout; ``action`` is the last state read (or None)."""

    def __init__(self, message: str, *, action: Any) -> None:
        super().__init__(message)
        self.action = action
