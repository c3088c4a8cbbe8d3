"""The search page and the order page, for everyone who works with actions (managers, finance,
accounts payable, admins). Each person sees only what their role may see (actions.search)."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_safe

from actions.models import Order
from actions.orders.selectors import order_page_get
from actions.review.views import HtmxHttpRequest
from actions.search import may_search, may_search_everything, search


@require_safe
@login_required
def search_view(request: HttpRequest) -> HttpResponse:
    if not may_search(request.user):
        raise PermissionDenied("Searching is for the people who work with actions.")
    results = search(user=request.user, raw=request.GET.get("q", ""))
    context = {"results": results, "q": results.term}
    # A search too short or malformed is named on the page with a 400, never an error page.
    return render(request, "console/search.html", context, status=400 if results.problem else 200)


@require_safe
@login_required
def order_detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    if not may_search_everything(request.user):
        raise PermissionDenied("The order page is for managers, finance, accounts payable and admins.")
    try:
        page = order_page_get(order_pk=pk, user=request.user)
    except Order.DoesNotExist as missing:
        raise Http404("There is no such order.") from missing
    context = {"page": page, "order": page.order, "poll_seconds": settings.LIVE_POLL_SECONDS}
    # The live part reads itself anew while an action on the order is under way.
    template = "console/_order_live.html" if request.htmx else "console/order.html"
    return render(request, template, context)
