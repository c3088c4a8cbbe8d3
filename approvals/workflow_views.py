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

from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST, require_safe

from actions import permissions as perms
from actions.kinds import kind_for
from actions.models import Workflow, WorkflowState
from actions.workflows.services import PlanDecisionRefused, plan_decide, plan_refusal_reason, workflow_summary
from actions.workflows.templates import READ, plan_actions, plan_totals
from approvals.models import Decision
from approvals.step_up import step_up_refusal, step_up_verified_at


def plan_context(workflow: Workflow, user: Any) -> dict[str, Any]:
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
                "kind_label": kind.label if kind else "Read",
                "receiver": step["receiver"],
                "target": kind.target_label(action) if kind and action is not None else step["target"]["ref"],
                "preview": kind.message_preview(action) if kind and action is not None else None,
                "compensation_label": comp_kind.label if comp_kind else "None",
                "compensation_preview": comp_preview,
            }
        )
    refusal = plan_refusal_reason(workflow=workflow, user=user) if workflow.state == WorkflowState.PROPOSED else None
    return {
        "workflow": workflow,
        "steps": steps,
        "totals": plan_totals(workflow.plan),
        "summary": workflow_summary(workflow),
        "refusal": refusal,
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
    waiting = Workflow.objects.filter(state=WorkflowState.PROPOSED).order_by("created_at")[:200]
    return render(request, "approvals/workflow_inbox.html", {"workflows": waiting})


@require_safe
@login_required
@permission_required(perms.DECIDE, raise_exception=True)
def plan_detail(request: HttpRequest, pk: int) -> HttpResponse:
    workflow = _workflow_or_404(pk)
    return render(request, "approvals/workflow_plan.html", plan_context(workflow, request.user))


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
    messages.success(request, f"{verb} the plan of {workflow.workflow_id}.")
    return redirect("approvals-workflow", pk=pk)
