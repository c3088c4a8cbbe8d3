"""Reads for the managers' plans: the workflows waiting for a decision, and where the
navigation's count of waiting work should lead a manager."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from actions.models import Action, ActionStatus, Workflow, WorkflowState


def plans_waiting(*, user: Any) -> QuerySet[Workflow]:
    """Plans waiting for a decision, oldest first; a plan this person proposed is someone
    else's to decide and is left out, as the navigation's count leaves it out."""
    return (
        Workflow.objects.filter(state=WorkflowState.PROPOSED)
        .exclude(proposed_by_user=user)
        .select_related("proposed_by_agent", "proposed_by_user")
        .order_by("created_at")
    )


def proposals_waiting(*, user: Any) -> QuerySet[Action]:
    """Single proposals waiting for a decision, oldest first, but for those this person proposed."""
    return Action.objects.filter(status=ActionStatus.PROPOSED).exclude(proposed_by_user=user).order_by("created_at")


def manager_waiting_counts(*, user: Any) -> tuple[int, int]:
    """How many single proposals and how many plans wait for this manager."""
    return proposals_waiting(user=user).count(), plans_waiting(user=user).count()


# What a plan is about, in the words on the papers a clerk holds: the parameters that name a
# business document, in the order they are looked for.
_SUBJECT_PARAMETERS = (("bill_number", "Bill"), ("order_number", "Order"))


def plan_subject(parameters: dict[str, Any]) -> str:
    """ "Bill INV-2291", "Order 4909": the document a plan is about, or "" when it names none."""
    for name, noun in _SUBJECT_PARAMETERS:
        if parameters.get(name):
            return f"{noun} {parameters[name]}"
    return ""
