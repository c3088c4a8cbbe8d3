"""Finance's page of changes to approval limits and auto-approval caps: the waiting ones, each
with its values before and after and Confirm and Reject, and the last ones decided.

Only members of finance see it (403 for everyone else, admins and superusers included). The
rules are the service's (approvals/policy_changes.py): a refused decision writes nothing and
answers with the refusal's status and the page again.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST, require_safe

from approvals.four_eyes import policy_change_reader_refusal
from approvals.models import PolicyChange
from approvals.policy_changes import (
    PolicyChangeRefused,
    policy_change_confirm,
    policy_change_reject,
    policy_changes_page_get,
)


class RejectForm(forms.Form):
    note = forms.CharField(max_length=1000, required=False, strip=True)


def _finance_only(request: HttpRequest) -> None:
    refusal = policy_change_reader_refusal(user=request.user)
    if refusal is not None:
        raise PermissionDenied(refusal)


def _page(request: HttpRequest, *, status: int = 200) -> HttpResponse:
    page = policy_changes_page_get(user=request.user)
    return render(request, "approvals/policy_changes.html", {"page": page}, status=status)


@require_safe
@login_required
def policy_changes(request: HttpRequest) -> HttpResponse:
    _finance_only(request)
    return _page(request)


def _decided(
    request: HttpRequest, decide: Callable[[], PolicyChange], said: Callable[[PolicyChange], str]
) -> HttpResponse:
    """Run the second person's decision on a change: back to the list saying what it did, or the
    list again with the refusal."""
    try:
        change = decide()
    except PolicyChange.DoesNotExist as missing:
        raise Http404("There is no such change.") from missing
    except PolicyChangeRefused as refused:
        messages.error(request, str(refused))
        return _page(request, status=refused.status)
    messages.success(request, said(change))
    return redirect("approvals-policy-changes")


@require_POST
@login_required
def policy_change_confirm_view(request: HttpRequest, pk: int) -> HttpResponse:
    _finance_only(request)
    return _decided(
        request,
        functools.partial(policy_change_confirm, change_pk=pk, user=request.user),
        lambda change: f"Confirmed: the {change.what()} is {change.after_text()} now.",
    )


@require_POST
@login_required
def policy_change_reject_view(request: HttpRequest, pk: int) -> HttpResponse:
    _finance_only(request)
    form = RejectForm(request.POST)
    if not form.is_valid():
        messages.error(request, "The note is too long: at most 1,000 characters.")
        return _page(request, status=400)
    return _decided(
        request,
        functools.partial(policy_change_reject, change_pk=pk, user=request.user, note=form.cleaned_data["note"]),
        lambda change: f"Rejected: the {change.what()} stays {change.before_text()}.",
    )
