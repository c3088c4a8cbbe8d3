"""The home page: what each role has to do today, with links to where it is done."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_safe

from approvals.selectors import approval_summary_get


@require_safe
@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    context: dict[str, Any] = {}
    # Managers get their numbers; the other roles' summaries arrive with their own pages, and
    # until then the template explains in a sentence what each role does here.
    if request.user.has_perm("actions.decide_action"):
        context["manager_summary"] = approval_summary_get(user=request.user)
    return render(request, "console/dashboard.html", context)
