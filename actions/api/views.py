"""The agent API's operations: thin interfaces over one service or selector each.

Every error leaves as a problem document (``actions.api.problems``): the exception handlers
below replace django-ninja's default bodies, and ``ConsoleApi.get_openapi_schema`` declares
them (as application/problem+json) next to the errors the gateway answers before ninja runs.
"""

from __future__ import annotations

import json
import logging
import traceback
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlencode

from django.http import Http404, HttpRequest, HttpResponse
from django.urls import reverse
from ninja import NinjaAPI, Query, Schema, Status
from ninja.errors import HttpError, ValidationError
from ninja.parser import Parser

from actions.api.auth import AgentBearer
from actions.api.docs import SelfContainedDocs
from actions.api.logs import bind, log_event
from actions.api.problems import (
    KINDS,
    PROBLEM_CONTENT_TYPE,
    ApiProblem,
    kind_for_status,
    problem_response,
    refusal_problem,
)
from actions.api.schemas import (
    ActionOut,
    ActionPageOut,
    ActionStatusName,
    OrderOut,
    OrderUpsert,
    Problem,
    RefundProposal,
    RefundRequestOpen,
    RefundRequestOut,
    RejectionReason,
    StatusExplanationOut,
    SupplierEmailProposal,
    service_arguments,
)
from actions.api.versions import request_upgrade
from actions.models import Action, Agent, Order, RefundRequest
from actions.proposals.orders import agent_order_upsert
from actions.proposals.outcomes import AgentRefusal
from actions.proposals.reads import agent_action_list, agent_action_read
from actions.proposals.refunds import agent_refund_propose, agent_refund_request_open
from actions.proposals.supplier_emails import agent_supplier_email_propose
from actions.selectors import MAX_PAGE_SIZE, action_explain_status

if TYPE_CHECKING:
    from actions.services import ProposalResult, RequestOpened

R = TypeVar("R")
F = TypeVar("F", bound=Callable[..., Any])
# A request's document: a refund request's, an adjustment request's.
D = TypeVar("D", bound=Schema)

DESCRIPTION = """\
The agent API of the effect console. An agent proposes refunds and reads what became of them;
managers approve in the console, workers execute with a stable idempotency key, and unclear
outcomes are reconciled with the payment provider, never blindly retried.

Authenticate every request with `Authorization: Bearer <token>` (tokens are issued by the
agent's owner, on the owner's account page in the console). Bodies are JSON
(`Content-Type: application/json`), each key once. Every error is an RFC 9457 problem
document (`application/problem+json`) with a machine-readable `code` and, for bad input, one
entry per field in `errors`.

A shop's commerce system sends its orders to `POST /api/v1/orders` (scope `orders`), the whole
order each time it changes; agents with the scope `refund` propose refunds on them. Agents with
the scope `invoice_adjustment` open adjustment requests on supplier bills that failed their
purchase-order match (`POST /api/v1/adjustment-requests`) and propose credit notes against them
(`POST /api/v1/invoice-adjustments`), with the same semantics.

Versions are dated. Each token is pinned to the version of the day it was created; send
`Console-Version: <date>` to choose another. Every answer names its version in the same
header; an answer in a superseded version also carries `Deprecation` and `Sunset` headers.
A request of an older version is answered as that version promised, except where a change
could not be kept: then a 422 names the field and the version that requires it. Treat a value
of a response enum that you do not know (a new status) as "not known to this client".

Sending the same proposal again is always safe: it returns the existing action (200). A 409
means the business reference already names a different proposal: read it, never invent a new
reference. An action in UNKNOWN or NEEDS_REVIEW is being resolved by the console: wait and read.
"""


class DuplicateKeys(ValueError):
    """A JSON object in the body names the same key twice."""

    def __init__(self, keys: list[str]) -> None:
        super().__init__(", ".join(keys))
        self.keys = keys


def _refuse_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: set[str] = set()
    duplicates = []
    for key, _ in pairs:
        if key in seen and key not in duplicates:
            duplicates.append(key)
        seen.add(key)
    if duplicates:
        raise DuplicateKeys(duplicates)
    return dict(pairs)


class StrictJsonParser(Parser):
    """JSON with every key once. Python's json keeps the last of two equal keys, and another
    parser on the way (a proxy, a log, the agent's own) may keep the first: the two would read
    different amounts from one body."""

    def parse_body(self, request: HttpRequest) -> Any:
        data = json.loads(request.body, object_pairs_hook=_refuse_duplicate_keys)
        version = getattr(request, "console_version", None)
        match = request.resolver_match
        if version is not None and match is not None and isinstance(data, dict):
            # A request of an older API version, answered as that version promised.
            data = request_upgrade(version=version, operation=match.url_name or "", body=data)
        return data


class ConsoleApi(NinjaAPI):
    def get_openapi_schema(self, *, path_prefix: str | None = None, path_params: Any = None) -> Any:
        schema = super().get_openapi_schema(path_prefix=path_prefix, path_params=path_params)
        return openapi_declare_problems(schema)


api = ConsoleApi(
    title="Effect console agent API",
    version="1",
    description=DESCRIPTION,
    urls_namespace="api-v1",
    auth=AgentBearer(),
    docs=SelfContainedDocs(),
    parser=StrictJsonParser(),
)


def idempotent_post(path: str, out: type[Schema], *, url_name: str, summary: str, tag: str) -> Callable[[F], F]:
    """Declare a POST that is safe to send again: 201 with ``out`` for a new record, 200 with
    ``out`` for the existing one; 409 when its business reference names something else; 422
    naming each invalid field."""
    return api.post(
        path,
        response={200: out, 201: out, 409: Problem, 422: Problem},
        url_name=url_name,
        summary=summary,
        tags=[tag],
    )


# --- the OpenAPI document declares every answer, including the gateway's ------------------

_GATEWAY_RESPONSES = {
    401: "Missing, unknown, revoked or rotated token.",
    403: "The agent is deactivated, or its scopes do not cover this kind of action.",
    429: "Too many requests with this token: wait Retry-After seconds.",
}
_BODY_RESPONSES = {
    400: "The body is not valid JSON.",
    413: "The body is larger than the API accepts.",
    415: "The body is not JSON.",
    422: "Invalid fields: each is named in 'errors' with a code.",
}

# Better words than the HTTP reason phrases ninja puts on the responses each operation declares.
_DESCRIPTIONS = {
    "200": "The existing record: the same request was made before (a retry is always safe).",
    "201": "Created.",
    "404": "Not among this agent's records (the same answer whether it exists for someone else or not at all).",
    "409": "The business reference already names something different: read it; do not invent a new reference.",
    "422": "Invalid fields: each is named in 'errors' with a code. Nothing was written.",
}


# Where an operation's own words are better than the shared ones above.
_OPERATION_DESCRIPTIONS = {
    ("post", "/api/v1/orders"): {
        "200": "The order exists: unchanged when 'changed' is empty, otherwise updated and its version raised.",
        "409": "The change cannot apply to the order as the console knows it (the field is named in 'errors'). "
        "Nothing was written.",
    },
}


def openapi_declare_problems(schema: Any) -> Any:
    """Declare the gateway's answers on every operation and serve errors as problem+json."""
    problem_ref = {"$ref": "#/components/schemas/Problem"}
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            # ninja keys responses by int; JSON keys are strings. One kind of key, or 422
            # would appear twice in the served document.
            responses = {str(status): response for status, response in operation.get("responses", {}).items()}
            operation["responses"] = responses
            extra = dict(_GATEWAY_RESPONSES)
            if method in ("post", "put", "patch"):
                extra.update(_BODY_RESPONSES)
            for code, description in extra.items():
                responses.setdefault(str(code), {"description": description})
            for key, description in _DESCRIPTIONS.items():
                if key in responses and (key != "200" or method == "post"):
                    responses[key]["description"] = description
            for key, description in _OPERATION_DESCRIPTIONS.get((method, path), {}).items():
                responses[key]["description"] = description
            for key, response in responses.items():
                if int(key) >= 400:
                    response["content"] = {PROBLEM_CONTENT_TYPE: {"schema": problem_ref}}
            responses["429"]["headers"] = {
                "Retry-After": {
                    "description": "Seconds to wait before sending the same request again.",
                    "required": True,
                    "schema": {"type": "integer", "minimum": 1},
                }
            }
            responses["401"]["headers"] = {
                "WWW-Authenticate": {"description": "The Bearer challenge.", "schema": {"type": "string"}}
            }
    return schema


# --- errors: every one becomes a problem document ----------------------------------------

# Pydantic's error types, mapped to the same codes the services use.
_CODES = {
    "missing": "required",
    "extra_forbidden": "unknown_field",
    "string_pattern_mismatch": "invalid_format",
    "string_too_long": "too_long",
    "string_too_short": "too_short",
    "greater_than_equal": "out_of_range",
    "less_than_equal": "out_of_range",
    "greater_than": "out_of_range",
    "less_than": "out_of_range",
    "enum": "invalid_choice",
    "literal_error": "invalid_choice",
    "json_invalid": "malformed_json",
}
_TYPE_ERRORS = ("_type", "_parsing", "int_from_float")
_MESSAGES = {
    ("amount", "invalid_type"): 'Give the amount as a decimal string, e.g. "12.50".',
    ("amount", "invalid_format"): 'Give the amount as a decimal string of digits and at most one ".", e.g. "12.50".',
    ("request_number", "invalid_type"): "The refund request number must be a JSON integer.",
    ("body", "required"): "The body is empty: send a JSON object with the fields of the request.",
    ("body", "invalid_type"): "Send a JSON object with the fields of the request.",
}


def _field_name(loc: tuple[Any, ...] | list[Any], ctx: dict[str, Any] | None) -> str:
    if ctx and isinstance(ctx.get("field"), str):
        return str(ctx["field"])
    parts = [str(part) for part in loc]
    source, rest = (parts[0], parts[1:]) if parts else ("body", [])
    if source == "body":
        rest = rest[1:]  # the view's parameter name ("payload") is not part of the contract
    return ".".join(rest) or source


def _code(error_type: str) -> str:
    if error_type in _CODES:
        return _CODES[error_type]
    if error_type.endswith(_TYPE_ERRORS) or error_type in ("model_type", "model_attributes_type", "dict_type"):
        return "invalid_type"
    return error_type


def field_errors_from_ninja(errors: list[dict[str, Any]]) -> list[dict[str, str]]:
    result = []
    for error in errors:
        field = _field_name(error.get("loc", ()), error.get("ctx"))
        code = _code(str(error.get("type", "invalid")))
        message = _MESSAGES.get((field, code), str(error.get("msg", "Invalid value.")))
        result.append({"field": field, "code": code, "message": message})
    return result


@api.exception_handler(ApiProblem)
def _on_problem(request: HttpRequest, exc: ApiProblem) -> HttpResponse:
    return problem_response(request, exc)


@api.exception_handler(ValidationError)
def _on_validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    errors = field_errors_from_ninja(exc.errors)
    log_event("request.invalid", errors=errors)
    return problem_response(
        request,
        ApiProblem(
            "invalid-request",
            code="validation_failed",
            detail="Some fields are invalid: " + "; ".join(f"{e['field']}: {e['message']}" for e in errors),
            errors=errors,
        ),
    )


@api.exception_handler(HttpError)
def _on_http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    if isinstance(exc.__cause__, ApiProblem):
        # Raised by the parser: an older version's request that the newest code cannot take.
        problem = exc.__cause__
    elif exc.status_code == 400 and isinstance(exc.__cause__, DuplicateKeys):
        keys = exc.__cause__.keys
        problem = ApiProblem(
            "invalid-request",
            code="duplicate_keys",
            detail=f"The body names {', '.join(keys)} more than once. Send each field once. Nothing was written.",
            errors=[
                {"field": key, "code": "duplicate_key", "message": "This key appears more than once."} for key in keys
            ],
        )
    elif exc.status_code == 400:
        # django-ninja raises this when the body does not parse as JSON.
        problem = ApiProblem("malformed-json", code="malformed_json", detail="The body is not valid JSON.")
    else:
        kind = kind_for_status(exc.status_code)
        problem = ApiProblem(kind, code=kind.replace("-", "_"), detail=str(exc) or KINDS[kind].title)
    return problem_response(request, problem)


@api.exception_handler(Http404)
def _on_not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
    return problem_response(request, ApiProblem("not-found", code="not_found", detail="There is no such resource."))


@api.exception_handler(Exception)
def _on_crash(request: HttpRequest, exc: Exception) -> HttpResponse:
    log_event("request.crashed", level=logging.ERROR, error=repr(exc), traceback=traceback.format_exc())
    return problem_response(
        request,
        ApiProblem(
            "server-error",
            code="server_error",
            detail="The console failed while answering. Read the action before doing anything else; sending the "
            "same proposal again is safe.",
        ),
    )


# --- helpers -------------------------------------------------------------------------------


def agent_of(request: HttpRequest) -> Agent:
    agent: Agent = request.auth.agent  # type: ignore[attr-defined]
    return agent


def refuse_unknown_query(request: HttpRequest, *allowed: str) -> None:
    # A misspelt filter (?stauts=FAILED) would otherwise list everything and look like an
    # answer; an unknown parameter is an error, like an unknown body field.
    unknown = sorted(set(request.GET) - set(allowed))
    if unknown:
        errors = [
            {"field": name, "code": "unknown_field", "message": "This query parameter is not part of the API."}
            for name in unknown
        ]
        raise ApiProblem(
            "invalid-request",
            code="validation_failed",
            detail=f"Unknown query parameters: {', '.join(unknown)}.",
            errors=errors,
        )


# The log line of a refusal: "<subject>.<event>".
_REFUSAL_EVENTS = {"validation_failed": "invalid", "payload_conflict": "conflict"}


def refused(subject: str, refusal: AgentRefusal) -> ApiProblem:
    """Log an operation's refusal (with the agent's own action id, when it met one) and answer
    with its problem document."""
    action_id = refusal.facts.get("action_id")
    if isinstance(action_id, str):
        bind(action_id=action_id)
    fields: dict[str, Any] = {}
    if refusal.errors:
        fields["errors"] = [problem.as_dict() for problem in refusal.errors]
    if "differing" in refusal.facts:
        fields["differing"] = sorted(refusal.facts["differing"])
    log_event(f"{subject}.{_REFUSAL_EVENTS.get(refusal.code, refusal.code)}", **fields)
    return refusal_problem(refusal)


def served(request: HttpRequest, subject: str, service: Callable[..., R], payload: Schema) -> R:
    """Call an agent-facing service with the request's fields; its refusal is the operation's
    problem document."""
    refuse_unknown_query(request)
    try:
        return service(agent=agent_of(request), **service_arguments(payload))
    except AgentRefusal as refusal:
        raise refused(subject, refusal) from None


def proposed(
    request: HttpRequest, subject: str, service: Callable[..., ProposalResult], payload: Schema
) -> Status[ActionOut]:
    """A proposal operation's answer: 201 with the new action, 200 with the existing one."""
    result = served(request, subject, service, payload)
    action = result.action
    bind(action_id=action.action_id)
    log_event(f"{subject}.proposed" if result.created else f"{subject}.replayed", status=action.status)
    return Status(201 if result.created else 200, action_out(action))


def opened(
    request: HttpRequest,
    subject: str,
    service: Callable[..., RequestOpened[Any]],
    payload: Schema,
    out: Callable[[Any], D],
) -> Status[D]:
    """A request-opening operation's answer: 201 with the new request, 200 with the one its
    external reference opened before. The log line names the request by its numbers
    (``order_number`` and ``request_number``, say)."""
    result = served(request, subject, service, payload)
    log_event(
        f"{subject}.opened" if result.created else f"{subject}.replayed",
        **result.numbers,
    )
    return Status(201 if result.created else 200, out(result.request))


def action_out(action: Action) -> ActionOut:
    request = action.refund_request
    return ActionOut(
        action_id=action.action_id,
        kind=action.kind,
        status=action.status,  # type: ignore[arg-type]
        explanation=StatusExplanationOut(**asdict(action_explain_status(action))),
        order_number=action.order.number if action.order is not None else None,
        request_number=request.number if request is not None else None,
        external_reference=request.external_reference if request is not None else None,
        # The payload's canonical string, not the column: the column reads back as "3000.00"
        # for a zero-decimal currency, and the same action must always read the same.
        amount=str(action.payload.get("amount", action.amount)),
        currency=action.currency,
        reason_code=action.reason_code,
        provider_reference=action.provider_reference or None,
        rejection_reasons=[
            RejectionReason(code=str(reason.get("code", "")), message=str(reason.get("message", "")))
            for reason in action.rejection_reasons
            if isinstance(reason, dict)
        ],
        created_at=action.created_at,
        updated_at=action.updated_at,
        status_changed_at=action.status_changed_at,
        links={"self": reverse("api-v1:action", kwargs={"action_id": action.action_id})},
    )


def refund_request_out(request: RefundRequest) -> RefundRequestOut:
    return RefundRequestOut(
        order_number=request.order.number,
        request_number=request.number,
        external_reference=request.external_reference,
        source=request.source,
        created_at=request.created_at,
        links={"propose_refund": reverse("api-v1:refunds")},
    )


def order_out(order: Order, changed: tuple[str, ...] = ()) -> OrderOut:
    return OrderOut(
        order_number=order.number,
        customer_name=order.customer_name,
        currency=order.currency,
        captured_amount=str(order.captured_amount),
        refunded_amount=str(order.refunded_amount),
        reserved_amount=str(order.reserved_amount),
        refundable_amount=str(order.refundable_amount),
        version=order.version,
        charge_reference=order.charge_reference or None,
        paid_at=order.paid_at,
        created_at=order.created_at,
        changed=list(changed),
        links={"open_refund_request": reverse("api-v1:refund_requests")},
    )


# --- operations ----------------------------------------------------------------------------


@idempotent_post("/refunds", ActionOut, url_name="refunds", summary="Propose a refund", tag="refunds")
def propose_refund(request: HttpRequest, payload: RefundProposal) -> Status[ActionOut]:
    """Propose a refund. 201 with the new action; 200 with the existing one when the same
    proposal was made before (a retry is always safe); 409 when the refund request already has
    a different proposal (the differing fields are listed); 422 naming each invalid field."""
    return proposed(request, "refund", agent_refund_propose, payload)


@idempotent_post(
    "/supplier-emails",
    ActionOut,
    url_name="supplier_emails",
    summary="Propose an email to a supplier",
    tag="supplier emails",
)
def propose_supplier_email(request: HttpRequest, payload: SupplierEmailProposal) -> Status[ActionOut]:
    """Propose an email to a supplier from a template. 201 with the new action (waiting for a
    manager, who sees the rendered message); 200 with the existing one for the same proposal;
    409 when the action exists with another message; 422 naming each invalid field (a line
    break in the subject or the address, a missing parameter, an address that is not one of the
    supplier's known contacts)."""
    return proposed(request, "supplier_email", agent_supplier_email_propose, payload)


@idempotent_post(
    "/refund-requests",
    RefundRequestOut,
    url_name="refund_requests",
    summary="Open a refund request on an order",
    tag="refund requests",
)
def open_refund_request(request: HttpRequest, payload: RefundRequestOpen) -> Status[RefundRequestOut]:
    """Open the next refund request on an order. Idempotent by external reference: 201 with the
    new request, 200 with the one this reference opened before, 409 when the reference already
    belongs to a request on another order."""
    return opened(request, "refund_request", agent_refund_request_open, payload, refund_request_out)


@api.get(
    "/actions/{action_id}",
    response={200: ActionOut, 404: Problem, 422: Problem},
    url_name="action",
    summary="Read one action",
    tags=["actions"],
)
def get_action(request: HttpRequest, action_id: str) -> ActionOut:
    """The action's status, what the status means (what happens next and who holds it), its
    timestamps and, once known, the payment provider's reference. Only the agent's own actions
    are visible: any other id is 404, with the same body as an id that does not exist."""
    bind(action_id=action_id)
    refuse_unknown_query(request)
    try:
        return action_out(agent_action_read(agent=agent_of(request), action_id=action_id))
    except AgentRefusal as refusal:
        raise refusal_problem(refusal) from None


@api.get(
    "/actions",
    response={200: ActionPageOut, 422: Problem},
    url_name="actions",
    summary="List the agent's actions",
    tags=["actions"],
)
def list_actions(
    request: HttpRequest,
    status: list[ActionStatusName] = Query(  # noqa: B008 (django-ninja declares parameters this way)
        [], description="Only actions in these statuses (repeat the parameter for several)."
    ),
    cursor: str | None = Query(None, max_length=2000, description="From the previous page's next_cursor."),
    limit: int = Query(50, ge=1, le=MAX_PAGE_SIZE, description="Page size."),
) -> ActionPageOut:
    """The agent's own actions, newest first, paginated by an opaque cursor."""
    refuse_unknown_query(request, "status", "cursor", "limit")
    try:
        page = agent_action_list(agent=agent_of(request), statuses=status, cursor=cursor, limit=limit)
    except AgentRefusal as refusal:
        raise refusal_problem(refusal) from None
    links = {"self": request.get_full_path()}
    if page.next_cursor is not None:
        query = [("status", name) for name in status] + [("cursor", page.next_cursor), ("limit", str(limit))]
        links["next"] = f"{reverse('api-v1:actions')}?{urlencode(query)}"
    return ActionPageOut(items=[action_out(action) for action in page.items], next_cursor=page.next_cursor, links=links)


@idempotent_post("/orders", OrderOut, url_name="orders", summary="Send an order (create or update it)", tag="orders")
def upsert_order(request: HttpRequest, payload: OrderUpsert) -> Status[OrderOut]:
    """Create or update an order, idempotently by its number: 201 with a new order; 200 with
    the existing one, unchanged, or updated with its version raised (``changed`` names the
    fields). A changed order makes approvals given for the old one go stale: they are asked
    for again. 409 names the field when the change cannot apply (a different currency or
    charge, or a captured amount below what is refunded and reserved)."""
    result = served(request, "order", agent_order_upsert, payload)
    event = "order.created" if result.created else "order.changed" if result.changed else "order.replayed"
    log_event(event, order_number=result.order.number, version=result.order.version, changed=list(result.changed))
    return Status(201 if result.created else 200, order_out(result.order, result.changed))
