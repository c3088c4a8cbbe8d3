"""An agent's reads of its own actions: one, a page of them, and what one means for the agent."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from actions.kinds.fields import FieldProblem
from actions.models import Action, ActionStatus, Agent
from actions.proposals.outcomes import NotFound, invalid
from actions.selectors import (
    ActionPage,
    InvalidCursor,
    StatusExplanation,
    action_explain_status,
    action_get_for_agent,
    action_list_for_agent,
)

# The longest stored action id; a longer one cannot exist and answers "not found", like any
# other unknown id, rather than a validation error: no id of any shape answers differently.
MAX_ACTION_ID_LENGTH = 255


def _action_not_found() -> NotFound:
    # One answer for "someone else's" and "does not exist", byte for byte: the id is not echoed.
    return NotFound(code="action_not_found", detail="This agent has no action with this id.")


def agent_action_read(*, agent: Agent, action_id: str) -> Action:
    """The agent's own action with this id; any other id, whoever's it is, is ``NotFound``."""
    action = action_get_for_agent(agent=agent, action_id=action_id) if len(action_id) <= MAX_ACTION_ID_LENGTH else None
    if action is None:
        raise _action_not_found()
    return action


def agent_action_list(
    *, agent: Agent, statuses: Sequence[str] = (), cursor: str | None = None, limit: int = 50
) -> ActionPage:
    """The agent's own actions, newest first; a cursor this console did not issue is bad input."""
    try:
        return action_list_for_agent(agent=agent, statuses=statuses, cursor=cursor, limit=limit)
    except InvalidCursor as refused:
        raise invalid([FieldProblem("cursor", "invalid_cursor", str(refused))], detail=str(refused)) from None


@dataclass(frozen=True)
class ActionExplanation:
    action: Action
    explanation: StatusExplanation
    agent_should: str
    read_again_after_seconds: int | None


def agent_action_explain(*, agent: Agent, action_id: str, now: datetime | None = None) -> ActionExplanation:
    """What the agent's action means for the agent: what to do now, and when reading it again
    could show something new (None when it is final or a person holds it)."""
    action = agent_action_read(agent=agent, action_id=action_id)
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
            now = now or timezone.now()
            read_again = max(1, int((action.next_reconcile_at - now) / timedelta(seconds=1)))
        agent_should = (
            "Wait, then read this action again (get_action). Never send a new proposal and never tell the customer "
            "it failed while it is not final."
        )
    return ActionExplanation(
        action=action, explanation=explanation, agent_should=agent_should, read_again_after_seconds=read_again
    )
