"""Who owns an action that needs a person: a named member of the kind's owner group."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import Count, Q

from actions.models import ActionStatus, OwnerGroup

DEFAULT_OWNER_GROUP = "finance"


def owner_group_names(defaults: Mapping[str, str]) -> dict[str, str]:
    """For each kind in ``defaults``, the group named for it in the admin (OwnerGroup), else the
    kind's own default. One query, however many kinds."""
    mapped = dict(OwnerGroup.objects.filter(kind__in=list(defaults)).values_list("kind", "group__name"))
    return {kind: mapped.get(kind, default) for kind, default in defaults.items()}


def owner_group_name(kind: str, default: str = DEFAULT_OWNER_GROUP) -> str:
    """The group named for ``kind`` in the admin (OwnerGroup), else the kind's own default."""
    return owner_group_names({kind: default})[kind]


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
