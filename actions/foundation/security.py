"""The security trail: who changed who may do what (tokens, owners, limits, caps).

Separate from an action's audit trail, which records what happened to one action; both are
append-only. Each write happens in the transaction of the change it records.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from actions import permissions as perms
from actions.models import SecurityEvent

# The roles of people, as an agent may see them (never a person's name; see held_by in the API).
CORRECT_PERMISSION = perms.CORRECT


def security_event_record(*, kind: str, user: Any, subject: str, detail: dict[str, Any] | None = None) -> SecurityEvent:
    """Append one line to the security trail. Call it inside the transaction of the change."""
    label = user.get_username() if user is not None and getattr(user, "pk", None) else "system"
    return SecurityEvent.objects.create(
        kind=kind,
        actor=user if user is not None and getattr(user, "pk", None) else None,
        actor_label=label,
        subject=subject[:200],
        detail=detail or {},
    )


def security_events_recent(*, limit: int = 100) -> QuerySet[SecurityEvent]:
    return SecurityEvent.objects.select_related("actor").order_by("-created_at", "-id")[:limit]
