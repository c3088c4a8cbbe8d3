"""The API's front door: what runs before django-ninja parses a request, and after it answers.

In this order, so that cheap refusals come first and nothing unauthenticated is read:
1. authentication by bearer token (401, or 403 for a deactivated agent); a request without a
   valid token (a public document, a missing or guessed token) counts against its client
   address's rate limit (429 with Retry-After),
2. the per-token rate limit (429 with Retry-After), so that refused bodies count too,
3. the API version the request is answered in (``actions.api.versions``): the one its
   ``Console-Version`` header names (422 for an unknown one), else its token's,
4. the body size cap (413), decided from Content-Length before the body is read,
5. JSON only (415).
Then ninja runs the operation. Any answer that is an error but not a problem document (ninja's
405, Django's 404) is turned into one here, and one JSON log line records the request.

Every API route is CSRF-exempt: the API authenticates only by the Authorization header and
never reads a session or cookie, so a browser's ambient credentials cannot act through it.
The console's own views keep Django's CSRF protection.
"""

from __future__ import annotations

import functools
import logging
import re
import time
import traceback
import uuid
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from actions.api.auth import authenticate_request, presented_token
from actions.api.logs import bind, log_context, log_event
from actions.api.problems import ApiProblem, is_problem, kind_for_status, problem_response
from actions.api.ratelimit import RateDecision, anonymous_rate_limit_per_minute, ratelimit_hit, token_ratelimit_hit
from actions.api.versions import HEADER, version_headers, version_resolve
from actions.models import AgentToken

DEFAULT_MAX_BODY_BYTES = 64 * 1024
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._\-]{1,64}$")
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})

View = Callable[..., HttpResponse]


def max_body_bytes() -> int:
    return int(getattr(settings, "API_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES))


def _check_body(request: HttpRequest) -> None:
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    cap = max_body_bytes()
    if length > cap:
        raise ApiProblem(
            "payload-too-large",
            code="body_too_large",
            detail=f"The body has {length} bytes; this API accepts at most {cap}. Nothing was written.",
        )
    media_type, _, params = request.META.get("CONTENT_TYPE", "").partition(";")
    charset = {
        key.strip().lower(): value.strip().strip('"').lower()
        for key, _, value in (param.partition("=") for param in params.split(";"))
        if key.strip()
    }.get("charset", "utf-8")
    if media_type.strip().lower() != "application/json" or charset not in ("utf-8", "utf8"):
        raise ApiProblem(
            "unsupported-media-type",
            code="not_json",
            detail="Send the body as 'Content-Type: application/json' (UTF-8). Nothing was written.",
            headers={"Accept-Post": "application/json"},
        )


def _admit(request: HttpRequest, *, authenticated: bool, methods: frozenset[str] | None, limited: bool = True) -> None:
    if methods is not None and request.method not in methods:
        raise ApiProblem(
            "method-not-allowed",
            code="method_not_allowed",
            detail=f"{request.method} is not allowed here.",
            headers={"Allow": ", ".join(sorted(methods))},
        )
    if not authenticated:
        if limited:
            client_address_limit(request)
        return
    token = authenticate_limited(request)
    # Read by AgentBearer, so that ninja does not authenticate a second time.
    request.agent_token = token  # type: ignore[attr-defined]
    bind(agent=token.agent.name, token=token.prefix)
    _refuse_over_limit(
        token_ratelimit_hit(token),
        "This token sent more than {limit} requests this minute. Wait {retry_after} seconds, then send the same "
        "request again.",
    )
    version = version_resolve(requested=request.headers.get(HEADER, ""), token_created_at=token.created_at)
    # Read by the JSON parser (StrictJsonParser), which answers an older version's body as it
    # promised, and by the response's headers below.
    request.console_version = version  # type: ignore[attr-defined]
    bind(api_version=version)
    if request.method in _BODY_METHODS:
        _check_body(request)


def authenticate_limited(request: HttpRequest) -> AgentToken:
    """The request's active token, or an ApiProblem (401 or 403); every failure counts against
    the client address's limit, and once over it the answer is 429 instead, whatever the token.

    The one door for agents' tokens: the MCP server authenticates through it too, so that
    guessing tokens there costs the same budget per address as here.
    """
    try:
        return authenticate_request(request)
    except ApiProblem:
        client_address_limit(request)
        raise


def client_address(request: HttpRequest) -> str:
    """The client's address. Behind a TLS proxy (BEHIND_TLS_PROXY) the proxy's view of it,
    the last X-Forwarded-For entry it appended; otherwise the socket's peer."""
    if getattr(settings, "SECURE_PROXY_SSL_HEADER", None):
        forwarded = [part.strip() for part in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if part.strip()]
        if forwarded:
            return forwarded[-1][:64]
    return str(request.META.get("REMOTE_ADDR") or "unknown")[:64]


def client_address_limit(request: HttpRequest) -> None:
    """Count one request without a valid token for the client's address; 429 once over the limit."""
    _refuse_over_limit(
        ratelimit_hit(key=f"ip:{client_address(request)}", limit=anonymous_rate_limit_per_minute()),
        "This address sent more than {limit} requests without a valid token this minute. Wait {retry_after} seconds.",
    )


def _refuse_over_limit(decision: RateDecision, detail: str) -> None:
    """A 429 with Retry-After once ``decision`` is past its limit; ``detail`` says whose limit it
    is, with ``{limit}`` and ``{retry_after}`` filled in."""
    if not decision.allowed:
        raise ApiProblem(
            "rate-limited",
            code="rate_limited",
            detail=detail.format(limit=decision.limit, retry_after=decision.retry_after),
            headers={"Retry-After": str(decision.retry_after)},
        )


def _as_problem(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    if response.status_code < 400 or is_problem(response):
        return response
    kind = kind_for_status(response.status_code)
    headers = {"Allow": response["Allow"]} if response.has_header("Allow") else {}
    return problem_response(
        request,
        ApiProblem(kind, code=kind.replace("-", "_"), detail=f"{response.status_code}: {kind}.", headers=headers),
    )


def api_view(
    view: View, *, authenticated: bool = True, methods: frozenset[str] | None = None, limited: bool = True
) -> View:
    """Wrap one of the API's URL callbacks with the front door described above.

    ``limited=False`` exempts a public, constant document (the OpenAPI document and its docs
    page) from the per-address limit: answering it reads no table, so it costs less than the
    count would, and it must load even when the database is down.
    """

    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        started = time.monotonic()
        offered = request.headers.get("X-Request-Id", "")
        request_id = offered if _REQUEST_ID.match(offered) else uuid.uuid4().hex
        with log_context(request_id=request_id, method=request.method, path=request.path):
            if isinstance(kwargs.get("action_id"), str):
                bind(action_id=kwargs["action_id"])
            try:
                _admit(request, authenticated=authenticated, methods=methods, limited=limited)
                response = view(request, *args, **kwargs)
            except ApiProblem as problem:
                if problem.kind.status in (401, 403):
                    given = presented_token(request)
                    log_event("auth.refused", code=problem.code, token=given[:12] if given else None)
                response = problem_response(request, problem)
            except Http404:
                response = problem_response(
                    request, ApiProblem("not-found", code="not_found", detail="There is no such URL in this API.")
                )
            except Exception as exc:
                log_event("request.crashed", level=logging.ERROR, error=repr(exc), traceback=traceback.format_exc())
                response = problem_response(
                    request,
                    ApiProblem(
                        "server-error",
                        code="server_error",
                        detail="The console failed while answering. Read the action before doing anything else.",
                    ),
                )
            response = _as_problem(request, response)
            response["X-Request-Id"] = request_id
            version = getattr(request, "console_version", None)
            if version is not None:
                for name, value in version_headers(version).items():
                    response[name] = value
            status = response.status_code
            log_event(
                "request.finished",
                level=logging.ERROR if status >= 500 else logging.WARNING if status >= 400 else logging.INFO,
                status=status,
                duration_ms=round((time.monotonic() - started) * 1000, 1),
            )
            # The line above is this request's record, with its action id. Django would add
            # a plain-text "Conflict: /api/v1/refunds" line of its own for every 4xx/5xx,
            # without the action id; this flag is how Django knows a response was logged.
            response._has_been_logged = True  # type: ignore[attr-defined]
        return response

    return csrf_exempt(wrapped)


def not_found(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    """Any other URL under the API: a problem document rather than Django's HTML page."""
    raise Http404
