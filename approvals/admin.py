from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from actions.admin import CurrencyFilter, ReadOnlyAdmin
from approvals.models import Approval, ApprovalLimit


@admin.register(Approval)
class ApprovalAdmin(ReadOnlyAdmin):
    """An approval is a record of a decision: it is never added, edited or deleted after the fact."""

    list_display = ("decided_at", "action", "decision", "decided_by_label", "amount", "currency", "expires_at")
    list_filter = ("decision", "policy", CurrencyFilter)
    search_fields = ("action__action_id__exact",)
    search_help_text = "An exact action id."
    list_select_related = ("action",)


@admin.register(ApprovalLimit)
class ApprovalLimitAdmin(admin.ModelAdmin):
    list_display = ("user", "currency", "max_amount")
    list_filter = (CurrencyFilter,)
    list_select_related = ("user",)
    search_fields = ("user__username",)
    raw_id_fields = ("user",)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        # A limit belongs to one person and currency; another person's limit is a new row.
        return ("user", "currency") if obj else ()
