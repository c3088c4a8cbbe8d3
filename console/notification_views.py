"""The person's own notifications: the list the bell in the navigation opens, and marking
them read. Each query is limited to the signed-in person's rows: someone else's notification
answers 404, as one that does not exist."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST, require_safe

from actions.models import Notification
from actions.notifications import notification_mark_read, notifications_mark_all_read

PER_PAGE = 50


@require_safe
@login_required
def notification_list(request: HttpRequest) -> HttpResponse:
    mine = Notification.objects.filter(recipient_id=request.user.pk)
    show = "unread" if request.GET.get("show") == "unread" else "all"
    if show == "unread":
        mine = mine.filter(read_at__isnull=True)
    page = Paginator(mine, PER_PAGE).get_page(request.GET.get("page"))
    return render(request, "console/notifications.html", {"page": page, "show": show})


@require_POST
@login_required
def notification_read(request: HttpRequest, pk: int) -> HttpResponse:
    if not notification_mark_read(user=request.user, pk=pk):
        raise Http404("You have no such notification.")
    # "Open" marks it read and goes on to the item; "Mark read" stays on the list.
    if request.POST.get("open"):
        link = Notification.objects.get(pk=pk, recipient_id=request.user.pk).link
        # Links are the console's own paths; anything else is not followed.
        if url_has_allowed_host_and_scheme(link, allowed_hosts=None):
            return redirect(link)
    return redirect("notifications")


@require_POST
@login_required
def notification_read_all(request: HttpRequest) -> HttpResponse:
    notifications_mark_all_read(user=request.user)
    return redirect("notifications")
