"""Dated API versions: each agent token is pinned to the version of the day it was created, a
request may name another in the ``Console-Version`` header, and a request of an older version
is answered the way that version promised wherever the console can (docs/api-versions.md).

Why dated versions per token rather than ``/api/v2``: agents are deployed software, each with
tokens of its own. Pinning the token keeps an agent that nobody has touched on the behaviour it
was written against, while new agents get the newest, and it costs one code path: the
operations are written for the newest version, and the few changes that older versions need
undone live here, as data, next to the date that made them. A ``/api/v2`` would duplicate every
operation, schema and document for one changed field.

How a change is kept for older versions: a ``VersionChange`` names the operation and a function
that takes the body of a request pinned before the change and returns the body the newest code
reads (the old behaviour kept), or raises an ``ApiProblem`` when the change cannot be undone (a
fact the console must not invent). The body is rewritten inside the API's JSON parser
(``actions.api.views.StrictJsonParser``), before the schemas validate it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from email.utils import format_datetime
from typing import Any

from actions.api.problems import ApiProblem
from actions.models import ReasonCode

HEADER = "Console-Version"
# How long a version is kept after the one that supersedes it ships: its Sunset date.
SUPPORT_AFTER_SUPERSEDED = timedelta(days=182)

Body = dict[str, Any]


@dataclass(frozen=True)
class VersionChange:
    """One change of one operation, and how a request pinned before it is answered."""

    operation: str  # the operation's URL name (``refund_requests``)
    summary: str
    # (the request's body, the request's version) -> the body the newest code reads; or raises.
    older_request: Callable[[Body, str], Body]


@dataclass(frozen=True)
class ApiVersion:
    date: str  # ISO date: versions sort by it
    summary: str
    changes: tuple[VersionChange, ...] = field(default=())


def _reason_code_required(body: Body, version: str) -> Body:
    """The refund request's reason is a fact about the customer, asked for since the security
    hardening of 2026-12-01 so that managers and the per-agent limits see it. The console must
    not invent it (a default would read as the customer's reason), so a request without one
    is refused even for older versions, with an answer that names the version that asks."""
    if str(body.get("reason_code") or "").strip():
        return body
    message = (
        f"Required since API version 2026-12-01 (this request uses {version}): say why the customer asks for "
        f"money back, one of: {', '.join(ReasonCode.values)}. See the API's versions page."
    )
    raise ApiProblem(
        "invalid-request",
        code="validation_failed",
        detail=f"Some fields are invalid: reason_code: {message}",
        errors=[{"field": "reason_code", "code": "required", "message": message}],
    )


VERSIONS: tuple[ApiVersion, ...] = (
    ApiVersion("2026-11-29", "The first published agent API."),
    ApiVersion(
        "2026-12-01",
        "Opening a refund request needs a reason code.",
        changes=(
            VersionChange(
                "refund_requests",
                "reason_code is required; older versions get a 422 that names this version.",
                _reason_code_required,
            ),
        ),
    ),
)


def current_version() -> str:
    return VERSIONS[-1].date


def version_known(name: str) -> bool:
    return any(version.date == name for version in VERSIONS)


def version_resolve(*, requested: str, token_created_at: datetime) -> str:
    """The version a request is answered in: the one it names, else its token's.

    A token is pinned to the newest version released on or before the day it was created (in
    UTC); a token older than the first version gets the first.
    """
    requested = requested.strip()
    if requested:
        if not version_known(requested):
            known = ", ".join(version.date for version in VERSIONS)
            raise ApiProblem(
                "invalid-request",
                code="unknown_version",
                detail=f"{HEADER}: {requested!r} is not a version of this API. Use one of: {known}. "
                "Nothing was written.",
                errors=[{"field": HEADER, "code": "unknown_version", "message": f"Use one of: {known}."}],
            )
        return requested
    created = token_created_at.astimezone(UTC).date().isoformat()
    pinned = [version.date for version in VERSIONS if version.date <= created]
    return pinned[-1] if pinned else VERSIONS[0].date


def request_upgrade(*, version: str, operation: str, body: Body) -> Body:
    """The body of a request of ``version`` as the newest code reads it: every change released
    after ``version`` to ``operation``, oldest first."""
    for later in VERSIONS:
        if later.date <= version:
            continue
        for change in later.changes:
            if change.operation == operation:
                body = change.older_request(body, version)
    return body


def version_headers(version: str) -> dict[str, str]:
    """The headers that tell a client which version answered, and, for a superseded one, since
    when it is deprecated (RFC 9745) and when its compatibility ends (RFC 8594)."""
    headers = {HEADER: version}
    successors = [v for v in VERSIONS if v.date > version]
    if successors:
        superseded = datetime.combine(date.fromisoformat(successors[0].date), time(), tzinfo=UTC)
        headers["Deprecation"] = f"@{int(superseded.timestamp())}"
        headers["Sunset"] = format_datetime(superseded + SUPPORT_AFTER_SUPERSEDED, usegmt=True)
    return headers
