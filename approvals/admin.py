from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from approvals.models import Approval, ApprovalLimit


@admin.register(Approval)
class ApprovalAdmin(admin.ModelAdmin):
    list_display = ("decided_at", "action", "decision", "decided_by_label", "amount", "currency", "expires_at")
    list_filter = ("decision", "policy", "currency")
    search_fields = ("action__action_id", "decided_by_label")
    list_select_related = ("action",)
    show_full_result_count = False

    # An approval is a record of a decision: it is never edited after the fact.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(ApprovalLimit)
class ApprovalLimitAdmin(admin.ModelAdmin):
    list_display = ("user", "currency", "max_amount")
    list_filter = ("currency",)
    search_fields = ("user__username",)
