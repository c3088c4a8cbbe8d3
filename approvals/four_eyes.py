"""Four eyes: the approver is neither the proposer recorded at proposal time nor the current
owner of the proposing agent.

Comparing with the proposal-time record alone lets an owner change move an agent's open
proposal to someone else's name; comparing with the current owner alone lets an admin give the
agent away after the proposal. Both are checked.
"""

from __future__ import annotations

from typing import Any

from actions.models import Action


def four_eyes_refusal(*, action: Action, user: Any) -> str | None:
    """Why ``user`` may not approve ``action`` under four eyes, or None."""
    if user is None or getattr(user, "pk", None) is None:
        return "Only a signed-in person may approve."
    if action.proposed_by_user_id is not None and action.proposed_by_user_id == user.pk:
        # The same words as before the owner check existed: pages and clients know them.
        return "You proposed this action (or own the agent that did): someone else must approve it."
    agent = action.proposed_by_agent
    if agent is not None and agent.owner_id == user.pk:
        return "You own the agent that proposed this action: someone else must approve it."
    return None
