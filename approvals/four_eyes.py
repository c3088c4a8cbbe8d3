"""Four eyes: the approver is neither the proposer recorded at proposal time nor the current
owner of the proposing agent; and a change to an approval limit or an auto-approval cap is
confirmed by a member of finance who neither proposed it nor holds the limit.

Comparing with the proposal-time record alone lets an owner change move an agent's open
proposal to someone else's name; comparing with the current owner alone lets an admin give the
agent away after the proposal. Both are checked.
"""

from __future__ import annotations

from typing import Any

from actions.models import Action
from approvals.models import PolicyChange, PolicyTarget
from console.roles import FINANCE, user_roles

FINANCE_ONLY = "Only a member of finance confirms or rejects changes to approval limits and auto-approval caps."


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


def policy_change_reader_refusal(*, user: Any) -> str | None:
    """Why ``user`` may not see or decide policy changes at all, or None. Finance membership is
    the rule, not a permission: a superuser or an admin who is not in finance is refused too."""
    if FINANCE not in user_roles(user):
        return FINANCE_ONLY
    return None


def policy_change_refusal(*, change: PolicyChange, user: Any) -> str | None:
    """Why ``user`` may not confirm ``change``, or None."""
    if user is None or getattr(user, "pk", None) is None:
        return "Only a signed-in person may confirm."
    refusal = policy_change_reader_refusal(user=user)
    if refusal is not None:
        return refusal
    if change.proposed_by_id == user.pk:
        return "You proposed this change: another member of finance must confirm it."
    if change.target == PolicyTarget.APPROVAL_LIMIT and change.limit_user_id == user.pk:
        return "This is your own approval limit: another member of finance must confirm the change."
    return None
