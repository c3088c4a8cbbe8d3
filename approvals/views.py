"""The manager's pages: the inbox, one proposal in full, and the decisions posted from them.

Each decision form works twice over. With htmx it posts in the background and the response
is the updated row alone, swapped in place. Without JavaScript it is an ordinary POST that
redirects back to the inbox with a message. A refused decision writes nothing and answers with
the refusal's own status code (409 when the action moved on, 403 for a rule), never a 500.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.cache import patch_vary_headers
from django.utils.timesince import timeuntil
from django.views.decorators.http import require_POST, require_safe
from django_htmx.middleware import HtmxDetails

from actions import permissions as perms
from actions.models import Action
from actions.providers.money import ZERO_DECIMAL_CURRENCIES
from approvals.forms import DecisionForm, ReopenForm, form_problem
from approvals.models import Decision
from approvals.selectors import proposal_detail_get, proposal_inbox_get, proposal_row_get
from approvals.services import DecisionRefused, action_reopen, approval_decide
from approvals.step_up import step_up_refusal, step_up_verified_at

# The manager role is whoever holds this permission: the inbox, the detail page and the
# decisions all check it, and the services check it again inside their transactions.
DECIDE_PERMISSION = perms.DECIDE


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


def _context(**extra: Any) -> dict[str, Any]:
    # Templates show money with the currency's own number of decimals (5,000 JPY, 12.50 EUR).
    return {"zero_decimal_currencies": ZERO_DECIMAL_CURRENCIES, **extra}


@require_safe
@login_required
@permission_required(DECIDE_PERMISSION, raise_exception=True)
def inbox(request: HtmxHttpRequest) -> HttpResponse:
    context = _context(inbox=proposal_inbox_get(user=request.user, kind=request.GET.get("kind", "")[:32]))
    template = "approvals/_inbox_lists.html" if request.htmx else "approvals/inbox.html"
    response = render(request, template, context)
    # The same address answers with the whole page or only its lists: a cache must tell them apart.
    patch_vary_headers(response, ("HX-Request",))
    return response


@require_safe
@login_required
@permission_required(DECIDE_PERMISSION, raise_exception=True)
def detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    try:
        proposal = proposal_detail_get(action_pk=pk, user=request.user)
    except Action.DoesNotExist as missing:
        raise Http404("There is no such action.") from missing
    return render(request, "approvals/detail.html", _context(detail=proposal, row=proposal.row))


@require_POST
@login_required
@permission_required(DECIDE_PERMISSION, raise_exception=True)
def decide(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    form = DecisionForm(request.POST)
    if not form.is_valid():
        return _refused(request, pk, form_problem(form), status=400)
    if form.cleaned_data["decision"] == Decision.APPROVE:
        stepped_up = _require_step_up(request, pk)
        if stepped_up is not None:
            return stepped_up
    try:
        approval = approval_decide(
            action_pk=pk,
            user=request.user,
            decision=form.cleaned_data["decision"],
            note=form.cleaned_data["note"],
        )
    except Action.DoesNotExist as missing:
        raise Http404("There is no such action.") from missing
    except DecisionRefused as refused:
        return _refused(request, pk, str(refused), status=refused.status)
    action = approval.action
    if approval.decision == Decision.APPROVE:
        assert approval.expires_at is not None
        message = (
            f"Approved {action.action_id} for {action.amount} {action.currency}. It is queued for submission; "
            f"the approval holds for {timeuntil(approval.expires_at)}."
        )
    else:
        message = f"Rejected {action.action_id}. Nothing will be sent to the payment provider."
    return _done(request, pk, message)


@require_POST
@login_required
@permission_required(DECIDE_PERMISSION, raise_exception=True)
def reopen(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    form = ReopenForm(request.POST)
    if not form.is_valid():
        return _refused(request, pk, form_problem(form), status=400)
    try:
        action = action_reopen(action_pk=pk, user=request.user, note=form.cleaned_data["note"])
    except Action.DoesNotExist as missing:
        raise Http404("There is no such action.") from missing
    except DecisionRefused as refused:
        return _refused(request, pk, str(refused), status=refused.status)
    return _done(request, pk, f"Asked for a new decision on {action.action_id}: it is waiting in the inbox again.")


def _require_step_up(request: HtmxHttpRequest, pk: int) -> HttpResponse | None:
    """None when this approval needs no fresh second factor; otherwise the answer that sends
    the manager to confirm a code and back to this proposal."""
    money = Action.objects.filter(pk=pk).values("amount", "currency").first()
    if money is None:
        raise Http404("There is no such action.")
    refusal = step_up_refusal(
        user=request.user,
        amount=money["amount"],
        currency=money["currency"],
        verified_at=step_up_verified_at(request),
        now=time.time(),
    )
    if refusal is None:
        return None
    verify_url = f"{reverse('two-factor-verify')}?{urlencode({'next': reverse('approvals-detail', args=[pk])})}"
    if request.htmx:
        # The row shows why; htmx then takes the browser to the code page.
        response = _row_response(request, pk, level="error", text=refusal, status=403)
        response["HX-Redirect"] = verify_url
        return response
    messages.error(request, f"{refusal} Nothing was changed.")
    return redirect(verify_url)


# --- responses shared by the decisions ------------------------------------------------------


def _row_response(request: HtmxHttpRequest, pk: int, *, level: str, text: str, status: int) -> HttpResponse:
    try:
        row = proposal_row_get(action_pk=pk, user=request.user)
    except Action.DoesNotExist as missing:
        raise Http404("There is no such action.") from missing
    notice = {"level": level, "text": text, "status": status}
    return render(request, "approvals/_proposal_row.html", _context(row=row, notice=notice), status=status)


def _done(request: HtmxHttpRequest, pk: int, message: str) -> HttpResponse:
    if request.htmx:
        return _row_response(request, pk, level="success", text=message, status=200)
    messages.success(request, message)
    return redirect("approvals-inbox")


def _refused(request: HtmxHttpRequest, pk: int, message: str, *, status: int) -> HttpResponse:
    # The services end some refusals with this sentence and not others; the templates add it
    # to every refusal, so it is taken off here to say it once.
    message = message.removesuffix(" Nothing was changed.")
    if request.htmx:
        return _row_response(request, pk, level="error", text=message, status=status)
    # Without JavaScript the inbox is shown again at once, with the refusal on top and its
    # status code on the response; redirecting would hide the code behind a 302.
    messages.error(request, f"{message} Nothing was changed.")
    context = _context(inbox=proposal_inbox_get(user=request.user, kind=request.GET.get("kind", "")[:32]))
    return render(request, "approvals/inbox.html", context, status=status)
