"""The MCP tools' behaviour: synchronous functions over the services, one per tool.

Each function takes the authenticated token and the tool's raw arguments, validates them
with the agent API's own request schemas (``actions.api.schemas``), calls the same
agent-facing service as the HTTP operation (``actions.proposals``), and answers with the API's
own response shape (``actions.api.views.action_out``). So a tool and its HTTP operation accept
the same fields, apply the same rules (scopes, other agents' records, "proposed elsewhere"),
refuse with the same codes, and answer with the same document.

Failures are ``ToolFailure`` with one of three kinds, which tell the calling model what to
do, in the words MCP clients can act on:

- ``bad_input``: the arguments are wrong (each field is named); nothing was written.
  Correct the named fields; sending the same arguments again gives the same answer.
- ``needs_person``: the call is well-formed but a person must decide (the refund request
  already has a different proposal, the agent lacks the scope). Retrying cannot help and
  changing references to get around it is wrong.
- ``retryable``: the console could not answer (rate limit, database unavailable, a crash).
  Whether a write happened is unknown, and sending the *same* call again is safe.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from ninja import Schema
from pydantic import ConfigDict, Field, ValidationError

from actions.api.adjustments import (
    AdjustmentRequestOpen,
    AdjustmentRequestOut,
    InvoiceAdjustmentProposal,
    adjustment_request_out,
)
from actions.api.ratelimit import token_ratelimit_hit
from actions.api.schemas import (
    ActionOut,
    ActionStatusName,
    RefundProposal,
    RefundRequestOpen,
    RefundRequestOut,
    StatusExplanationOut,
    service_arguments,
)
from actions.api.views import action_out, field_errors_from_ninja, refund_request_out
from actions.models import AgentToken
from actions.proposals.adjustments import agent_adjustment_request_open, agent_invoice_adjustment_propose
from actions.proposals.outcomes import AgentRefusal, Outcome
from actions.proposals.reads import agent_action_explain, agent_action_list, agent_action_read
from actions.proposals.refunds import agent_refund_propose, agent_refund_request_open
from actions.selectors import MAX_PAGE_SIZE

if TYPE_CHECKING:
    from actions.services import ProposalResult, RequestOpened

logger = logging.getLogger("actions.mcp")

ErrorKind = Literal["retryable", "needs_person", "bad_input"]


class ToolFailure(Exception):
    """A tool's typed failure; ``as_dict`` is the structured content of the error result."""

    def __init__(
        self,
        kind: ErrorKind,
        *,
        code: str,
        detail: str,
        errors: list[dict[str, str]] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.kind: ErrorKind = kind
        self.code = code
        self.detail = detail
        self.errors = errors or []
        self.extra = extra

    def as_dict(self) -> dict[str, Any]:
        return {"error": self.kind, "code": self.code, "detail": self.detail, "errors": self.errors, **self.extra}


# --- inputs of the read tools (the write tools use the API's request schemas as they are) --


class ActionRef(Schema):
    model_config = ConfigDict(extra="forbid")

    action_id: str = Field(
        description="The action's id as the console returned it, e.g. 'refund:order-4821:request-1'.",
        examples=["refund:order-4821:request-1"],
    )


class ActionListQuery(Schema):
    model_config = ConfigDict(extra="forbid")

    status: list[ActionStatusName] = Field(
        [], description="Only actions in these statuses (repeat the parameter for several)."
    )
    cursor: str | None = Field(None, max_length=2000, description="From the previous page's next_cursor.")
    limit: int = Field(50, ge=1, le=MAX_PAGE_SIZE, description="Page size.")


# --- outputs: the API's documents, plus what its status codes say over HTTP ----------------


class RefundRequestToolOut(RefundRequestOut):
    created: bool = Field(description="True when this call opened the request; false when it existed (a retry).")


class AdjustmentRequestToolOut(AdjustmentRequestOut):
    created: bool = Field(description="True when this call opened the request; false when it existed (a retry).")


class ActionListOut(Schema):
    items: list[ActionOut]
    next_cursor: str | None = Field(description="Pass as cursor to read the next page; null on the last page.")


class ActionExplanationOut(Schema):
    action_id: str
    status: ActionStatusName
    explanation: StatusExplanationOut
    agent_should: str = Field(description="What the calling agent should do now, in a sentence.")
    read_again_after_seconds: int | None = Field(
        description="When reading the action again could show something new; null when it is final or a person "
        "holds it."
    )


# --- helpers --------------------------------------------------------------------------------


S = TypeVar("S", bound=Schema)


def _validated(model: type[S], arguments: Mapping[str, Any]) -> S:
    try:
        return model.model_validate(dict(arguments))
    except ValidationError as invalid:
        # The API's own mapping from pydantic's errors to field codes; it expects the
        # locations ninja reports (body, then the view's parameter name).
        raw = [{**error, "loc": ("body", "payload", *error["loc"])} for error in invalid.errors()]
        errors = field_errors_from_ninja(raw)
        raise ToolFailure(
            "bad_input",
            code="validation_failed",
            detail="Some arguments are invalid: " + "; ".join(f"{e['field']}: {e['message']}" for e in errors),
            errors=errors,
        ) from None


def _count_call(token: AgentToken) -> None:
    decision = token_ratelimit_hit(token)
    if not decision.allowed:
        raise ToolFailure(
            "retryable",
            code="rate_limited",
            detail=f"This token made more than {decision.limit} calls this minute. Wait {decision.retry_after} "
            "seconds, then send the same call again.",
            retry_after_seconds=decision.retry_after,
        )


# A refusal's outcome as a tool error kind (actions.proposals.outcomes); one code differs from
# its outcome's kind: a reference that names a request on another order or bill is the agent's
# own input to correct, not a person's decision.
_KIND_BY_OUTCOME: dict[Outcome, ErrorKind] = {
    Outcome.NOT_FOUND: "bad_input",
    Outcome.FORBIDDEN: "needs_person",
    Outcome.INVALID: "bad_input",
    Outcome.CONFLICT: "needs_person",
}
_KIND_BY_CODE: dict[str, ErrorKind] = {"reference_conflict": "bad_input"}

# What a model tends to try next, and must not.
_ADVICE = {
    "payload_conflict": " Do not change the request's number or open another request to get this through: read "
    "the existing action and ask a person.",
}


def refusal_failure(refusal: AgentRefusal) -> ToolFailure:
    """The tool error of an agent-facing operation's refusal: its kind, code, words, each field
    problem and what the agent may know of its own record."""
    return ToolFailure(
        _KIND_BY_CODE.get(refusal.code, _KIND_BY_OUTCOME[refusal.outcome]),
        code=refusal.code,
        detail=refusal.detail + _ADVICE.get(refusal.code, ""),
        errors=[problem.as_dict() for problem in refusal.errors],
        **refusal.facts,
    )


def _json(model: Schema) -> dict[str, Any]:
    return model.model_dump(mode="json")


R = TypeVar("R")


def _served(
    token: AgentToken,
    schema: type[Schema],
    service: Callable[..., R],
    arguments: Mapping[str, Any],
    *,
    subject: str | None = None,
) -> R:
    """Count the call, validate its arguments with the API's request schema and call the
    agent-facing service with its fields; the service's refusal is the tool's error."""
    _count_call(token)
    payload = _validated(schema, arguments)
    try:
        return service(agent=token.agent, **service_arguments(payload))
    except AgentRefusal as refusal:
        if subject is not None:
            logger.info("mcp.%s.refused agent=%s code=%s", subject, token.agent.name, refusal.code)
        raise refusal_failure(refusal) from None


def _proposed(
    token: AgentToken,
    subject: str,
    schema: type[Schema],
    service: Callable[..., ProposalResult],
    arguments: Mapping[str, Any],
) -> dict[str, Any]:
    """A proposal tool's answer: the action, new or the one the same proposal made before."""
    result = _served(token, schema, service, arguments, subject=subject)
    action = result.action
    logger.info(
        "mcp.%s.%s agent=%s action=%s status=%s",
        subject,
        "proposed" if result.created else "replayed",
        token.agent.name,
        action.action_id,
        action.status,
    )
    return _json(action_out(action))


def _opened(
    token: AgentToken,
    subject: str,
    schema: type[Schema],
    service: Callable[..., RequestOpened[Any]],
    arguments: Mapping[str, Any],
    tool_out: Callable[..., Schema],
    out: Callable[[Any], Schema],
) -> dict[str, Any]:
    """A request-opening tool's answer: the API's document of the request, and whether this
    call opened it. The log line names the request by its numbers, without their "_number"
    (``order=4821 request=2``)."""
    result = _served(token, schema, service, arguments)
    numbers = result.numbers
    logger.info(
        "mcp.%s.%s agent=%s " + " ".join(f"{name.removesuffix('_number')}=%s" for name in numbers),
        subject,
        "opened" if result.created else "replayed",
        token.agent.name,
        *numbers.values(),
    )
    return _json(tool_out(created=result.created, **out(result.request).model_dump()))


# --- the tools ------------------------------------------------------------------------------


def open_refund_request(*, token: AgentToken, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Open a refund request.

    Open a refund request on an order for a customer's ticket (external_reference: the support ticket's id) and get
    its request number. Calling this again with the same ticket reference returns the same request (created: false);
    it never opens a second one. A reference that already belongs to another order is bad_input
    (reference_conflict); one that another agent opened is needs_person (reference_taken). Then propose the refund
    with propose_refund.
    """
    return _opened(
        token,
        "refund_request",
        RefundRequestOpen,
        agent_refund_request_open,
        arguments,
        RefundRequestToolOut,
        refund_request_out,
    )


def propose_refund(*, token: AgentToken, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Propose a refund.

    Propose a refund for a refund request on an order: the order number, the refund request (its request_number, or
    the external_reference it was opened with, not both), the amount as a decimal string such as "12.50", the
    currency, a reason code and evidence for the manager who decides. Calling this again with the same arguments
    returns the same action; it never refunds twice. After a timeout or a dropped connection, send the same call
    again. Different arguments for a refund request that already has a proposal are refused as needs_person
    (payload_conflict, with the differing fields): do not change the request number or open another request to get
    it through. A refund request another agent opened reads as no request at all (bad_input, not_found). The money
    moves only after approval (a manager, or the policy for small amounts); follow the action with get_action.
    """
    return _proposed(token, "refund", RefundProposal, agent_refund_propose, arguments)


def open_adjustment_request(*, token: AgentToken, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Open an adjustment request on a supplier bill.

    Open an adjustment request on a supplier bill that failed its purchase-order match (external_reference: the
    matcher's exception id) and get its adjustment number. Calling this again with the same reference returns the
    same request (created: false); it never opens a second one. A reference that already belongs to another bill is
    bad_input (reference_conflict); one that another agent opened is needs_person (reference_taken). Then propose
    the credit note with propose_invoice_adjustment. Needs the invoice_adjustment scope.
    """
    return _opened(
        token,
        "adjustment_request",
        AdjustmentRequestOpen,
        agent_adjustment_request_open,
        arguments,
        AdjustmentRequestToolOut,
        adjustment_request_out,
    )


def propose_invoice_adjustment(*, token: AgentToken, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Propose an invoice adjustment.

    Propose an invoice adjustment: a credit note against a supplier bill in the accounting system, for one of the
    bill's adjustment requests. Give the bill number, the adjustment_number, the amount as a decimal string such as
    "20.00" (at most what is left to adjust on the bill), the bill's currency, a reason code and evidence for the
    manager who decides. Calling this again with the same arguments returns the same action; it never creates a
    second credit note. After a timeout or a dropped connection, send the same call again. Different arguments for
    an adjustment request that already has a proposal are refused as needs_person (payload_conflict, with the
    differing fields): do not change the adjustment number or open another request to get it through. An adjustment
    request another agent opened reads as no request at all (bad_input, not_found). The credit note is posted only
    after approval (a manager, or the policy for small amounts within the per-bill cap); follow the action with
    get_action or explain_action. Needs the invoice_adjustment scope.
    """
    return _proposed(
        token, "invoice_adjustment", InvoiceAdjustmentProposal, agent_invoice_adjustment_propose, arguments
    )


def get_action(*, token: AgentToken, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Read an action.

    Read one of this agent's actions by its action_id: its status, a plain-language explanation (what happens next,
    who holds it, whether it is final) and the payment provider's reference once known. An id that is not this
    agent's is bad_input (action_not_found), exactly like an id that does not exist. Read-only: repeat it as often
    as needed.
    """
    _count_call(token)
    ref = _validated(ActionRef, arguments)
    try:
        return _json(action_out(agent_action_read(agent=token.agent, action_id=ref.action_id)))
    except AgentRefusal as refusal:
        raise refusal_failure(refusal) from None


def list_actions(*, token: AgentToken, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """List this agent's actions.

    List this agent's actions, newest first, optionally only some statuses, a page at a time (pass next_cursor as
    cursor for the next page). Read-only: repeat it as often as needed.
    """
    _count_call(token)
    query = _validated(ActionListQuery, arguments)
    try:
        page = agent_action_list(agent=token.agent, statuses=list(query.status), cursor=query.cursor, limit=query.limit)
    except AgentRefusal as refusal:
        raise refusal_failure(refusal) from None
    return _json(ActionListOut(items=[action_out(action) for action in page.items], next_cursor=page.next_cursor))


def explain_action(*, token: AgentToken, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Explain an action.

    Explain one of this agent's actions in plain language: what is true now, what happens next, who holds it, and
    what the agent should do (agent_should), with when to read it again. Use it whenever a status is not final.
    Read-only: repeat it as often as needed.
    """
    _count_call(token)
    ref = _validated(ActionRef, arguments)
    try:
        explained = agent_action_explain(agent=token.agent, action_id=ref.action_id)
    except AgentRefusal as refusal:
        raise refusal_failure(refusal) from None
    out = ActionExplanationOut(
        action_id=explained.action.action_id,
        status=explained.action.status,  # type: ignore[arg-type]
        explanation=StatusExplanationOut(**asdict(explained.explanation)),
        agent_should=explained.agent_should,
        read_again_after_seconds=explained.read_again_after_seconds,
    )
    return _json(out)
