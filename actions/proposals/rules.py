"""The rules every agent-facing proposal shares: its scope, and whose proposal it answers with."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

from actions.kinds.fields import ProposalInvalid
from actions.models import Agent
from actions.proposals.outcomes import Conflict, Forbidden, invalid
from actions.services import (
    Actor,
    ProposalConflict,
    ProposalResult,
    RequestConflict,
    RequestTaken,
)

_Opened = TypeVar("_Opened")


def scopes_of(agent: Agent) -> str:
    return ", ".join(agent.scopes or []) or "empty"


def scope_require(agent: Agent, scope: str, *, doing: str) -> None:
    """Forbidden unless the agent is active and holds ``scope``; ``doing`` says what it tried."""
    if not agent.may_propose(scope):
        raise Forbidden(
            code="scope_missing",
            detail=f"The agent {agent.name!r} may not {doing}: its scopes are {scopes_of(agent)}. Ask its owner "
            f"for the scope {scope!r}.",
        )


def proposed_elsewhere(noun: str) -> Conflict:
    # The request already has a proposal by someone else. Its id and contents stay hidden
    # (agents see only their own actions); what matters to this agent is that the request is
    # taken and that a second proposal must not be invented.
    return Conflict(
        code="proposed_elsewhere",
        detail=f"This {noun} already has a proposal by another proposer. Nothing was written. Do not open a new "
        f"{noun} to get around it: ask a person.",
    )


def reference_taken(noun: str) -> Conflict:
    return Conflict(
        code="reference_taken",
        detail=f"This external reference already names a {noun} opened by another proposer. Nothing was written. "
        "Do not invent a new reference: ask a person.",
    )


def proposal_for_agent(
    agent: Agent,
    propose: Callable[..., ProposalResult],
    fields: Mapping[str, object],
    *,
    noun: str,
    payload_fields: Mapping[str, str],
    conflict_detail: Callable[[ProposalConflict], str] = str,
) -> ProposalResult:
    """Run a kind's proposal service on the agent's ``fields``, proposed by ``agent``, and answer
    only with the agent's own action.

    - bad fields: ``Invalid``;
    - the action exists with the same payload but someone else proposed it, or exists with
      another payload by someone else: ``proposed_elsewhere``, which says nothing of it;
    - the agent's own action with another payload: ``payload_conflict`` with its id and the
      differing fields, named as the agent sends them (``payload_fields`` renames the payload's
      keys, such as ``order`` to ``order_number``).
    """
    try:
        result = propose(**fields, proposer=Actor.for_agent(agent))
    except ProposalInvalid as problems:
        raise invalid(problems.problems) from None
    except ProposalConflict as conflict:
        if conflict.action.proposed_by_agent_id != agent.pk:
            raise proposed_elsewhere(noun) from None
        raise Conflict(
            code="payload_conflict",
            detail=conflict_detail(conflict),
            facts={
                "action_id": conflict.action.action_id,
                "differing": {payload_fields.get(name, name): values for name, values in conflict.differing.items()},
            },
        ) from None
    if result.action.proposed_by_agent_id != agent.pk:
        raise proposed_elsewhere(noun)
    return result


def request_open_for_agent(
    agent: Agent, open_request: Callable[..., _Opened], fields: Mapping[str, object], *, noun: str
) -> _Opened:
    """Open a request (a refund request, an adjustment request) with the agent's ``fields``, by
    its external reference, as opened by ``agent``: bad fields are ``Invalid``; a reference another proposer opened is
    ``reference_taken``, which says nothing of that request; a reference already naming a
    request with other details is ``reference_conflict``, with the fields that differ."""
    try:
        return open_request(**fields, opened_by_agent=agent)
    except ProposalInvalid as problems:
        raise invalid(problems.problems) from None
    except RequestTaken:
        raise reference_taken(noun) from None
    except RequestConflict as conflict:
        raise Conflict(
            code="reference_conflict", detail=str(conflict), facts={"differing": conflict.differing}
        ) from None
