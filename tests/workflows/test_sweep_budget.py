"""The workflow sweep keeps to its budget (half the sweep interval): the other sweeps of the
period run after it on the same periodic process. It reads the database's clock, so a host whose
clock runs ahead neither finds every workflow overdue nor touches them into the future."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from actions.foundation.sql import database_now
from actions.models import Workflow
from actions.models.workflows import WorkflowState
from actions.workflows import coordinator

pytestmark = pytest.mark.django_db


def stuck(count: int, *, age: timedelta) -> list[str]:
    ids = []
    for number in range(count):
        workflow = Workflow.objects.create(
            workflow_id=f"wf-budget-{number}",
            template="po_mismatch_resolution",
            case=f"case-{number}",
            parameters={},
            plan={},
            plan_hash="x",
            state=WorkflowState.RUNNING,
        )
        ids.append(workflow.workflow_id)
    Workflow.objects.filter(workflow_id__in=ids).update(updated_at=database_now() - age)
    return ids


def test_the_workflow_sweep_stops_starting_advances_once_its_budget_is_spent(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    settings.SWEEP_INTERVAL_SECONDS = 4  # a budget of 2 s
    stuck(5, age=timedelta(minutes=1))
    clock = {"now": 1000.0}
    advanced: list[str] = []

    def advance(*, workflow_id: str) -> None:
        advanced.append(workflow_id)
        clock["now"] += 1.0  # each advance takes a second

    monkeypatch.setattr(coordinator, "workflow_advance", advance)
    monkeypatch.setattr(coordinator.time, "monotonic", lambda: clock["now"])

    coordinator.sweep_workflows()

    # Started at 0, 1 and 2 s (not past the budget yet); none at 3 s. The rest waits, oldest first.
    assert advanced == ["wf-budget-0", "wf-budget-1", "wf-budget-2"]


def test_the_workflow_sweep_counts_overdue_on_the_databases_clock(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    settings.SWEEP_INTERVAL_SECONDS = 10
    fresh = stuck(1, age=timedelta(seconds=1))  # within the grace: left to its own nudge
    advanced: list[str] = []
    monkeypatch.setattr(coordinator, "workflow_advance", lambda *, workflow_id: advanced.append(workflow_id))
    # This host's clock runs 90 s ahead of the database's.
    monkeypatch.setattr(
        "django.utils.timezone.now", lambda: database_now() + timedelta(seconds=90)
    )
    monkeypatch.setattr(coordinator, "database_clock_now", database_now)

    coordinator.sweep_workflows()

    assert advanced == []
    assert Workflow.objects.get(workflow_id=fresh[0]).updated_at < database_now()
