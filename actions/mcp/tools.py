"""The MCP tools' behaviour: synchronous functions over the services, one per tool.

Each function takes the authenticated token and the tool's raw arguments, validates them
with the agent API's own request schemas (``actions.api.schemas``), calls one service or
selector, and answers with the API's own response shape (``actions.api.views.action_out``).
So a tool and its HTTP operation accept the same fields, refuse the same input with the
same field codes, and answer with the same document.

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
from collections.abc import Mapping
from dataclasses import asdict
from datetime import timedelta
from typing import Any, Literal, TypeVar

from django.conf import settings
from django.utils import timezone
from ninja import Schema
from pydantic import ConfigDict, Field, ValidationError

from actions.adjustments import (
    AdjustmentRequestConflict,
    action_propose_invoice_adjustment,
    adjustment_request_open,
)
from actions.agents import INVOICE_ADJUSTMENT_SCOPE
from actions.api.adjustments import (
    AdjustmentRequestOpen,
    AdjustmentRequestOut,
    InvoiceAdjustmentProposal,
    adjustment_request_out,
)
from actions.api.ratelimit import ratelimit_hit
from actions.api.schemas import (
    ActionOut,
    ActionStatusName,
    RefundProposal,
    RefundRequestOpen,
    RefundRequestOut,
    StatusExplanationOut,
)
from actions.api.views import action_out, field_errors_from_ninja, refund_request_out
from actions.models import ActionKind, ActionStatus, Agent, AgentToken, RequestSource
from actions.requests import RefundRequestConflict, refund_request_open
from actions.selectors import (
    MAX_PAGE_SIZE,
    InvalidCursor,
    action_explain_status,
    action_get_for_agent,
    action_list_for_agent,
    refund_request_by_reference,
)
from actions.services import Actor, ProposalConflict, ProposalInvalid, action_propose_refund

logger = logging.getLogger("actions.mcp")

ErrorKind = Literal["retryable", "needs_person", "bad_input"]

# The API's longest stored action id; a longer one cannot exist and answers "not found",
# like any other unknown id (actions.api.views.get_action does the same).
MAX_ACTION_ID_LENGTH = 255


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


def _invalid(invalid: ProposalInvalid) -> ToolFailure:
    errors = [problem.as_dict() for problem in invalid.problems]
    return ToolFailure(
        "bad_input",
        code="validation_failed",
        detail="Some arguments are invalid: " + "; ".join(f"{e['field']}: {e['message']}" for e in errors),
        errors=errors,
    )


def _count_call(token: AgentToken) -> None:
    # The same counter as the HTTP API's (actions.api.gateway): one budget per token, whichever
    # way the agent comes in.
    decision = ratelimit_hit(key=f"token:{token.pk}")
    if not decision.allowed:
        raise ToolFailure(
            "retryable",
            code="rate_limited",
            detail=f"This token made more than {decision.limit} calls this minute. Wait {decision.retry_after} "
            "seconds, then send the same call again.",
            retry_after_seconds=decision.retry_after,
        )


def _require_scope(agent: Agent, kind: str) -> None:
    # The scopes are named after the kinds, except the adjustments' (``invoice_adjustment``).
    scope = INVOICE_ADJUSTMENT_SCOPE if kind == ActionKind.INVOICE_ADJUSTMENT else kind
    if not agent.may_propose(scope):
        raise ToolFailure(
            "needs_person",
            code="scope_missing",
            detail=f"The agent {agent.name!r} may not propose {kind} actions: its scopes are "
            f"{', '.join(agent.scopes or []) or 'empty'}. Ask its owner.",
        )


def _proposed_elsewhere(noun: str = "refund request") -> ToolFailure:
    # As in the API: the other proposal's id and contents stay hidden from this agent.
    return ToolFailure(
        "needs_person",
        code="proposed_elsewhere",
        detail=f"This {noun} already has a proposal by another proposer. Nothing was written. Do not open a "
        f"new {noun} to get around it: ask a person.",
    )


def _not_found() -> ToolFailure:
    # One answer for "someone else's" and "does not exist", byte for byte: the id is not echoed.
    return ToolFailure("bad_input", code="action_not_found", detail="This agent has no action with this id.")


# Payload keys (the material payload) as the API's field names; the API's 409 does the same.
_PAYLOAD_FIELDS = {"order": "order_number", "request": "request_number"}
_ADJUSTMENT_PAYLOAD_FIELDS = {"bill": "bill_number", "adjustment": "adjustment_number"}


def _json(model: Schema) -> dict[str, Any]:
    return model.model_dump(mode="json")


# --- the tools ------------------------------------------------------------------------------


def open_refund_request(*, token: AgentToken, arguments: Mapping[str, Any]) -> dict[str, Any]:
    _count_call(token)
    payload = _validated(RefundRequestOpen, arguments)
    _require_scope(token.agent, ActionKind.REFUND)
    try:
        result = refund_request_open(
            order_number=payload.order_number,
            external_reference=payload.external_reference,
            note=payload.note,
            source=RequestSource.AGENT,
        )
    except ProposalInvalid as invalid:
        raise _invalid(invalid) from None
    except RefundRequestConflict as conflict:
        # The agent named the wrong order for this ticket: its input, not a person's decision.
        raise ToolFailure(
            "bad_input", code="reference_conflict", detail=str(conflict), differing=conflict.differing
        ) from None
    logger.info(
        "mcp.refund_request.%s agent=%s order=%s request=%s",
        "opened" if result.created else "replayed",
        token.agent.name,
        result.request.order.number,
        result.request.number,
    )
    out = refund_request_out(result.request)
    return _json(RefundRequestToolOut(created=result.created, **out.model_dump()))


def propose_refund(*, token: AgentToken, arguments: Mapping[str, Any]) -> dict[str, Any]:
    _count_call(token)
    payload = _validated(RefundProposal, arguments)
    agent = token.agent
    _require_scope(agent, ActionKind.REFUND)
    request_number = payload.request_number
    if request_number is None:
        assert payload.external_reference is not None  # the schema requires one of the two
        refund_request = refund_request_by_reference(
            order_number=payload.order_number, external_reference=payload.external_reference
        )
        if refund_request is None:
            raise ToolFailure(
                "bad_input",
                code="validation_failed",
                detail=f"Order {payload.order_number} has no refund request with this external reference. Open it "
                "first (the open_refund_request tool).",
                errors=[
                    {
                        "field": "external_reference",
                        "code": "not_found",
                        "message": f"Order {payload.order_number} has no refund request with this external reference.",
                    }
                ],
            )
        request_number = refund_request.number
    try:
        result = action_propose_refund(
            order_number=payload.order_number,
            request_number=request_number,
            amount=payload.amount,
            currency=payload.currency,
            reason_code=payload.reason_code.value,
            evidence=payload.evidence,
            proposer=Actor.for_agent(agent),
        )
    except ProposalInvalid as invalid:
        raise _invalid(invalid) from None
    except ProposalConflict as conflict:
        if conflict.action.proposed_by_agent_id != agent.pk:
            raise _proposed_elsewhere() from None
        logger.info("mcp.refund.conflict agent=%s action=%s", agent.name, conflict.action.action_id)
        raise ToolFailure(
            "needs_person",
            code="payload_conflict",
            detail=f"{conflict} Do not change the request number or open another refund request to get this "
            "through: read the existing action and ask a person.",
            action_id=conflict.action.action_id,
            differing={_PAYLOAD_FIELDS.get(name, name): values for name, values in conflict.differing.items()},
        ) from None
    action = result.action
    if action.proposed_by_agent_id != agent.pk:
        raise _proposed_elsewhere()
    logger.info(
        "mcp.refund.%s agent=%s action=%s status=%s",
        "proposed" if result.created else "replayed",
        agent.name,
        action.action_id,
        action.status,
    )
    return _json(action_out(action))


def open_adjustment_request(*, token: AgentToken, arguments: Mapping[str, Any]) -> dict[str, Any]:
    _count_call(token)
    payload = _validated(AdjustmentRequestOpen, arguments)
    _require_scope(token.agent, ActionKind.INVOICE_ADJUSTMENT)
    try:
        result = adjustment_request_open(
            bill_number=payload.bill_number, external_reference=payload.external_reference, note=payload.note
        )
    except ProposalInvalid as invalid:
        raise _invalid(invalid) from None
    except AdjustmentRequestConflict as conflict:
        # The agent named the wrong bill for this mismatch: its input, not a person's decision.
        raise ToolFailure(
            "bad_input", code="reference_conflict", detail=str(conflict), differing=conflict.differing
        ) from None
    logger.info(
        "mcp.adjustment_request.%s agent=%s bill=%s adjustment=%s",
        "opened" if result.created else "replayed",
        token.agent.name,
        result.request.bill.number,
        result.request.number,
    )
    out = adjustment_request_out(result.request)
    return _json(AdjustmentRequestToolOut(created=result.created, **out.model_dump()))


def propose_invoice_adjustment(*, token: AgentToken, arguments: Mapping[str, Any]) -> dict[str, Any]:
    _count_call(token)
    payload = _validated(InvoiceAdjustmentProposal, arguments)
    agent = token.agent
    _require_scope(agent, ActionKind.INVOICE_ADJUSTMENT)
    try:
        result = action_propose_invoice_adjustment(
            bill_number=payload.bill_number,
            adjustment_number=payload.adjustment_number,
            amount=payload.amount,
            currency=payload.currency,
            reason_code=payload.reason_code.value,
            evidence=payload.evidence,
            proposer=Actor.for_agent(agent),
        )
    except ProposalInvalid as invalid:
        raise _invalid(invalid) from None
    except ProposalConflict as conflict:
        if conflict.action.proposed_by_agent_id != agent.pk:
            raise _proposed_elsewhere("adjustment request") from None
        logger.info("mcp.invoice_adjustment.conflict agent=%s action=%s", agent.name, conflict.action.action_id)
        raise ToolFailure(
            "needs_person",
            code="payload_conflict",
            detail=f"{str(conflict).replace('refund request', 'adjustment request')} Do not change the adjustment "
            "number or open another adjustment request to get this through: read the existing action and ask a "
            "person.",
            action_id=conflict.action.action_id,
            differing={
                _ADJUSTMENT_PAYLOAD_FIELDS.get(name, name): values for name, values in conflict.differing.items()
            },
        ) from None
    action = result.action
    if action.proposed_by_agent_id != agent.pk:
        raise _proposed_elsewhere("adjustment request")
    logger.info(
        "mcp.invoice_adjustment.%s agent=%s action=%s status=%s",
        "proposed" if result.created else "replayed",
        agent.name,
        action.action_id,
        action.status,
    )
    return _json(action_out(action))


def get_action(*, token: AgentToken, arguments: Mapping[str, Any]) -> dict[str, Any]:
    _count_call(token)
    ref = _validated(ActionRef, arguments)
    if len(ref.action_id) > MAX_ACTION_ID_LENGTH:
        raise _not_found()
    action = action_get_for_agent(agent=token.agent, action_id=ref.action_id)
    if action is None:
        raise _not_found()
    return _json(action_out(action))


def list_actions(*, token: AgentToken, arguments: Mapping[str, Any]) -> dict[str, Any]:
    _count_call(token)
    query = _validated(ActionListQuery, arguments)
    try:
        page = action_list_for_agent(
            agent=token.agent, statuses=list(query.status), cursor=query.cursor, limit=query.limit
        )
    except InvalidCursor as invalid:
        raise ToolFailure(
            "bad_input",
            code="validation_failed",
            detail=str(invalid),
            errors=[{"field": "cursor", "code": "invalid_cursor", "message": str(invalid)}],
        ) from None
    return _json(ActionListOut(items=[action_out(action) for action in page.items], next_cursor=page.next_cursor))


def explain_action(*, token: AgentToken, arguments: Mapping[str, Any]) -> dict[str, Any]:
    _count_call(token)
    ref = _validated(ActionRef, arguments)
    action = (
        action_get_for_agent(agent=token.agent, action_id=ref.action_id)
        if len(ref.action_id) <= MAX_ACTION_ID_LENGTH
        else None
    )
    if action is None:
        raise _not_found()
    explanation = action_explain_status(action)
    read_again: int | None = None
    if explanation.final:
        agent_should = "Report the outcome to the customer. Nothing about this action will change any more."
    elif explanation.needs_person:
        agent_should = (
            f"Tell the customer that {explanation.held_by} is handling it. Do not propose again and do not try "
            "another way to pay; read this action later."
        )
    else:
        # The next reconciliation is when an UNKNOWN action can change; anything else the
        # workers move within a sweep interval.
        read_again = int(settings.SWEEP_INTERVAL_SECONDS)
        if action.status == ActionStatus.UNKNOWN and action.next_reconcile_at is not None:
            read_again = max(1, int((action.next_reconcile_at - timezone.now()) / timedelta(seconds=1)))
        agent_should = (
            "Wait, then read this action again (get_action). Never send a new proposal and never tell the customer "
            "it failed while it is not final."
        )
    out = ActionExplanationOut(
        action_id=action.action_id,
        status=action.status,  # type: ignore[arg-type]
        explanation=StatusExplanationOut(**asdict(explanation)),
        agent_should=agent_should,
        read_again_after_seconds=read_again,
    )
    return _json(out)
