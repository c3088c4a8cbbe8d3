"""The refusals of the agent-facing operations: one exception type, four classes of answer.

Every interface maps a refusal by its ``outcome`` alone (the REST API to a status code, the MCP
server to a tool error kind), so the same refusal is the same class of answer on both:

====================  ===========  ===========================================
outcome               REST         MCP
====================  ===========  ===========================================
``NOT_FOUND``         404          ``bad_input`` (the id is the agent's input)
``FORBIDDEN``         403          ``needs_person`` (its owner grants scopes)
``INVALID``           422          ``bad_input``
``CONFLICT``          409          ``needs_person``, except ``reference_conflict``
====================  ===========  ===========================================

``code`` says which refusal it is, in the same words on both interfaces.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Any, ClassVar

from actions.kinds.fields import FieldProblem


class Outcome(StrEnum):
    NOT_FOUND = "not_found"
    FORBIDDEN = "forbidden"
    INVALID = "invalid"
    CONFLICT = "conflict"


class AgentRefusal(Exception):
    """An agent's call refused; nothing was written.

    - ``code``: machine-readable, the same on every interface;
    - ``detail``: a sentence for the agent;
    - ``errors``: for bad input, one problem per field;
    - ``facts``: what the agent may learn of the record it met (only ever its own: the id of
      its own action or workflow, the fields that differ), as JSON-ready values.
    """

    outcome: ClassVar[Outcome]

    def __init__(
        self, *, code: str, detail: str, errors: Iterable[FieldProblem] = (), facts: dict[str, Any] | None = None
    ) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.errors = list(errors)
        self.facts = facts or {}


class NotFound(AgentRefusal):
    """No such record among the agent's own: another agent's reads exactly like a missing one."""

    outcome = Outcome.NOT_FOUND


class Forbidden(AgentRefusal):
    """The agent may not do this (its scopes): a person, its owner, decides."""

    outcome = Outcome.FORBIDDEN


class Invalid(AgentRefusal):
    """Bad input: each problem names its field."""

    outcome = Outcome.INVALID


class Conflict(AgentRefusal):
    """The business reference already names something else, or a proposal by someone else."""

    outcome = Outcome.CONFLICT


# Messages that would tell an agent more than its own request needs: the order's captured,
# refunded and reserved amounts include other parties' refunds.
_DISCREET_MESSAGES = {
    "over_refundable_balance": "The amount is more than the order's refundable balance: the order cannot pay it. "
    "Nothing was written. Ask a person if the customer is owed more.",
}


def invalid(problems: Iterable[FieldProblem], *, detail: str | None = None) -> Invalid:
    """The refusal for bad fields, with the messages an agent may read."""
    shown = [
        FieldProblem(problem.field, problem.code, _DISCREET_MESSAGES.get(problem.code, problem.message))
        for problem in problems
    ]
    return Invalid(
        code="validation_failed",
        detail=detail or "Some fields are invalid: " + "; ".join(f"{p.field}: {p.message}" for p in shown),
        errors=shown,
    )
