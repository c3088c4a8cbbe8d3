"""Rules of the review queue that the engine's resolutions and the pages both apply.

Settings are read at call time, so tests and deployments can change them.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings

from actions.models import Attempt, Discrepancy, Remedy

# How long a not-found lookup stays good enough evidence for a retry with the same key.
DEFAULT_RETRY_LOOKUP_MAX_AGE_SECONDS = 300


def owners_only() -> bool:
    """REVIEW_OWNERS_ONLY: a finance member may act only on items they own, or unassigned ones."""
    return bool(getattr(settings, "REVIEW_OWNERS_ONLY", False))


def retry_lookup_max_age() -> timedelta:
    seconds = getattr(settings, "REVIEW_RETRY_LOOKUP_MAX_AGE_SECONDS", DEFAULT_RETRY_LOOKUP_MAX_AGE_SECONDS)
    return timedelta(seconds=int(seconds))


def owner_rule_refusal(*, user: Any, owner: Any) -> str | None:
    """Why ``user`` may not act on an item owned by ``owner`` under REVIEW_OWNERS_ONLY, or None."""
    if not owners_only() or owner is None or owner.pk == user.pk:
        return None
    return (
        f"This item belongs to {owner.get_username()}. Only its owner may act on it while the console "
        "runs with REVIEW_OWNERS_ONLY; an administrator can reassign it."
    )


def follow_up_kind(item: Remedy | Discrepancy) -> str | None:
    """The kind of the action a remedy or a discrepancy belongs to: its owner group works the
    follow-up too. None for a discrepancy the audit found with no action."""
    return item.action.kind if item.action is not None else None


def lookup_fresh_until(attempt: Attempt) -> datetime | None:
    return (attempt.finished_at + retry_lookup_max_age()) if attempt.finished_at else None


def _minutes(delta: timedelta) -> int:
    return max(int(delta.total_seconds() // 60), 1)


def retry_evidence_from_attempt(attempt: Attempt | None, *, now: datetime) -> tuple[bool, str]:
    """Whether the latest lookup allows offering a retry with the same key, and if not, why."""
    minutes = _minutes(retry_lookup_max_age())
    if attempt is None:
        return (
            False,
            f"Look the action up at the provider first: a retry needs a not-found answer from the last {minutes} min.",
        )
    if attempt.outcome != "not_found":
        return False, "The latest lookup did not say 'not found', so the effect may exist: a retry could repeat it."
    fresh_until = lookup_fresh_until(attempt)
    if fresh_until is None or fresh_until < now:
        return False, f"The latest not-found answer is older than {minutes} min. Look the action up again first."
    return True, ""
