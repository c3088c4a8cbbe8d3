"""The home page: what each role has to do today, with links to where it is done."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.contrib.staticfiles.storage import staticfiles_storage
from django.http import HttpRequest, HttpResponse, HttpResponsePermanentRedirect
from django.shortcuts import render
from django.views.decorators.http import require_safe

from actions import permissions as perms
from actions.review.selectors.common import RESOLVE_PERMISSION
from actions.review.selectors.summary import ledger_audit_state, payable_summary_get, review_summary_get
from approvals.four_eyes import policy_change_reader_refusal
from approvals.policy_changes import policy_changes_waiting_count
from approvals.selectors.decided import approval_summary_get
from console.roles import ACCOUNTS_PAYABLE, FINANCE, user_roles


@require_safe
@login_required
def nav_waiting(request: HttpRequest) -> HttpResponse:
    """The navigation's count alone: the page asks for it when an outcome it follows is final."""
    return render(request, "console/_nav_waiting.html")


@require_safe
@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    context: dict[str, Any] = {"ledger_audit": ledger_audit_state()}
    # Each role gets its own numbers; a person with several roles sees each part.
    if request.user.has_perm(perms.DECIDE):
        context["manager_summary"] = approval_summary_get(user=request.user)
    roles = user_roles(request.user)
    if request.user.has_perm(RESOLVE_PERMISSION) and (FINANCE in roles or ACCOUNTS_PAYABLE not in roles):
        context["finance_summary"] = review_summary_get(user=request.user)
    if ACCOUNTS_PAYABLE in roles:
        # Accounts payable works invoice adjustments and the bills they draw on, not refunds.
        context["payable_summary"] = payable_summary_get(user=request.user)
    if policy_change_reader_refusal(user=request.user) is None:
        # Changes to approval limits and caps wait for a member of finance to confirm them.
        context["policy_changes_waiting"] = policy_changes_waiting_count(user=request.user)
    return render(request, "console/dashboard.html", context)


@require_safe
def favicon(request: HttpRequest) -> HttpResponse:
    """Browsers ask for /favicon.ico whatever the page says: send them to the console's icon."""
    return HttpResponsePermanentRedirect(staticfiles_storage.url("console/favicon.svg"))
