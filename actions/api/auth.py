"""Bearer-token authentication for agents.

The gateway authenticates every non-public request before django-ninja sees it (so that the
rate limit can count by token). ``AgentBearer`` declares the scheme in the OpenAPI document
and hands the gateway's result to ninja; called without the gateway (ninja's own test
client), it authenticates by itself, with the same answers.

Tokens travel only in the Authorization header. The API never reads a session or a cookie,
which is why its routes can be CSRF-exempt: CSRF abuses credentials a browser sends on its
own, and a browser never sends a bearer token on its own.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja.security import HttpBearer

from actions.agents.services import AgentAuthenticationFailed, agent_authenticate
from actions.api.problems import ApiProblem
from actions.models import AgentToken

_CHALLENGE = 'Bearer realm="effect-console"'


def presented_token(request: HttpRequest) -> str | None:
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def authenticate_request(request: HttpRequest) -> AgentToken:
    """The active token of the request's agent, or an ApiProblem (401 or 403)."""
    plain = presented_token(request)
    if plain is None:
        raise ApiProblem(
            "unauthorized",
            code="token_missing",
            detail="Send the agent's token as 'Authorization: Bearer <token>'.",
            headers={"WWW-Authenticate": _CHALLENGE},
        )
    try:
        return agent_authenticate(plain=plain)
    except AgentAuthenticationFailed as failed:
        if failed.code == "agent_inactive":
            raise ApiProblem("forbidden", code=failed.code, detail=failed.message) from None
        raise ApiProblem(
            "unauthorized",
            code=failed.code,
            detail=failed.message,
            headers={"WWW-Authenticate": f'{_CHALLENGE}, error="invalid_token"'},
        ) from None


class AgentBearer(HttpBearer):
    def __call__(self, request: HttpRequest) -> Any:
        token = getattr(request, "agent_token", None)
        if token is not None:
            return token
        return authenticate_request(request)

    def authenticate(self, request: HttpRequest, token: str) -> Any:
        # Only reached through HttpBearer.__call__, which this class does not use.
        return authenticate_request(request)
