"""The manager's pages: the inbox, one proposal in full, and the decisions posted from them.

Each decision form works twice over. With htmx it posts in the background and the response
is the updated row alone, swapped in place. Without JavaScript it is an ordinary POST that
redirects back to the inbox with a message. A refused decision writes nothing and answers with
the refusal's own status code (409 when the action moved on, 403 for a rule), never a 500.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import replace
from decimal import Decimal
from functools import wraps
from typing import Any, TypeVar, cast
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_POST, require_safe
from django_htmx.middleware import HtmxDetails

from actions import permissions as perms
from actions.kinds import kind_for
from actions.models import Action
from actions.models.actions import TERMINAL_STATUSES
from actions.plain import action_words, without_status_codes
from approvals.forms import DecisionForm, GroupDecisionForm, ReopenForm, form_problem, page_version
from approvals.models import Decision, RejectionReason
from approvals.selectors.decided import decided_list_get
from approvals.selectors.inbox import (
    inbox_group_get,
    inbox_group_key,
    proposal_detail_get,
    proposal_inbox_get,
    proposal_row_get,
)
from approvals.selectors.timeline import action_outcome_get
from approvals.services import (
    CHANGED_SINCE_SHOWN,
    DecisionRefused,
    action_reopen,
    approval_decide,
    approval_decide_group,
    rejection_commit,
    rejection_request,
    rejection_undo,
    rejections_commit_due,
)
from approvals.step_up import step_up_refusal, step_up_verified_at

# The manager role is whoever holds this permission: the inbox, the detail page and the
# decisions all check it, and the services check it again inside their transactions.
DECIDE_PERMISSION = perms.DECIDE


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


View = TypeVar("View", bound=Callable[..., HttpResponse])


def _manager(method_check: Callable[[View], View], *, one_action: bool = False) -> Callable[[View], View]:
    """A manager's page or decision: the HTTP method checked, a signed-in user holding
    DECIDE_PERMISSION, and, for a view of ``one_action`` (its ``pk``), an action that does not
    exist (or that the user may not see, as the selectors answer) is a 404."""

    def decorate(view: View) -> View:
        if one_action:
            view = _missing_action_is_404(view)
        return method_check(login_required(permission_required(DECIDE_PERMISSION, raise_exception=True)(view)))

    return decorate


def _missing_action_is_404(view: View) -> View:
    @wraps(view)
    def guarded(*args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return view(*args, **kwargs)
        except Action.DoesNotExist as missing:
            raise Http404("There is no such action.") from missing

    return cast(View, guarded)


def _context(**extra: Any) -> dict[str, Any]:
    return {
        "rejection_reasons": RejectionReason.choices,
        "sort_choices": [("age", "Oldest first"), ("-age", "Newest first"), ("amount", "Largest amount first")],
        **extra,
    }


@_manager(require_safe)
def inbox(request: HtmxHttpRequest) -> HttpResponse:
    # Rejections whose undo window passed are committed before listing: a lost task never
    # leaves one hanging where the manager looks.
    rejections_commit_due()
    context = _context(inbox=_inbox_get(request))
    template = "approvals/_inbox_lists.html" if request.htmx else "approvals/inbox.html"
    response = render(request, template, context)
    # The same address answers with the whole page or only its lists: a cache must tell them apart.
    patch_vary_headers(response, ("HX-Request",))
    return response


@_manager(require_safe, one_action=True)
def detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    proposal = proposal_detail_get(action_pk=pk, user=request.user)
    rejection_commit(action_pk=pk)
    _, steps = action_outcome_get(action_pk=pk, user=request.user)
    return render(request, "approvals/detail.html", _context(detail=proposal, row=proposal.row, steps=steps))


@_manager(require_POST, one_action=True)
def decide(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    form = DecisionForm(request.POST)
    if not form.is_valid():
        return _refused(request, pk, form_problem(form), status=400)
    if form.cleaned_data["decision"] == Decision.REJECT:
        return _reject(request, pk, form)
    stepped_up = _require_step_up(request, pk)
    if stepped_up is not None:
        return stepped_up
    try:
        approval = approval_decide(
            action_pk=pk,
            user=request.user,
            decision=Decision.APPROVE,
            note=form.cleaned_data["note"],
            shown=form.shown(),
        )
    except DecisionRefused as refused:
        return _refused_decision(request, pk, refused)
    action = approval.action
    assert approval.expires_at is not None
    message = (
        f"Approved: {action_words(action)}. It is on its way to the "
        f"{_receiver(action)}; this card shows the result as soon as it is known."
    )
    return _done(request, pk, message)


def _receiver(action: Action) -> str:
    return kind_for(action.kind).contract().receiver


def _reject(request: HtmxHttpRequest, pk: int, form: DecisionForm) -> HttpResponse:
    """A rejection with its reason, committed after the undo window (approvals.services)."""
    try:
        pending = rejection_request(
            action_pk=pk,
            user=request.user,
            reason_code=form.cleaned_data["reason_code"],
            note=form.cleaned_data["note"],
            shown=form.shown(),
        )
    except DecisionRefused as refused:
        return _refused_decision(request, pk, refused)
    seconds = settings.REJECTION_UNDO_SECONDS
    return _done(
        request,
        pk,
        f"Rejecting {action_words(pending.action)} ({pending.get_reason_code_display().lower()}). It takes effect in "
        f"{seconds} seconds; until then you can undo it.",
    )


@_manager(require_POST, one_action=True)
def undo_reject(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    try:
        action = rejection_undo(action_pk=pk, user=request.user)
    except DecisionRefused as refused:
        return _refused(request, pk, str(refused), status=refused.status)
    return _done(request, pk, f"Rejection undone: {action_words(action)} is waiting for a decision again.")


@_manager(require_safe, one_action=True)
def row(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """The card as it is now: what a card following its action polls. A pending rejection whose
    window has passed is committed here too. When the action has just become final, a toast says
    how it ended (``was`` is the status the card showed)."""
    rejection_commit(action_pk=pk)
    proposal = proposal_row_get(action_pk=pk, user=request.user)
    # The card's poll names the version its page showed: its forms keep posting that one.
    proposal = replace(proposal, page_version=page_version(request.GET.get("shown_version")))
    template = "approvals/_decided_status.html" if request.GET.get("as") == "status" else "approvals/_proposal_row.html"
    response = render(request, template, _context(row=proposal))
    _toast_if_final(response, proposal.action, was=request.GET.get("was", ""))
    return response


@_manager(require_safe)
def group_summary(request: HtmxHttpRequest, key: str) -> HttpResponse:
    """One group's money line as it is now: the line asks for it when an action of its group
    has become final. ``shown`` names the proposals the card shows, decided ones included."""
    shown = [int(pk) for pk in request.GET.getlist("shown")[:200] if pk.isdigit()]
    group = inbox_group_get(user=request.user, key=key[:40], decided_pks=shown)
    if group is None:
        return HttpResponse(status=204)
    return render(request, "approvals/_group_summary.html", _context(group=group))


@_manager(require_safe, one_action=True)
def outcome(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """The detail page's live part: the card and the outcome timeline, polled until final."""
    rejection_commit(action_pk=pk)
    proposal, steps = action_outcome_get(action_pk=pk, user=request.user)
    # The card on the same page polls too and raises the toast; this part only redraws.
    return render(request, "approvals/_outcome.html", _context(row=proposal, steps=steps))


def _toast_if_final(response: HttpResponse, action: Action, *, was: str) -> None:
    if not was or was == action.status or action.status not in TERMINAL_STATUSES:
        return
    if action.status == "SUCCEEDED":
        level = "success"
        text = f"{action_words(action)}: succeeded."
    elif action.status == "REJECTED":
        level, text = "info", f"{action_words(action)}: rejected. Nothing was sent."
    else:
        level, text = "error", f"{action_words(action)}: {action.get_status_display().lower()}. Open it to see why."
    # Besides the toast, the parts of the page that show money and counts follow the outcome:
    # its group's money line ("consoleOutcome-<group key>") and the navigation's count.
    response["HX-Trigger"] = json.dumps(
        {
            "consoleToast": {"level": level, "text": text},
            "consoleOutcome": {},
            f"consoleOutcome-{inbox_group_key(action)}": {},
        }
    )


@_manager(require_safe)
def decided(request: HtmxHttpRequest) -> HttpResponse:
    """The manager's own decisions and how each ended."""
    rejections_commit_due()
    history = decided_list_get(
        user=request.user,
        today=request.GET.get("today") == "1",
        status=request.GET.get("status", "")[:16],
        kind=request.GET.get("kind", "")[:32],
        decision=request.GET.get("decision", "")[:16],
        page=request.GET.get("page", "1")[:9],
    )
    return render(request, "approvals/decided.html", _context(decided=history))


@_manager(require_POST)
def decide_group(request: HtmxHttpRequest) -> HttpResponse:
    """Approve the ticked proposals on one order (or bill) as one decision."""
    form = GroupDecisionForm(request.POST)
    key = request.POST.get("group", "")[:40]
    if not form.is_valid():
        return _group_answer(request, key, [], level="error", text=form_problem(form), status=400)
    pks = form.cleaned_data["action_pks"]
    stepped_up = _require_step_up_total(request, pks)
    if stepped_up is not None:
        return stepped_up
    try:
        result = approval_decide_group(
            action_pks=pks, user=request.user, note=form.cleaned_data["note"], shown=form.cleaned_data["shown"]
        )
    except Action.DoesNotExist as missing:
        raise Http404("One of these proposals does not exist.") from missing
    except DecisionRefused as refused:
        return _group_answer(
            request,
            key,
            [],
            level="error",
            text=str(refused),
            status=refused.status,
            reload=refused.code == CHANGED_SINCE_SHOWN,
        )
    group = result.group
    text = (
        f"Approved {group.size} proposals together for {group.total_amount} {group.currency}, as one decision. "
        "Each card shows its result as soon as it is known."
    )
    return _group_answer(request, key, pks, level="success", text=text, status=200)


def _group_answer(
    request: HtmxHttpRequest,
    key: str,
    decided_pks: list[int],
    *,
    level: str,
    text: str,
    status: int,
    reload: bool = False,
) -> HttpResponse:
    text = without_status_codes(text.removesuffix(" Nothing was changed."))
    reload_url = _reload_url(request, fallback=reverse("approvals-inbox")) if reload else ""
    if not request.htmx:
        (messages.success if level == "success" else messages.error)(
            request, text if level == "success" else f"{text} Nothing was changed."
        )
        if level == "success":
            return redirect(f"{reverse('approvals-decided')}?today=1")
        context = _context(inbox=_inbox_get(request), reload_url=reload_url)
        return render(request, "approvals/inbox.html", context, status=status)
    group = inbox_group_get(user=request.user, key=key, decided_pks=decided_pks) if key else None
    notice = {"level": level, "text": text, "status": status, "reload_url": reload_url}
    if group is None:
        return HttpResponse(status=204)
    response = render(request, "approvals/_inbox_group.html", _context(group=group, group_notice=notice), status=status)
    if level == "success":
        response["HX-Trigger"] = json.dumps({"consoleDecided": {}})
    return response


def _step_up_refusal(request: HtmxHttpRequest, amount: Decimal, currency: str) -> str | None:
    """Why deciding this amount needs a fresh second factor first, or None."""
    return step_up_refusal(
        user=request.user, amount=amount, currency=currency, verified_at=step_up_verified_at(request), now=time.time()
    )


def _step_up_url(*, back_to: str) -> str:
    """The page that asks for a code, and then leads back to ``back_to``."""
    return f"{reverse('two-factor-verify')}?{urlencode({'next': back_to})}"


def _require_step_up_total(request: HtmxHttpRequest, pks: list[int]) -> HttpResponse | None:
    """A grouped decision needs a fresh second factor when its sum would need one."""
    rows = list(Action.objects.filter(pk__in=pks).values_list("amount", "currency"))
    if not rows or len({currency for _, currency in rows}) != 1:
        return None  # the service refuses mixed or missing proposals with its own words
    refusal = _step_up_refusal(request, sum((amount for amount, _ in rows), Decimal("0")), rows[0][1])
    if refusal is None:
        return None
    verify_url = _step_up_url(back_to=reverse("approvals-inbox"))
    if request.htmx:
        response = HttpResponse(status=204)
        response["HX-Redirect"] = verify_url
        return response
    messages.error(request, f"{refusal} Nothing was changed.")
    return redirect(verify_url)


@_manager(require_POST, one_action=True)
def reopen(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    form = ReopenForm(request.POST)
    if not form.is_valid():
        return _refused(request, pk, form_problem(form), status=400)
    try:
        action = action_reopen(action_pk=pk, user=request.user, note=form.cleaned_data["note"])
    except DecisionRefused as refused:
        return _refused(request, pk, str(refused), status=refused.status)
    return _done(request, pk, f"Asked for a new decision on {action_words(action)}: it is waiting in the inbox again.")


def _require_step_up(request: HtmxHttpRequest, pk: int) -> HttpResponse | None:
    """None when this approval needs no fresh second factor; otherwise the answer that sends
    the manager to confirm a code and back to this proposal."""
    money = Action.objects.filter(pk=pk).values("amount", "currency").first()
    if money is None:
        raise Http404("There is no such action.")
    refusal = _step_up_refusal(request, money["amount"], money["currency"])
    if refusal is None:
        return None
    verify_url = _step_up_url(back_to=reverse("approvals-detail", args=[pk]))
    if request.htmx:
        # The row shows why; htmx then takes the browser to the code page.
        response = _row_response(request, pk, level="error", text=refusal, status=403)
        response["HX-Redirect"] = verify_url
        return response
    messages.error(request, f"{refusal} Nothing was changed.")
    return redirect(verify_url)


# --- responses shared by the decisions ------------------------------------------------------


def _row_response(
    request: HtmxHttpRequest, pk: int, *, level: str, text: str, status: int, reload_url: str = ""
) -> HttpResponse:
    # Only called by views of one action: their _manager(one_action=True) makes a missing one a 404.
    row = proposal_row_get(action_pk=pk, user=request.user)
    # The card is drawn anew, the rest of the page (the order's money, the other proposals) is
    # not: its forms keep posting the version the page showed. Without that version the card
    # cannot tell how old the page around it is, and offers a reload instead of its buttons, as
    # it does with ``reload_url``.
    shown_version = page_version(request.POST.get("shown_version"))
    if not shown_version and not reload_url:
        reload_url = _reload_url(request, fallback=reverse("approvals-detail", args=[pk]))
    row = replace(row, page_version=shown_version)
    notice = {"level": level, "text": text, "status": status, "reload_url": reload_url}
    return render(request, "approvals/_proposal_row.html", _context(row=row, notice=notice), status=status)


def _done(request: HtmxHttpRequest, pk: int, message: str) -> HttpResponse:
    if request.htmx:
        response = _row_response(request, pk, level="success", text=message, status=200)
        # The navigation's count of waiting proposals has changed: it reads itself anew.
        response["HX-Trigger"] = json.dumps({"consoleDecided": {}})
        return response
    messages.success(request, message)
    return redirect("approvals-inbox")


def _refused_decision(request: HtmxHttpRequest, pk: int, refused: DecisionRefused) -> HttpResponse:
    """A refused decision; one made on a page older than the proposal offers to reload it."""
    return _refused(request, pk, str(refused), status=refused.status, reload=refused.code == CHANGED_SINCE_SHOWN)


def _refused(request: HtmxHttpRequest, pk: int, message: str, *, status: int, reload: bool = False) -> HttpResponse:
    # The services end some refusals with this sentence and not others; the templates add it
    # to every refusal, so it is taken off here to say it once.
    message = without_status_codes(message.removesuffix(" Nothing was changed."))
    reload_url = _reload_url(request, fallback=reverse("approvals-inbox")) if reload else ""
    if request.htmx:
        return _row_response(request, pk, level="error", text=message, status=status, reload_url=reload_url)
    # Without JavaScript the inbox is shown again at once, with the refusal on top and its
    # status code on the response; redirecting would hide the code behind a 302.
    messages.error(request, f"{message} Nothing was changed.")
    context = _context(inbox=_inbox_get(request), reload_url=reload_url)
    return render(request, "approvals/inbox.html", context, status=status)


def _reload_url(request: HtmxHttpRequest, *, fallback: str) -> str:
    """The page the manager decided on (htmx names it), to load again; only a path on this
    site, never another origin's address from a header."""
    if request.htmx and request.htmx.current_url_abs_path:
        return request.htmx.current_url_abs_path
    return fallback


def _inbox_get(request: HttpRequest) -> Any:
    return proposal_inbox_get(
        user=request.user,
        kind=request.GET.get("kind", "")[:32],
        sort=request.GET.get("sort", "age")[:8],
        page=request.GET.get("page", "1")[:9],
    )
