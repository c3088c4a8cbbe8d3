"""The MCP server: the tools of ``actions.mcp.tools`` on the official SDK, over streamable HTTP.

Why a process of its own rather than a mount under ``/mcp/`` in Django: the console is served
by WSGI (``runserver`` here, any WSGI server in production), and the SDK's streamable HTTP
transport is an ASGI (Starlette) application. Mounting it would mean moving the whole
console to ASGI for one endpoint. As its own process it calls the same services as the web
process, against the same database and broker, and scales or restarts on its own.

Why stateless JSON answers (``stateless_http=True, json_response=True``): each tool call is
one POST answered with one JSON document. No session lives in this process, so a client
that lost its connection reconnects to any process and sends the same call again; the
business ids make that repeat safe, not a session.

Authentication is the agent API's bearer token, checked by the API's own code
(``actions.api.gateway.authenticate_limited``) before the SDK sees the request: no token, or a
bad one, is a 401 problem document like the API's, a deactivated agent a 403; and every failure
counts against the client address's limit shared with the API, so that past it the answer is a
429 with Retry-After.
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.db import DatabaseError, close_old_connections
from django.http import HttpRequest
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.tools import Tool
from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase, FuncMetadata
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from ninja import Schema
from pydantic import ConfigDict

from actions.api.adjustments import AdjustmentRequestOpen, InvoiceAdjustmentProposal
from actions.api.gateway import authenticate_limited
from actions.api.problems import PROBLEM_CONTENT_TYPE, ApiProblem, problem_body
from actions.api.schemas import ActionOut, RefundProposal, RefundRequestOpen
from actions.mcp import tools
from actions.mcp.tools import (
    ActionExplanationOut,
    ActionListOut,
    ActionListQuery,
    ActionRef,
    AdjustmentRequestToolOut,
    RefundRequestToolOut,
)
from actions.models import AgentToken

logger = logging.getLogger("actions.mcp")

# Where the authenticated token travels from the HTTP layer to the tool: the ASGI scope's
# state, which the SDK hands to the tool as the request of its context.
_STATE_KEY = "console_agent_token"

ASGIApp = Callable[[dict[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]

INSTRUCTIONS = """\
The effect console records and executes refunds that agents propose. Open a refund request for
the customer's ticket (open_refund_request), propose a refund for it (propose_refund), then read
what became of it (get_action, explain_action). For a supplier bill that failed its purchase-order
match, open an adjustment request (open_adjustment_request) and propose a credit note against the
bill (propose_invoice_adjustment); read it the same way. Every write tool is keyed by business
references (order number and refund request, bill number and adjustment request), never by an id
you make up: calling it again with the same
arguments returns the same result and never executes twice, so after a timeout or a dropped
connection send the same call again. Errors say what to do: bad_input (fix the named fields),
needs_person (a person must decide: stop and report), retryable (send the same call again later).
"""


@dataclass(frozen=True)
class ToolSpec:
    """A tool: its function in ``actions.mcp.tools``, whose name is the tool's and whose docstring
    gives its title (the first line) and its description (the rest), and what the SDK advertises
    of it besides."""

    run: Callable[..., dict[str, Any]]
    # Validates the arguments (inside the tool, so that every refusal is a typed bad_input)
    # and gives the tool's advertised input schema.
    input_model: type[Schema]
    output_model: type[Schema]
    annotations: ToolAnnotations

    @property
    def name(self) -> str:
        return self.run.__name__

    @property
    def title(self) -> str:
        return self._docstring()[0]

    @property
    def description(self) -> str:
        return self._docstring()[1]

    def _docstring(self) -> tuple[str, str]:
        """The first line, without its full stop, and the rest as one paragraph."""
        first, _, rest = (inspect.getdoc(self.run) or "").partition("\n")
        return first.removesuffix("."), " ".join(rest.split())


_READ = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
# Opening a request writes a record and nothing else; the same reference opens it once.
_OPEN = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
# A proposal, once approved, moves money or changes what is owed outside the console (see each
# tool); the same arguments name the same action.
_PROPOSE = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=True)

# Each tool: its function, its arguments' schema, its answer's schema and its hints.
TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(tools.open_refund_request, RefundRequestOpen, RefundRequestToolOut, _OPEN),
    # Destructive: once approved, the refund is money sent to a customer, which cannot be
    # taken back. Idempotent: the same arguments name the same action.
    ToolSpec(tools.propose_refund, RefundProposal, ActionOut, _PROPOSE),
    ToolSpec(tools.open_adjustment_request, AdjustmentRequestOpen, AdjustmentRequestToolOut, _OPEN),
    # Destructive: an authorised credit note changes what the business owes its supplier;
    # undoing it is a correction (a void) a person decides. Idempotent: the same arguments
    # name the same action.
    ToolSpec(tools.propose_invoice_adjustment, InvoiceAdjustmentProposal, ActionOut, _PROPOSE),
    ToolSpec(tools.get_action, ActionRef, ActionOut, _READ),
    ToolSpec(tools.list_actions, ActionListQuery, ActionListOut, _READ),
    ToolSpec(tools.explain_action, ActionRef, ActionExplanationOut, _READ),
)


class _RawArguments(ArgModelBase):
    """Hands the arguments to the tool untouched.

    The SDK would otherwise validate them against a model of its own and answer a bad one
    with untyped text; the tool validates them with the API's schema instead and answers
    bad_input with the API's field codes.
    """

    model_config = ConfigDict(extra="allow", arbitrary_types_allowed=True)

    def model_dump_one_level(self) -> dict[str, Any]:
        return {"arguments": dict(self.model_extra or {})}


def _result(data: dict[str, Any], **error: Any) -> CallToolResult:
    # is_error is passed only for an error, so that a success's result leaves it unset, as the
    # SDK's own results do.
    return CallToolResult(
        content=[TextContent(type="text", text=json.dumps(data, ensure_ascii=False))], structured_content=data, **error
    )


def _error_result(failure: tools.ToolFailure) -> CallToolResult:
    return _result(failure.as_dict(), is_error=True)


def _call(spec: ToolSpec, token: AgentToken, arguments: Mapping[str, Any]) -> dict[str, Any]:
    # A connection that PostgreSQL closed (a restart, an idle timeout) is replaced before and
    # after the call, as Django does around each web request.
    close_old_connections()
    try:
        return spec.run(token=token, arguments=arguments)
    except tools.ToolFailure:
        raise
    except DatabaseError:
        raise _logged_retryable(
            spec,
            "database_error",
            code="database_unavailable",
            detail="The console's database did not answer. Whether anything was written is unknown: send the same "
            "call again in a few seconds (it is safe).",
        ) from None
    except Exception:
        raise _logged_retryable(
            spec,
            "crashed",
            code="server_error",
            detail="The console failed while answering. Read the action before anything else; sending the same call "
            "again is safe.",
        ) from None
    finally:
        close_old_connections()


def _logged_retryable(spec: ToolSpec, event: str, *, code: str, detail: str) -> tools.ToolFailure:
    """The retryable failure of a tool that broke on the console's side, its traceback logged."""
    logger.exception("mcp.tool.%s tool=%s", event, spec.name)
    return tools.ToolFailure("retryable", code=code, detail=detail)


def _token_of(ctx: Context[Any, Any]) -> AgentToken | None:
    request = ctx.request_context.request
    scope = getattr(request, "scope", None)
    if not isinstance(scope, dict):
        return None
    token = scope.get("state", {}).get(_STATE_KEY)
    return token if isinstance(token, AgentToken) else None


def _runner(spec: ToolSpec) -> Callable[..., Awaitable[CallToolResult]]:
    async def run(arguments: dict[str, Any], ctx: Context[Any, Any]) -> CallToolResult:
        token = _token_of(ctx)
        if token is None:
            # Only reachable if the app is served without AgentTokenMiddleware.
            return _error_result(
                tools.ToolFailure("needs_person", code="token_missing", detail="This server was reached with no token.")
            )
        try:
            # Django's ORM is synchronous: the call runs in asgiref's one thread for
            # synchronous code, the same way Django itself runs sync views under ASGI.
            data = await sync_to_async(_call)(spec, token, arguments)
        except tools.ToolFailure as failure:
            return _error_result(failure)
        return _result(data)

    run.__name__ = spec.name
    return run


def _tool(spec: ToolSpec) -> Tool:
    return Tool(
        fn=_runner(spec),
        name=spec.name,
        title=spec.title,
        description=spec.description,
        parameters=spec.input_model.model_json_schema(),
        fn_metadata=FuncMetadata(arg_model=_RawArguments, output_model=spec.output_model),
        is_async=True,
        context_kwarg="ctx",
        annotations=spec.annotations,
    )


def mcp_server() -> MCPServer:
    return MCPServer(
        "effect-console",
        title="Effect console",
        instructions=INSTRUCTIONS,
        version="1",
        tools=[_tool(spec) for spec in TOOLS],
    )


# --- the HTTP front door --------------------------------------------------------------------


# The headers the API's token check and its per-address limit read.
_HEADERS = {b"authorization": "HTTP_AUTHORIZATION", b"x-forwarded-for": "HTTP_X_FORWARDED_FOR"}


def _django_request(scope: Mapping[str, Any]) -> HttpRequest:
    """A Django request carrying what the API's token check reads (the Authorization header)
    and what its per-address limit reads (the client's address, as Django's WSGI handler
    would set it, and X-Forwarded-For behind a TLS proxy)."""
    request = HttpRequest()
    request.method = str(scope.get("method", "POST"))
    request.path = request.path_info = str(scope.get("path", "/"))
    client = scope.get("client")
    if client:
        request.META["REMOTE_ADDR"] = str(client[0])
    for name, value in scope.get("headers", []):
        key = _HEADERS.get(name.lower())
        if key is not None:
            request.META[key] = value.decode("latin-1")
    return request


def _authenticate(request: HttpRequest) -> AgentToken:
    close_old_connections()
    try:
        # The API's own door: a failed token counts against the client address's limit.
        return authenticate_limited(request)
    finally:
        close_old_connections()


class AgentTokenMiddleware:
    """Authenticates every HTTP request with the agent's token before the MCP app sees it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":  # the lifespan, which starts the SDK's session manager
            await self.app(scope, receive, send)
            return
        if scope.get("path") == "/healthz":
            await _send(send, 200, b"ok", [(b"content-type", b"text/plain")])
            return
        request = _django_request(scope)
        try:
            token = await sync_to_async(_authenticate)(request)
        except ApiProblem as problem:
            body = json.dumps(problem_body(request, problem), ensure_ascii=False).encode()
            headers = [(b"content-type", PROBLEM_CONTENT_TYPE.encode())]
            headers += [(name.lower().encode(), value.encode()) for name, value in problem.headers.items()]
            await _send(send, problem.kind.status, body, headers)
            return
        scope.setdefault("state", {})[_STATE_KEY] = token
        await self.app(scope, receive, send)


async def _send(send: Any, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def mcp_asgi_app(*, host: str = "127.0.0.1", path: str = "/mcp") -> AgentTokenMiddleware:
    """The whole ASGI application: the token check in front of the SDK's streamable HTTP app.

    ``host`` is the address the server binds to: on a loopback address the SDK refuses
    requests whose Host or Origin header is not local (DNS rebinding protection).
    """
    app = mcp_server().streamable_http_app(
        streamable_http_path=path, stateless_http=True, json_response=True, host=host
    )
    return AgentTokenMiddleware(app)
