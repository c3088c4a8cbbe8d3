"""Handing an action to a named person: the one place an owner is picked for an escalation."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings

from actions import permissions as perms
from actions.foundation.owners import owner_pick
from actions.foundation.trail import Actor, Writes, action_transition
from actions.kinds import kind_for
from actions.models import Action


def action_escalate(
    *,
    action: Action,
    actor: Actor,
    now: datetime,
    reason: str,
    evidence: dict[str, Any],
    writes: Writes | None = None,
) -> Any:
    """Hand the action to a named person: the owner finance already set, if they are still an
    active member able to resolve it, otherwise the kind's owner group's member with the fewest
    open items."""
    current = action.owner
    if current is not None and current.is_active and current.has_perm(perms.RESOLVE):
        owner = current
    else:
        owner = owner_pick(kind=action.kind, default_group=kind_for(action.kind).owner_group)
    assignee = owner.get_username() if owner else "nobody: the owner group has no active member"
    action_transition(
        action=action,
        transition="escalate",
        actor=actor,
        reason=f"{reason} Assigned to {assignee}"
        + (
            " (already its owner)."
            if owner is current and owner is not None
            else " (the owner group's member with the fewest open items)."
        ),
        evidence={**evidence, "owner": owner.get_username() if owner else None},
        now=now,
        writes=writes,
        owner=owner,
        due_at=now + timedelta(hours=settings.REVIEW_DUE_HOURS),
    )
    return owner
