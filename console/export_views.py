"""Finance's CSV exports of actions and of the audit trail, by date range.

Open to finance and to admins (who audit; console/roles.py), and to superusers; everyone
else gets 403. A bad range re-renders the form with the reason and a 400, and nothing is
exported.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterable, Iterator

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_safe

from actions.review.exports import (
    ExportRange,
    ExportRangeInvalid,
    actions_export_rows,
    export_range_parse,
    trail_export_rows,
)
from console.roles import ADMIN, FINANCE, user_roles


def may_export(user: object) -> bool:
    return bool(user_roles(user) & {FINANCE, ADMIN}) or bool(getattr(user, "is_superuser", False))


def _refuse_unless_allowed(request: HttpRequest) -> None:
    if not may_export(request.user):
        raise PermissionDenied("Exports are for finance and admins.")


class _Echo:
    """A file-like object whose write returns the line, for csv.writer over a stream."""

    def write(self, value: str) -> str:
        return value


def _stream(rows: Iterable[list[str]]) -> Iterator[str]:
    writer = csv.writer(_Echo())
    for row in rows:
        yield writer.writerow(row)


@require_safe
@login_required
def exports(request: HttpRequest) -> HttpResponse:
    _refuse_unless_allowed(request)
    today = timezone.localdate()
    context = {"start": today.replace(day=1).isoformat(), "end": today.isoformat(), "error": ""}
    return render(request, "console/exports.html", context)


def _csv(request: HttpRequest, name: str, rows: Callable[[ExportRange], Iterable[list[str]]]) -> HttpResponseBase:
    _refuse_unless_allowed(request)
    start, end = request.GET.get("start", ""), request.GET.get("end", "")
    try:
        span = export_range_parse(start, end)
    except ExportRangeInvalid as invalid:
        context = {"start": start, "end": end, "error": str(invalid)}
        return render(request, "console/exports.html", context, status=400)
    response = StreamingHttpResponse(_stream(rows(span)), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{name}_{span.label}.csv"'
    return response


@require_safe
@login_required
def export_actions(request: HttpRequest) -> HttpResponseBase:
    return _csv(request, "actions", actions_export_rows)


@require_safe
@login_required
def export_trail(request: HttpRequest) -> HttpResponseBase:
    return _csv(request, "audit_trail", trail_export_rows)
