"""Finance's pages: the review queue, one action's whole story, a remedy or a discrepancy, and the
changes posted from them.

Each change works twice over, like the manager's pages. With htmx it posts in the background and
the answer is the part of the page it changed (the queue's table, or the detail), with a notice
saying what happened. Without JavaScript it is an ordinary POST that redirects back with a
message. A refused change writes nothing to the action or the order and answers with the
refusal's own status code (400 bad input, 403 a rule about who may act, 409 the state or the
provider's live answer does not allow it), never a 500.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.cache import patch_vary_headers
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST, require_safe
from django_htmx.middleware import HtmxDetails

from actions import permissions as perms
from actions.engine import resolutions
from actions.engine.resolution_checks import ReviewRefused
from actions.evidence.bundle import evidence_bundle_signed, evidence_file_name, evidence_json, evidence_page_context
from actions.foundation.separation import follow_up_admin_refusal
from actions.foundation.text import unsafe_characters, unsafe_characters_message
from actions.kinds.five_checks import kind_cards
from actions.models import Action, Discrepancy, Remedy, Workflow, WorkflowEvent, WorkflowState
from actions.plain import without_status_codes
from actions.review import services as finance
from actions.review.selectors.common import STATE_CHOICES, ItemKind, attempt_summary, may_view_review
from actions.review.selectors.detail import follow_up_detail_get, review_action_detail_get
from actions.review.selectors.queue import BadCursor, QueueFilters, cursor_decode, review_queue_get
from actions.review.services import REMEDY_CHOICES
from actions.workflows.services import workflow_summary


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


class QueueFilterForm(forms.Form):
    """The queue's filters, read from the query string so that they survive a refresh."""

    mine = forms.BooleanField(required=False)
    unassigned = forms.BooleanField(required=False)
    overdue = forms.BooleanField(required=False)
    state = forms.ChoiceField(choices=[("", "Any state"), *STATE_CHOICES], required=False)
    kind = forms.ChoiceField(choices=[("", "Every kind"), *ItemKind.CHOICES], required=False)


RESOLUTIONS = ("succeeded", "retry", "failed", "resend")


def _context(**extra: Any) -> dict[str, Any]:
    return {
        "state_choices": STATE_CHOICES,
        "kind_choices": ItemKind.CHOICES,
        "remedy_choices": [(choice.value, choice.label) for choice in REMEDY_CHOICES],
        **extra,
    }


def _require_view(request: HttpRequest) -> None:
    # Finance works the queue; admins may read it. Everyone else gets the friendly 403 page.
    if not may_view_review(request.user):
        raise PermissionDenied("The review queue is for finance.")


# Free-text fields the review forms post: what a person types for the trail.
FREE_TEXT_FIELDS = ("note", "reason", "provider_reference")


def _refuse_unsafe_text(request: HttpRequest) -> None:
    # Control and bidirectional-override characters let a note read differently from what is
    # stored (actions/foundation/text.py); refused with the field named, before any service runs.
    for field in FREE_TEXT_FIELDS:
        codes = unsafe_characters(request.POST.get(field, ""))
        if codes:
            raise ReviewRefused(unsafe_characters_message(codes), code="invalid_characters", status=400, field=field)


def _refuse_admin_follow_up(request: HttpRequest) -> None:
    # Admins may read and reassign follow-ups, never advance them (separation of duties). The
    # admin role no longer holds the permissions either; this holds for superusers too.
    refusal = follow_up_admin_refusal(user=request.user)
    if refusal:
        raise ReviewRefused(refusal, code="separation_of_duties", status=403)


def _filters(data: QueryDict) -> tuple[QueueFilters, str]:
    """The filters in ``data``; a bad value is dropped and named, never an error page."""
    form = QueueFilterForm(data)
    form.is_valid()
    data_ok = form.cleaned_data
    filters = QueueFilters(
        mine=bool(data_ok.get("mine")),
        unassigned=bool(data_ok.get("unassigned")),
        overdue=bool(data_ok.get("overdue")),
        state=str(data_ok.get("state") or ""),
        kind=str(data_ok.get("kind") or ""),
    )
    problems = [f"{name}: {' '.join(str(e) for e in errors)}" for name, errors in form.errors.items()]
    problem = ""
    if problems:
        problem = "That filter was ignored. " + "; ".join(problems)
    return filters, problem


def _query_of(next_url: str) -> QueryDict:
    return QueryDict(urlsplit(next_url).query)


def _safe_next(request: HttpRequest, default: str) -> str:
    candidate = request.POST.get("next", "")
    if candidate and url_has_allowed_host_and_scheme(candidate, allowed_hosts={request.get_host()}):
        return candidate
    return default


def _form_name(request: HttpRequest) -> str:
    """Which of the detail page's forms was sent (the names _form_notice.html is given)."""
    match = request.resolver_match
    name = match.url_name if match is not None else ""
    if name == "review-action-resolve":
        resolution = request.POST.get("resolution", "")
        return f"resolve-{resolution}" if resolution in ("succeeded", "resend", "retry", "failed") else ""
    return {"review-action-lookup": "lookup", "review-action-escalate": "escalate"}.get(name or "", "")


def _notice(level: str, text: str, status: int) -> dict[str, Any]:
    return {"level": level, "text": text, "status": status}


# --- the queue ---------------------------------------------------------------------------------


def _queue_context(request: HttpRequest, filters: QueueFilters, after: str = "", **extra: Any) -> dict[str, Any]:
    # Workflows that wait for a person: paused on an unknown step, compensating with a
    # compensation under review, or failed. Each names its owner.
    waiting_workflows = (
        Workflow.objects.filter(state__in=[WorkflowState.PAUSED, WorkflowState.FAILED, WorkflowState.COMPENSATING])
        .exclude(state=WorkflowState.COMPENSATING, owner__isnull=True)
        .select_related("owner")
        .order_by("updated_at")[:100]
    )
    return _context(
        queue=review_queue_get(user=request.user, filters=filters, after=after),
        waiting_workflows=waiting_workflows,
        **extra,
    )


@require_safe
@login_required
def queue(request: HtmxHttpRequest) -> HttpResponse:
    _require_view(request)
    filters, problem = _filters(request.GET)
    after = request.GET.get("after", "")
    try:
        cursor_decode(after) if after else None
    except BadCursor as bad:
        # A mangled page link shows the first page and says so, never an error page.
        after = ""
        problem = f"{problem} {bad}.".strip() if problem else f"That page was ignored. {bad}."
    notice = _notice("error", problem, 400) if problem else None
    template = "actions/_queue_table.html" if request.htmx else "actions/queue.html"
    response = render(
        request, template, _queue_context(request, filters, after, notice=notice), status=400 if problem else 200
    )
    if request.htmx.trigger == "queue-filters":
        # The filters changed: put them in the address bar (without empty ones), so a reload,
        # a bookmark or the back button shows the same queue.
        response["HX-Push-Url"] = reverse("review-queue") + filters.query
    # The same address answers with the whole page or only its table: a cache must tell them apart.
    patch_vary_headers(response, ("HX-Request",))
    return response


# --- one action ----------------------------------------------------------------------------------


def _detail_context(request: HttpRequest, pk: int, **extra: Any) -> dict[str, Any]:
    try:
        detail = review_action_detail_get(action_pk=pk, user=request.user)
    except Action.DoesNotExist as missing:
        raise Http404("There is no such action.") from missing
    return _context(detail=detail, action=detail.action, **extra)


@require_safe
@login_required
def action_detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    _require_view(request)
    template = "actions/_action_detail.html" if request.htmx else "actions/action_detail.html"
    return render(request, template, _detail_context(request, pk))


@require_safe
@login_required
def action_evidence(request: HttpRequest, pk: int) -> HttpResponse:
    """The action's evidence bundle (docs/evidence.md): its readable face, or with ?format=json
    the signed file that tools/verify_evidence.py checks. For those who may read the review
    queue (finance, admins); others get the 403 page."""
    _require_view(request)
    if not Action.objects.filter(pk=pk).exists():
        raise Http404("No such action.")
    try:
        bundle = evidence_bundle_signed(action_pk=pk)
    except ImproperlyConfigured as unsigned:
        # A bundle is worth nothing unsigned: say why there is none, rather than fail.
        return render(
            request,
            "actions/evidence_unavailable.html",
            {"reason": str(unsigned), "action_pk": pk},
            status=503,
        )
    if request.GET.get("format") == "json":
        response = HttpResponse(evidence_json(bundle), content_type="application/json")
        response["Content-Disposition"] = f'attachment; filename="{evidence_file_name(bundle)}.json"'
        return response
    return render(request, "actions/evidence.html", evidence_page_context(bundle))


# --- answers shared by every change -------------------------------------------------------------


def _answer(
    request: HtmxHttpRequest, *, origin: str, kind: str, pk: int, level: str, text: str, status: int
) -> HttpResponse:
    """Show the outcome where the form was: the queue's table, an action's detail, or a follow-up."""
    notice = _notice(level, without_status_codes(text), status)
    if level == "error":
        # A refusal is shown beside the form that was sent, where the person is looking; a
        # success changes the page, and is said at its top.
        notice["form"] = _form_name(request)
    if origin == "queue":
        if request.htmx:
            filters, _ = _filters(request.POST)
            return render(
                request, "actions/_queue_table.html", _queue_context(request, filters, notice=notice), status=status
            )
        next_url = _safe_next(request, reverse("review-queue"))
        if level == "success":
            messages.success(request, text)
            return redirect(next_url)
        filters, _ = _filters(_query_of(next_url))
        return render(request, "actions/queue.html", _queue_context(request, filters, notice=notice), status=status)
    if kind == ItemKind.ACTION:
        if request.htmx:
            return render(
                request, "actions/_action_detail.html", _detail_context(request, pk, notice=notice), status=status
            )
        if level == "success":
            messages.success(request, text)
            return redirect("review-action", pk=pk)
        return render(request, "actions/action_detail.html", _detail_context(request, pk, notice=notice), status=status)
    context = _follow_up_context(request, kind, pk, notice=notice)
    if request.htmx:
        return render(request, "actions/_follow_up_detail.html", context, status=status)
    if level == "success":
        messages.success(request, text)
        return redirect(f"review-{kind}", pk=pk)
    return render(request, "actions/follow_up_detail.html", context, status=status)


def _refused(request: HtmxHttpRequest, refused: ReviewRefused, *, kind: str, pk: int) -> HttpResponse:
    if refused.status == 404:
        raise Http404(str(refused))
    text = str(refused)
    if refused.code == "provider_disagrees":
        text += " The provider's answer is kept in the timeline."
    return _answer(request, origin=_origin(request), kind=kind, pk=pk, level="error", text=text, status=refused.status)


def _origin(request: HttpRequest) -> str:
    return "queue" if request.POST.get("origin") == "queue" else "detail"


def _done(request: HtmxHttpRequest, text: str, *, kind: str, pk: int) -> HttpResponse:
    return _answer(request, origin=_origin(request), kind=kind, pk=pk, level="success", text=text, status=200)


# --- changes to an action -------------------------------------------------------------------------


def _posted_change(kind: str) -> Callable[[Callable[[HtmxHttpRequest, int], str]], Callable[..., HttpResponse]]:
    """A change posted from a review page, answered where the form was.

    The decorated function calls one service and says what it did, in the clerk's words; a
    refusal is shown beside the form instead. Unsafe free text is refused before it runs."""

    def decorate(change: Callable[[HtmxHttpRequest, int], str]) -> Callable[..., HttpResponse]:
        @require_POST
        @login_required
        @functools.wraps(change)
        def view(request: HtmxHttpRequest, pk: int) -> HttpResponse:
            _require_view(request)
            try:
                _refuse_unsafe_text(request)
                text = change(request, pk)
            except ReviewRefused as refused:
                return _refused(request, refused, kind=kind, pk=pk)
            return _done(request, text, kind=kind, pk=pk)

        return view

    return decorate


def _assignment(request: HttpRequest) -> dict[str, Any]:
    """What an assign form posts: the new owner and a note. "Assign to me" sends no owner (the
    person sending it); Reassign always sends one, blank if nobody was chosen."""
    return {"user": request.user, "owner_pk": request.POST.get("owner"), "note": request.POST.get("note", "")}


def _belongs_to(what: str, owner: Any) -> str:
    # An assignment always leaves an owner: a form that names none means the person who sent it.
    assert owner is not None
    return f"{what} now belongs to {owner.get_username()}."


def _advance(request: HttpRequest) -> dict[str, Any]:
    """What a follow-up's advance form posts. Admins may not advance a follow-up."""
    _refuse_admin_follow_up(request)
    return {"user": request.user, "to_status": request.POST.get("status", ""), "note": request.POST.get("note", "")}


@_posted_change(ItemKind.ACTION)
def action_assign(request: HtmxHttpRequest, pk: int) -> str:
    action = finance.action_assign(action_pk=pk, **_assignment(request))
    return _belongs_to(action.action_id, action.owner)


@_posted_change(ItemKind.ACTION)
def action_lookup(request: HtmxHttpRequest, pk: int) -> str:
    result = resolutions.action_lookup(action_pk=pk, user=request.user)
    return f"The provider answered: {attempt_summary(result.attempt)}"


@_posted_change(ItemKind.ACTION)
def action_resolve(request: HtmxHttpRequest, pk: int) -> str:
    resolution = request.POST.get("resolution", "")
    reason = request.POST.get("reason", "")
    if resolution == "succeeded":
        result = resolutions.action_resolve_succeeded(
            action_pk=pk,
            user=request.user,
            provider_reference=request.POST.get("provider_reference", ""),
            reason=reason,
            evidence=request.POST.get("evidence", ""),
        )
    elif resolution in ("resend", "retry"):
        resolve = resolutions.action_resolve_resend if resolution == "resend" else resolutions.action_resolve_retry
        result = resolve(action_pk=pk, user=request.user, reason=reason)
    elif resolution == "failed":
        result = resolutions.action_resolve_failed(
            action_pk=pk,
            user=request.user,
            reason=reason,
            remedy_kind=request.POST.get("remedy_kind", ""),
            expected_amount=request.POST.get("expected_amount", ""),
        )
    else:
        raise ReviewRefused(
            f"resolution: choose one of {', '.join(RESOLUTIONS)}.", code="invalid", status=400, field="resolution"
        )
    return result.message


@_posted_change(ItemKind.ACTION)
def action_escalate(request: HtmxHttpRequest, pk: int) -> str:
    action = resolutions.action_escalate_to_user(action_pk=pk, user=request.user, reason=request.POST.get("reason", ""))
    return f"{action.action_id} needs review now and belongs to you; reconciliation stopped polling it."


# --- remedies and discrepancies ------------------------------------------------------------------


def _follow_up_context(request: HttpRequest, kind: str, pk: int, **extra: Any) -> dict[str, Any]:
    try:
        detail = follow_up_detail_get(kind=kind, pk=pk, user=request.user)
    except (Remedy.DoesNotExist, Discrepancy.DoesNotExist) as missing:
        raise Http404(f"There is no such {kind}.") from missing
    return _context(follow_up=detail, **extra)


def _follow_up_page(request: HtmxHttpRequest, kind: str, pk: int) -> HttpResponse:
    _require_view(request)
    template = "actions/_follow_up_detail.html" if request.htmx else "actions/follow_up_detail.html"
    return render(request, template, _follow_up_context(request, kind, pk))


@require_safe
@login_required
def remedy_detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    return _follow_up_page(request, ItemKind.REMEDY, pk)


@require_safe
@login_required
def discrepancy_detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    return _follow_up_page(request, ItemKind.DISCREPANCY, pk)


@_posted_change(ItemKind.REMEDY)
def remedy_assign(request: HtmxHttpRequest, pk: int) -> str:
    remedy = finance.remedy_assign(remedy_pk=pk, **_assignment(request))
    return _belongs_to("The remedy", remedy.owner)


@_posted_change(ItemKind.DISCREPANCY)
def discrepancy_assign(request: HtmxHttpRequest, pk: int) -> str:
    discrepancy = finance.discrepancy_assign(discrepancy_pk=pk, **_assignment(request))
    return _belongs_to("The discrepancy", discrepancy.owner)


@_posted_change(ItemKind.REMEDY)
def remedy_advance(request: HtmxHttpRequest, pk: int) -> str:
    remedy = finance.remedy_advance(
        remedy_pk=pk, remedy_kind=request.POST.get("remedy_kind") or None, **_advance(request)
    )
    return f"The remedy is {remedy.get_status_display().lower()}."


@_posted_change(ItemKind.DISCREPANCY)
def discrepancy_advance(request: HtmxHttpRequest, pk: int) -> str:
    discrepancy = finance.discrepancy_advance(discrepancy_pk=pk, **_advance(request))
    return f"The discrepancy is {discrepancy.get_status_display().lower()}."


@require_safe
@login_required
def kinds(request: HttpRequest) -> HttpResponse:
    """The five checks for every kind of effect, for finance and admins."""
    _require_view(request)
    return render(request, "actions/kinds.html", {"cards": kind_cards()})


# --- workflows -------------------------------------------------------------------------------


@require_safe
@login_required
def workflow_timeline(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """One workflow as a timeline: its steps with their child actions and compensations, and its
    trail. For finance (who owns paused and failed ones) and for managers (who approved it)."""
    if not (may_view_review(request.user) or request.user.has_perm(perms.DECIDE)):
        raise PermissionDenied("Workflows are for finance and managers.")
    workflow = Workflow.objects.select_related("owner").filter(pk=pk).first()
    if workflow is None:
        raise Http404("There is no such workflow.")
    events = WorkflowEvent.objects.filter(workflow=workflow).order_by("created_at", "pk")
    return render(
        request,
        "actions/workflow_timeline.html",
        {"workflow": workflow, "summary": workflow_summary(workflow), "events": events},
    )
