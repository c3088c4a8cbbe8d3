"""The manager's plan page: one workflow's whole plan, approved or rejected in one decision.

Each step shows its kind, its receiver, its step class (a badge), its compensation (or "none"
with the reason), the email it sends (exactly the text the plan binds) and its money. The
decision is a plain POST (CSRF-protected); a refusal writes nothing and answers with the
refusal's status code. Above the step-up threshold, approving needs a fresh second factor, per
currency of the plan's total, as for single actions.
"""

from __future__ import annotations

import time
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST, require_safe
from django_htmx.middleware import HtmxDetails

from actions import permissions as perms
from actions.kinds import kind_for
from actions.models import Workflow, WorkflowState
from actions.plain import step_state_words, step_words
from actions.workflows.services import PlanDecisionRefused, plan_decide, plan_refusal_reason, workflow_summary
from actions.workflows.templates import READ, plan_actions, plan_totals, template_for
from approvals.models import Decision
from approvals.selectors.plans import plan_subject, plans_waiting
from approvals.step_up import step_up_refusal, step_up_verified_at


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


def plan_context(workflow: Workflow, user: Any) -> dict[str, Any]:
    summary = workflow_summary(workflow)
    states = {step["name"]: step["state"] for step in summary["steps"]}
    steps = []
    for step, action in plan_actions(workflow.workflow_id, workflow.plan):
        kind = kind_for(step["kind"]) if step["kind"] != READ else None
        compensation = step["compensation"]
        comp_kind = kind_for(compensation["kind"]) if compensation["kind"] else None
        comp_preview = None
        payload = compensation.get("payload") or {}
        if payload.get("subject"):
            comp_preview = {name: str(payload.get(name, "")) for name in ("to", "subject", "body")}
        steps.append(
            {
                "plan": step,
                "label": step_words(step["name"]),
                "kind_label": kind.label if kind else "Read",
                "receiver": step["receiver"],
                "target": kind.target_label(action) if kind and action is not None else step["target"]["ref"],
                "preview": kind.message_preview(action) if kind and action is not None else None,
                # None when the step has no compensation: the note then says why, on its own.
                "compensation_label": comp_kind.label if comp_kind else None,
                "compensation_preview": comp_preview,
                "state": step_state_words(states.get(step["name"], "PENDING")),
            }
        )
    refusal = plan_refusal_reason(workflow=workflow, user=user) if workflow.state == WorkflowState.PROPOSED else None
    return {
        "workflow": workflow,
        "label": _template_label(workflow.template),
        "subject": plan_subject(workflow.parameters),
        "proposer": _proposer(workflow),
        "steps": steps,
        "totals": plan_totals(workflow.plan),
        "summary": summary,
        "refusal": refusal,
        # A plan on its way is followed live, as the action cards are, until it is final.
        "poll_seconds": 0 if workflow.is_final else settings.LIVE_POLL_SECONDS,
    }


def _workflow_or_404(pk: int) -> Workflow:
    workflow = Workflow.objects.filter(pk=pk).first()
    if workflow is None:
        raise Http404("There is no such workflow.")
    return workflow


@require_safe
@login_required
@permission_required(perms.DECIDE, raise_exception=True)
def plan_inbox(request: HttpRequest) -> HttpResponse:
    plans = [
        {
            "workflow": workflow,
            "label": _template_label(workflow.template),
            "subject": plan_subject(workflow.parameters),
            "totals": plan_totals(workflow.plan),
            "proposer": _proposer(workflow),
        }
        for workflow in plans_waiting(user=request.user)[:200]
    ]
    return render(request, "approvals/workflow_inbox.html", {"plans": plans})


def _template_label(name: str) -> str:
    template = template_for(name)
    return template.label if template is not None else name


def _proposer(workflow: Workflow) -> str:
    if workflow.proposed_by_agent is not None:
        return f"{workflow.proposed_by_agent.name} (agent)"
    return workflow.proposed_by_user.get_username() if workflow.proposed_by_user is not None else ""


@require_safe
@login_required
@permission_required(perms.DECIDE, raise_exception=True)
def plan_detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """The plan page; for htmx, only its progress card, which polls it until the plan is final."""
    context = plan_context(_workflow_or_404(pk), request.user)
    if request.htmx:
        return render(request, "approvals/_plan_progress.html", context)
    return render(request, "approvals/workflow_plan.html", context)


@require_POST
@login_required
@permission_required(perms.DECIDE, raise_exception=True)
def plan_decide_view(request: HttpRequest, pk: int) -> HttpResponse:
    workflow = _workflow_or_404(pk)
    decision = request.POST.get("decision", "")
    note = request.POST.get("note", "")[:2000]
    if decision == Decision.APPROVE:
        for currency, total in plan_totals(workflow.plan).items():
            refusal = step_up_refusal(
                user=request.user,
                amount=Decimal(total),
                currency=currency,
                verified_at=step_up_verified_at(request),
                now=time.time(),
            )
            if refusal is not None:
                messages.error(request, f"{refusal} Nothing was changed.")
                next_url = reverse("approvals-workflow", args=[pk])
                return redirect(f"{reverse('two-factor-verify')}?{urlencode({'next': next_url})}")
    try:
        # The page always sends the hash of the plan it showed; without one the service refuses.
        plan_decide(
            workflow_pk=pk, user=request.user, decision=decision, note=note, plan_hash=request.POST.get("plan_hash", "")
        )
    except PlanDecisionRefused as refused:
        context = plan_context(Workflow.objects.get(pk=pk), request.user)
        context["error"] = f"{refused.message} Nothing was changed."
        if refused.code == "plan_changed":
            context["reload_url"] = reverse("approvals-workflow", args=[pk])
        return render(request, "approvals/workflow_plan.html", context, status=refused.status)
    verb = "Approved" if decision == Decision.APPROVE else "Rejected"
    subject = plan_subject(workflow.parameters)
    named = _template_label(workflow.template) + (f" · {subject}" if subject else "")
    messages.success(request, f"{verb} the plan: {named}.")
    return redirect("approvals-workflow", pk=pk)
