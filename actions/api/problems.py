"""RFC 9457 problem documents: the one shape every API error leaves in.

A problem names its kind (``type``, a link to the kind's entry on the docs page), a
machine-readable ``code``, and for bad input one entry per field in ``errors`` with the
field's name, a code and a sentence. Clients branch on ``status`` and ``code``; people read
``title`` and ``detail``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.urls import NoReverseMatch, reverse

from actions.proposals.outcomes import AgentRefusal, Outcome

PROBLEM_CONTENT_TYPE = "application/problem+json"


@dataclass(frozen=True)
class ProblemKind:
    slug: str
    status: int
    title: str
    # Shown on the docs page next to the kind's anchor: what it means and what a client does.
    advice: str


KINDS: dict[str, ProblemKind] = {
    kind.slug: kind
    for kind in (
        ProblemKind(
            "malformed-json",
            400,
            "The body is not valid JSON",
            "Send one JSON object. Nothing was written.",
        ),
        ProblemKind(
            "unauthorized",
            401,
            "Authentication failed",
            "Send 'Authorization: Bearer <token>' with an active token. A revoked or rotated token stays invalid.",
        ),
        ProblemKind(
            "forbidden",
            403,
            "Not allowed",
            "The agent is deactivated, or its scopes do not include this kind of action. Ask its owner.",
        ),
        ProblemKind(
            "not-found",
            404,
            "Not found",
            "No such resource among the ones this agent may see. Other agents' actions are never visible.",
        ),
        ProblemKind(
            "method-not-allowed",
            405,
            "Method not allowed",
            "The Allow header lists the methods this URL accepts.",
        ),
        ProblemKind(
            "conflict",
            409,
            "Conflicts with an existing record",
            "The business reference already names something else. Read the existing record and do not invent a "
            "new reference to get around it: a different amount or reason is a different request.",
        ),
        ProblemKind(
            "payload-too-large",
            413,
            "The body is too large",
            "Shorten the request (the evidence, usually). Nothing was written.",
        ),
        ProblemKind(
            "unsupported-media-type",
            415,
            "Only JSON is accepted",
            "Send the body as 'Content-Type: application/json' (UTF-8). Nothing was written.",
        ),
        ProblemKind(
            "invalid-request",
            422,
            "The request has invalid fields",
            "Each entry in 'errors' names a field and a code. Correct those fields; nothing was written.",
        ),
        ProblemKind(
            "rate-limited",
            429,
            "Too many requests",
            "Wait the number of seconds in the Retry-After header, then send the same request again.",
        ),
        ProblemKind(
            "server-error",
            500,
            "The console failed to answer",
            "Nothing is known about whether the request was recorded: read the action (or send the same "
            "proposal again, which is always safe) before doing anything else.",
        ),
    )
}

_KIND_BY_STATUS = {kind.status: kind for kind in KINDS.values()}


class ApiProblem(Exception):
    """Raised anywhere in the API to answer with a problem document."""

    def __init__(
        self,
        kind: str,
        *,
        code: str,
        detail: str,
        errors: Iterable[Mapping[str, str]] = (),
        headers: Mapping[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.kind = KINDS[kind]
        self.code = code
        self.detail = detail
        self.errors = [dict(error) for error in errors]
        self.headers = dict(headers or {})
        self.extra = extra


def problem_type_uri(kind: ProblemKind) -> str:
    try:
        docs = reverse("api-v1:openapi-view")
    except NoReverseMatch:  # the API is not mounted (a unit test of this module alone)
        docs = "/api/v1/docs"
    return f"{docs}#problem-{kind.slug}"


def problem_body(request: HttpRequest, problem: ApiProblem) -> dict[str, Any]:
    return {
        "type": problem_type_uri(problem.kind),
        "title": problem.kind.title,
        "status": problem.kind.status,
        "detail": problem.detail,
        "instance": request.path,
        "code": problem.code,
        "errors": problem.errors,
        **problem.extra,
    }


def problem_response(request: HttpRequest, problem: ApiProblem) -> HttpResponse:
    response = HttpResponse(
        json.dumps(problem_body(request, problem), ensure_ascii=False, default=str),
        status=problem.kind.status,
        content_type=PROBLEM_CONTENT_TYPE,
    )
    for name, value in problem.headers.items():
        response[name] = value
    return response


def kind_for_status(status: int) -> str:
    """The problem kind for a status code that some other layer chose (ninja, Django)."""
    kind = _KIND_BY_STATUS.get(status)
    if kind is not None:
        return kind.slug
    return "server-error" if status >= 500 else "invalid-request"


def is_problem(response: HttpResponse) -> bool:
    return response.get("Content-Type", "").startswith(PROBLEM_CONTENT_TYPE)


# An agent-facing operation's refusal, as this API answers it (actions.proposals.outcomes).
_KIND_BY_OUTCOME = {
    Outcome.NOT_FOUND: "not-found",
    Outcome.FORBIDDEN: "forbidden",
    Outcome.INVALID: "invalid-request",
    Outcome.CONFLICT: "conflict",
}


def refusal_problem(refusal: AgentRefusal) -> ApiProblem:
    """The problem document of a refusal: its code and words, each field problem, what the agent
    may know of its own record, and a link to that record."""
    extra: dict[str, Any] = dict(refusal.facts)
    if "action_id" in refusal.facts:
        extra["links"] = {"existing": reverse("api-v1:action", kwargs={"action_id": refusal.facts["action_id"]})}
    elif "workflow_id" in refusal.facts:
        extra["links"] = {"existing": reverse("api-v1:workflow", kwargs={"workflow_id": refusal.facts["workflow_id"]})}
    if refusal.outcome is Outcome.NOT_FOUND:
        # No echo of the path: the body is byte for byte the same for every unknown id.
        extra["instance"] = None
    return ApiProblem(
        _KIND_BY_OUTCOME[refusal.outcome],
        code=refusal.code,
        detail=refusal.detail,
        errors=[problem.as_dict() for problem in refusal.errors],
        **extra,
    )
