"""Who owns an action that needs a person: a named member of the kind's owner group."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import Count, Q

from actions.models import ActionStatus, OwnerGroup

DEFAULT_OWNER_GROUP = "finance"


def owner_group_name(kind: str, default: str = DEFAULT_OWNER_GROUP) -> str:
    """The group named for ``kind`` in the admin (OwnerGroup), else the kind's own default."""
    mapping = OwnerGroup.objects.filter(kind=kind).select_related("group").first()
    return mapping.group.name if mapping is not None else default


def owner_pick(*, kind: str, default_group: str = DEFAULT_OWNER_GROUP) -> Any:
    """The active member of the kind's owner group with the fewest open review items.

    Ties go to the longest-standing member (lowest id), so the choice is deterministic and
    can be explained in the audit event.
    """
    user_model = get_user_model()
    return (
        user_model.objects.filter(is_active=True, groups__name=owner_group_name(kind, default_group))
        .annotate(open_items=Count("owned_actions", filter=Q(owned_actions__status=ActionStatus.NEEDS_REVIEW)))
        .order_by("open_items", "pk")
        .first()
    )
