"""Workflows (sagas): several effects from one decision, run in order, walked back in reverse.

A workflow is an instance of a template registered in code (``actions.workflows.templates``).
Its plan (every step's kind, payload, amount, currency, target and compensation) is fixed when
it is proposed and hashed; one approval binds the whole plan. Each effect step becomes a child
``Action`` with the key ``<workflow id>:<step>`` only when the coordinator starts it, and each
compensation a child with the key ``<workflow id>:<step>:compensate`` (docs/architecture.md section 10).

The workflow's state is a protected FSM field. As for actions, transitions only change fields;
the coordinator runs them in a transaction and writes a ``WorkflowEvent`` in that transaction.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q
from django_fsm import ConcurrentTransitionMixin, FSMField, transition

from actions.models.actions import TrailEvent
from actions.models.append_only import AppendOnlyQuerySet, TrailIsAppendOnly


class WorkflowState(models.TextChoices):
    NEW = "NEW", "New"
    PROPOSED = "PROPOSED", "Proposed"
    AUTHORIZED = "AUTHORIZED", "Authorized"
    RUNNING = "RUNNING", "Running"
    PAUSED = "PAUSED", "Paused"
    COMPENSATING = "COMPENSATING", "Compensating"
    COMPLETED = "COMPLETED", "Completed"
    COMPENSATED = "COMPENSATED", "Compensated"
    FAILED = "FAILED", "Failed (needs review)"
    REJECTED = "REJECTED", "Rejected"


W = WorkflowState

# A case has at most one workflow in these states (invariant 15). FAILED is not live: the
# workflow will not move by itself again; its owner settles what is left by hand.
LIVE_WORKFLOW_STATES = frozenset({W.PROPOSED, W.AUTHORIZED, W.RUNNING, W.PAUSED, W.COMPENSATING})
FINAL_WORKFLOW_STATES = frozenset({W.COMPLETED, W.COMPENSATED, W.FAILED, W.REJECTED})


class Workflow(ConcurrentTransitionMixin, models.Model):
    workflow_id = models.CharField(max_length=200, unique=True)
    template = models.CharField(max_length=64)
    # The business situation (e.g. one bill's purchase-order mismatch): one live workflow each.
    case = models.CharField(max_length=200)
    parameters = models.JSONField(help_text="The template's parameters, as proposed.")
    plan = models.JSONField(help_text="The steps as planned: kinds, payloads, money, compensations.")
    plan_hash = models.CharField(max_length=80)
    state = FSMField(default=W.NEW, choices=WorkflowState.choices, protected=True)
    rejection_reasons = models.JSONField(default=list, blank=True)

    proposed_by_agent = models.ForeignKey(
        "actions.Agent", on_delete=models.PROTECT, null=True, blank=True, related_name="workflows"
    )
    proposed_by_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="proposed_workflows"
    )
    # The named person a paused or failed workflow waits for.
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="owned_workflows"
    )
    waiting_for = models.TextField(blank=True, help_text="Why the workflow is paused or failed, in plain words.")

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    state_changed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(condition=~Q(state=W.NEW), name="workflow_state_not_new"),
            # Invariant 15 at the database: two concurrent proposals for one case give one row.
            models.UniqueConstraint(
                fields=["case"],
                condition=Q(state__in=sorted(LIVE_WORKFLOW_STATES)),
                name="workflow_one_live_per_case",
            ),
        ]
        indexes = [models.Index(fields=["state", "updated_at"], name="workflow_state_idx")]

    def __str__(self) -> str:
        return self.workflow_id

    @property
    def is_final(self) -> bool:
        return self.state in FINAL_WORKFLOW_STATES

    # --- transitions: fields only ----------------------------------------------------------

    @transition(field=state, source=W.NEW, target=W.PROPOSED)
    def propose(self) -> None:
        pass

    @transition(field=state, source=W.PROPOSED, target=W.AUTHORIZED)
    def approve(self) -> None:
        pass

    @transition(field=state, source=W.PROPOSED, target=W.REJECTED)
    def reject(self, *, note: str) -> None:
        self.rejection_reasons = [{"code": "rejected_by_manager", "message": note}]

    @transition(field=state, source=W.AUTHORIZED, target=W.RUNNING)
    def start(self) -> None:
        pass

    @transition(field=state, source=[W.RUNNING, W.COMPENSATING], target=W.PAUSED)
    def pause(self, *, owner: Any, waiting_for: str) -> None:
        self.owner = owner
        self.waiting_for = waiting_for

    @transition(field=state, source=W.PAUSED, target=W.RUNNING)
    def resume(self) -> None:
        self.waiting_for = ""

    @transition(field=state, source=[W.RUNNING, W.PAUSED], target=W.COMPENSATING)
    def begin_compensation(self) -> None:
        self.waiting_for = ""

    @transition(field=state, source=W.RUNNING, target=W.COMPLETED)
    def complete(self) -> None:
        self.waiting_for = ""

    @transition(field=state, source=W.COMPENSATING, target=W.COMPENSATED)
    def finish_compensation(self) -> None:
        self.waiting_for = ""

    @transition(field=state, source=[W.RUNNING, W.PAUSED, W.COMPENSATING], target=W.FAILED)
    def fail(self, *, owner: Any, waiting_for: str) -> None:
        self.owner = owner
        self.waiting_for = waiting_for


class WorkflowStep(models.Model):
    """One planned step, and the child actions that carried it out and walked it back."""

    workflow = models.ForeignKey(Workflow, on_delete=models.PROTECT, related_name="steps")
    position = models.PositiveSmallIntegerField()
    name = models.CharField(max_length=40)
    kind = models.CharField(max_length=32, help_text="The effect kind, or 'read' for a read step.")
    step_class = models.CharField(max_length=16)
    action = models.OneToOneField(
        "actions.Action", on_delete=models.PROTECT, null=True, blank=True, related_name="workflow_step"
    )
    compensation_kind = models.CharField(max_length=32, blank=True)
    # Why a step has no compensation (and what happens instead), when it has none.
    compensation_none_reason = models.TextField(blank=True)
    compensation = models.OneToOneField(
        "actions.Action", on_delete=models.PROTECT, null=True, blank=True, related_name="compensated_step"
    )
    # A read step's result, saved once: recovery reuses it rather than reading again.
    result = models.JSONField(null=True, blank=True)
    # The order in which steps were recorded SUCCEEDED: compensation walks it backwards.
    completion_order = models.PositiveSmallIntegerField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["workflow", "position"]
        constraints = [
            models.UniqueConstraint(fields=["workflow", "position"], name="workflow_step_position"),
            models.UniqueConstraint(fields=["workflow", "name"], name="workflow_step_name"),
        ]

    def __str__(self) -> str:
        return f"{self.workflow.workflow_id}:{self.name}"


class WorkflowTrailIsAppendOnly(TrailIsAppendOnly):
    pass


class WorkflowEvent(TrailEvent):
    """The workflow's append-only audit trail: every state change, written in its transaction."""

    workflow = models.ForeignKey(Workflow, on_delete=models.PROTECT, related_name="events")

    objects = AppendOnlyQuerySet["WorkflowEvent"].as_manager()
    trail_name = "workflow events"
    append_only_error = WorkflowTrailIsAppendOnly

    def __str__(self) -> str:
        return f"{self.workflow_id}: {self.from_state or '-'} -> {self.to_state} ({self.transition})"
