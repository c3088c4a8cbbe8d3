"""Proposing a workflow, and the one decision on its whole plan.

Identity (docs/architecture.md section 10): the workflow id is composed from business references by the
template; a case has at most one live workflow. The same plan proposed again returns the live
workflow (200); a different plan while one is live is refused, naming it (409). Bad input is a
ProposalInvalid naming each field, and writes nothing.

One approval covers the plan. It binds every target's version, each step's amount, currency and
payload hash, the plan's hash and an expiry. The approver's limit covers the plan's total in
each currency. Below every money step's kind threshold, with no kind objecting and within the
auto-approval caps, the policy approves the plan in the proposal's transaction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction

from actions import permissions as perms
from actions.foundation.clock import database_clock_now
from actions.foundation.publish import workflow_advance_enqueue_on_commit
from actions.foundation.refusals import Refused
from actions.foundation.trail import Actor
from actions.kinds import kind_for
from actions.kinds.fields import ProposalInvalid
from actions.models import LIVE_WORKFLOW_STATES, Action, Workflow, WorkflowEvent, WorkflowState, WorkflowStep
from actions.plain import step_words
from actions.providers.money import money_text
from actions.workflows.children import latest_plan_approval
from actions.workflows.events import workflow_event, workflow_transition
from actions.workflows.templates import READ, all_templates, plan_actions, plan_totals, template_for
from approvals.caps import auto_approval_cap_lock, auto_approval_cap_refusal
from approvals.four_eyes import four_eyes_refusal
from approvals.models import ApprovalLimit, ApprovalPolicy, Decision, WorkflowApproval

W = WorkflowState


class WorkflowConflict(Exception):
    """The case already has a live workflow with a different plan."""

    def __init__(self, live: Workflow) -> None:
        # ``live``: the workflow the proposal collides with. Usually the case's live one; it may
        # be a finished workflow that already holds the same id (same case reference).
        self.live = live
        self.is_live = live.state in LIVE_WORKFLOW_STATES
        if self.is_live:
            text = (
                f"The case already has the live workflow {live.workflow_id} ({live.get_state_display().lower()}) "
                "with a different plan. Recovery uses the saved decision: fetch that workflow rather than proposing "
                "a new one."
            )
        else:
            text = (
                f"The workflow {live.workflow_id} already exists ({live.get_state_display().lower()}) with a "
                "different plan. A new decision for the case needs a new case reference."
            )
        super().__init__(text)


@dataclass
class WorkflowProposalResult:
    workflow: Workflow
    created: bool


def workflow_propose(
    *, template: object, parameters: object, proposer: Actor, now: datetime | None = None
) -> WorkflowProposalResult:
    now = now or database_clock_now()
    name = str(template or "")
    found = template_for(name)
    if found is None:
        names = ", ".join(t.name for t in all_templates())
        raise ProposalInvalid.for_field("template", "unknown_template", f"Use one of: {names}.")
    with transaction.atomic(durable=True):
        proposal = found.validate(parameters if isinstance(parameters, dict) else {})  # type: ignore[arg-type]
        live = Workflow.objects.filter(case=proposal.case, state__in=sorted(LIVE_WORKFLOW_STATES)).first()
        if live is not None:
            return _existing_or_conflict(live, proposal.plan_hash)
        existing = Workflow.objects.filter(workflow_id=proposal.workflow_id).first()
        if existing is not None:
            # A finished workflow under this id: the same plan is that workflow; another plan
            # needs another case reference.
            return _existing_or_conflict(existing, proposal.plan_hash)
        actor_user = proposer.accountable_user
        workflow = Workflow(
            workflow_id=proposal.workflow_id,
            template=found.name,
            case=proposal.case,
            parameters=proposal.parameters,
            plan=proposal.plan,
            plan_hash=proposal.plan_hash,
            proposed_by_agent=proposer.agent,
            proposed_by_user=actor_user if getattr(actor_user, "pk", None) else None,
        )
        workflow.propose()
        workflow.state_changed_at = now
        try:
            with transaction.atomic():
                workflow.save()
        except IntegrityError:
            # Lost the race for the case (or the id) to a concurrent proposal.
            winner = Workflow.objects.filter(
                case=proposal.case, state__in=sorted(LIVE_WORKFLOW_STATES)
            ).first() or Workflow.objects.get(workflow_id=proposal.workflow_id)
            return _existing_or_conflict(winner, proposal.plan_hash)
        for spec, plan_step in zip(found.steps, proposal.plan["steps"], strict=True):
            WorkflowStep.objects.create(
                workflow=workflow,
                position=plan_step["position"],
                name=spec.name,
                kind=spec.kind,
                step_class=str(spec.step_class),
                compensation_kind=spec.compensation_kind or "",
                compensation_none_reason="" if spec.compensation_kind else spec.compensation_note,
            )
        workflow_event(
            workflow=workflow,
            transition="propose",
            from_state="",
            actor=proposer,
            reason=f"Plan {found.name} proposed ({len(found.steps)} steps).",
            evidence={"plan_hash": proposal.plan_hash, "parameters": proposal.parameters},
            now=now,
        )
        plan_auto_approve(workflow=workflow, now=now)
        return WorkflowProposalResult(workflow=workflow, created=True)


def _existing_or_conflict(workflow: Workflow, plan_hash: str) -> WorkflowProposalResult:
    if workflow.plan_hash == plan_hash:
        return WorkflowProposalResult(workflow=workflow, created=False)
    raise WorkflowConflict(workflow)


# --- the plan's binding ------------------------------------------------------------------------


def plan_bindings(workflow: Workflow) -> list[dict[str, Any]]:
    """What an approval of the plan binds, per step, as of now: the target's version (as the
    step's kind defines it), amount, currency and the child's payload hash."""
    bindings = []
    for step, action in plan_actions(workflow.workflow_id, workflow.plan):
        entry: dict[str, Any] = {
            "step": step["name"],
            "kind": step["kind"],
            "target": step["target"],
            "amount": step["amount"],
            "currency": step["currency"],
        }
        if action is not None:
            entry["version"] = kind_for(action.kind).target_version(action)
            entry["payload_hash"] = action.payload_hash
        bindings.append(entry)
    return bindings


def plan_refusals(workflow: Workflow) -> list[str]:
    """Why no approval could hold now: a target that cannot take its step (the bill's balance,
    a contact that left)."""
    problems = []
    for step, action in plan_actions(workflow.workflow_id, workflow.plan):
        if action is None:
            continue
        refusal = kind_for(action.kind).approval_refusal(action)
        if refusal is not None:
            problems.append(f"{step['name']}: {refusal[1]}")
    return problems


@dataclass(frozen=True)
class PlanDecider:
    """Who decides a plan, as its decision's row and its trail record them: a manager, or the
    auto-approval policy."""

    # The manager; None for the policy.
    approver: Any
    label: str
    policy: str
    actor: Actor
    detail: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def manager(cls, user: Any) -> PlanDecider:
        return cls(approver=user, label=user.get_username(), policy=ApprovalPolicy.MANAGER, actor=Actor.for_user(user))

    @classmethod
    def auto_policy(cls, workflow: Workflow) -> PlanDecider:
        return cls(
            approver=None,
            label="policy:auto-approval (every step within its kind's threshold)",
            policy=ApprovalPolicy.AUTO,
            actor=Actor.system("auto-approval"),
            detail={"totals": plan_totals(workflow.plan)},
        )

    def decision_record(
        self, workflow: Workflow, *, decision: str, note: str, now: datetime, **binding: Any
    ) -> WorkflowApproval:
        """The row of this decider's ``decision`` on the plan as it is now; ``binding``: what an
        approval binds besides the plan's hash (each step's binding, the totals, the expiry)."""
        return WorkflowApproval.objects.create(
            workflow=workflow,
            approver=self.approver,
            decided_by_label=self.label,
            policy=self.policy,
            policy_detail=self.detail,
            decision=decision,
            note=note,
            decided_at=now,
            plan_hash=workflow.plan_hash,
            **binding,
        )


def _record_approval(*, workflow: Workflow, decider: PlanDecider, note: str, now: datetime) -> WorkflowApproval:
    approval = decider.decision_record(
        workflow,
        decision=Decision.APPROVE,
        note=note,
        now=now,
        bindings=plan_bindings(workflow),
        totals=plan_totals(workflow.plan),
        expires_at=now + timedelta(seconds=settings.APPROVAL_TTL_SECONDS),
    )
    workflow_transition(
        workflow=workflow,
        transition="approve",
        actor=decider.actor,
        reason=note or "Plan approved.",
        evidence={
            "workflow_approval_id": approval.pk,
            "plan_hash": approval.plan_hash,
            "totals": approval.totals,
            "bindings": approval.bindings,
            "expires_at": approval.expires_at.isoformat() if approval.expires_at else None,
            "policy": decider.policy,
        },
        now=now,
    )
    workflow_advance_enqueue_on_commit(workflow.workflow_id)
    return approval


def plan_auto_refusal(workflow: Workflow, *, now: datetime) -> str | None:
    """Why the auto-approval policy must leave the plan to a manager, or None."""
    if not settings.AUTO_APPROVAL_ENABLED:
        return "auto-approval is switched off"
    for step, action in plan_actions(workflow.workflow_id, workflow.plan):
        if action is None:
            continue
        action.proposed_by_agent = workflow.proposed_by_agent
        kind = kind_for(action.kind)
        if kind.moves_money:
            threshold = kind.auto_approval_threshold(action.currency)
            if threshold is None or action.amount > threshold:
                money = money_text(action.amount, action.currency)
                return f"{step_words(step['name'])}: {money} is above the {kind.label} threshold"
            # As for a lone proposal: the target and the agent are locked until the proposal's
            # transaction ends, so plans proposed together are counted one after the other and
            # cannot all fit under a cap that only some of them fit.
            auto_approval_cap_lock(action=action)
            held = auto_approval_cap_refusal(action=action, now=now)
            if held is not None:
                return f"{step_words(step['name'])}: {held}"
        refusal = kind.auto_approval_refusal(action)
        if refusal is not None:
            return f"{step_words(step['name'])}: {refusal}"
        compensation = step["compensation"]["kind"]
        if compensation and kind_for(compensation).auto_approval_refusal(action) is not None:
            undo = kind_for(compensation).label
            return f"{step_words(step['name'])}: its undoing ({undo}) is a person's decision"
    if plan_refusals(workflow):
        return "; ".join(plan_refusals(workflow))
    return None


def plan_auto_approve(*, workflow: Workflow, now: datetime) -> WorkflowApproval | None:
    """Approve the plan by policy when every step is within its kind's threshold and caps."""
    refusal = plan_auto_refusal(workflow, now=now)
    if refusal is not None:
        workflow_event(
            workflow=workflow,
            transition="auto_approval_held",
            from_state=workflow.state,
            actor=Actor.system("auto-approval"),
            reason=f"Left to a manager: {refusal.rstrip('.')}.",
            now=now,
        )
        return None
    return _record_approval(
        workflow=workflow,
        decider=PlanDecider.auto_policy(workflow),
        note="Auto-approved: every money step is within its kind's threshold and caps.",
        now=now,
    )


# --- a manager's decision ----------------------------------------------------------------------


class PlanDecisionRefused(Refused):
    default_status = 403


def plan_refusal_reason(*, workflow: Workflow, user: Any) -> tuple[str, str] | None:
    """Why ``user`` may not approve the plan, as (code, message); the page and the service share it."""
    if workflow.state != W.PROPOSED:
        return ("not_waiting", f"This workflow is {workflow.get_state_display().lower()}, not waiting for a decision.")
    # Deciding a plan is deciding each of its actions: the same permission and four eyes.
    probe = Action(proposed_by_user=workflow.proposed_by_user, proposed_by_agent=workflow.proposed_by_agent)
    if not user.has_perm(perms.DECIDE):
        return ("not_a_manager", "Only managers may approve or reject plans.")
    four_eyes = four_eyes_refusal(action=probe, user=user)
    if four_eyes is not None:
        return ("four_eyes", four_eyes.replace("action", "plan"))
    for currency, total in plan_totals(workflow.plan).items():
        limit = ApprovalLimit.objects.filter(user=user, currency=currency).values_list("max_amount", flat=True).first()
        if limit is None:
            return ("no_limit", f"You have no approval limit in {currency}.")
        if Decimal(total) > limit:
            return ("over_limit", f"The plan's total {total} {currency} is above your limit of {limit} {currency}.")
    problems = plan_refusals(workflow)
    if problems:
        return ("target_refuses", "; ".join(problems))
    return None


def plan_decide(
    *,
    workflow_pk: int,
    user: Any,
    decision: str,
    note: str = "",
    plan_hash: str | None = None,
    now: datetime | None = None,
) -> Workflow:
    """A manager approves or rejects a whole plan.

    ``plan_hash``: the hash of the plan the manager's page showed. A page always sends it, so
    an empty one is refused (400), and one that differs from the plan's is refused (409). None:
    the caller shows no page (the harness, a test that decides directly)."""
    now = now or database_clock_now()
    if decision not in Decision.values:
        raise PlanDecisionRefused(f"Unknown decision {decision!r}.", code="invalid_decision", status=400)
    if plan_hash is not None and not plan_hash.strip():
        raise PlanDecisionRefused(
            "plan_hash is missing: the page sends the hash of the plan it showed with every decision. "
            "Reload the page and decide again.",
            code="plan_hash_missing",
            status=400,
            field="plan_hash",
        )
    with transaction.atomic(durable=True):
        workflow = Workflow.objects.select_for_update().get(pk=workflow_pk)
        if workflow.state != W.PROPOSED:
            raise PlanDecisionRefused(
                f"{workflow.workflow_id} is {workflow.get_state_display().lower()} now. Nothing was changed.",
                code="not_waiting",
                status=409,
            )
        if plan_hash is not None and plan_hash != workflow.plan_hash:
            raise PlanDecisionRefused(
                "This is not the plan the page showed: its hash differs. Reload the page to see the plan as it is.",
                code="plan_changed",
                status=409,
            )
        decider = PlanDecider.manager(user)
        if decision == Decision.APPROVE:
            refusal = plan_refusal_reason(workflow=workflow, user=user)
            if refusal is not None:
                raise PlanDecisionRefused(refusal[1], code=refusal[0])
            _record_approval(workflow=workflow, decider=decider, note=note, now=now)
            return workflow
        refusal = plan_refusal_reason(workflow=workflow, user=user)
        if refusal is not None and refusal[0] in ("not_a_manager", "not_waiting"):
            raise PlanDecisionRefused(refusal[1], code=refusal[0])
        decider.decision_record(
            workflow, decision=Decision.REJECT, note=note, now=now, totals=plan_totals(workflow.plan)
        )
        workflow_transition(
            workflow=workflow,
            transition="reject",
            actor=decider.actor,
            reason=note or "Rejected by a manager.",
            now=now,
            note=note or "Rejected by a manager.",
        )
        return workflow


# --- reading -------------------------------------------------------------------------------


def workflow_summary(workflow: Workflow) -> dict[str, Any]:
    """Steps, their states, what happens next and whether the workflow is final (API and pages)."""
    steps = list(
        WorkflowStep.objects.filter(workflow=workflow).select_related("action", "compensation").order_by("position")
    )
    out_steps = []
    for step in steps:
        child = step.action
        comp = step.compensation
        if step.kind == READ:
            state = "SUCCEEDED" if step.result is not None else "PENDING"
        else:
            state = child.status if child is not None else "PENDING"
        out_steps.append(
            {
                "position": step.position,
                "name": step.name,
                "kind": step.kind,
                "step_class": step.step_class,
                "state": state,
                "action_id": child.action_id if child is not None else None,
                "completion_order": step.completion_order,
                "compensation": {
                    "kind": step.compensation_kind or None,
                    "none_reason": step.compensation_none_reason or None,
                    "action_id": comp.action_id if comp is not None else None,
                    "state": comp.status if comp is not None else None,
                },
            }
        )
    return {
        "workflow_id": workflow.workflow_id,
        "template": workflow.template,
        "case": workflow.case,
        "state": workflow.state,
        "final": workflow.is_final,
        "plan_hash": workflow.plan_hash,
        "owner": workflow.owner.get_username() if workflow.owner is not None else None,
        "waiting_for": workflow.waiting_for or None,
        "next": workflow_next(workflow, out_steps),
        "steps": out_steps,
    }


def workflow_next(workflow: Workflow, steps: list[dict[str, Any]]) -> str:
    state = workflow.state
    if state == W.PROPOSED:
        # Why the policy left it to a person (a cap reached, a step above its threshold), as the
        # proposal's trail recorded it: the proposer reads it in the answer, not only managers.
        held = (
            WorkflowEvent.objects.filter(workflow=workflow, transition="auto_approval_held")
            .order_by("-pk")
            .values_list("reason", flat=True)
            .first()
        )
        return "Waiting for a manager to approve the plan." + (f" {held}" if held else "")
    if state == W.AUTHORIZED:
        return "Approved: the first step starts shortly."
    if state == W.RUNNING:
        pending = next((s for s in steps if s["state"] != "SUCCEEDED"), None)
        return f"Running step {pending['position']}: {step_words(pending['name'])}." if pending else "Finishing."
    if state == W.PAUSED:
        return f"Paused: {workflow.waiting_for}"
    if state == W.COMPENSATING:
        return "Walking back the completed steps in reverse." + (
            f" {workflow.waiting_for}" if workflow.waiting_for else ""
        )
    if state == W.FAILED:
        return f"Needs review: {workflow.waiting_for}"
    return "Nothing: the workflow is final."


__all__ = [
    "WorkflowConflict",
    "WorkflowProposalResult",
    "latest_plan_approval",
    "plan_decide",
    "plan_refusal_reason",
    "workflow_propose",
    "workflow_summary",
]
