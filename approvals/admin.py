from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.contrib import admin
from django.db import transaction
from django.http import HttpRequest

from actions.admin import CurrencyFilter, ReadOnlyAdmin
from actions.models import SecurityEventKind
from actions.security import security_event_record
from approvals.models import Approval, ApprovalLimit, AutoApprovalCap


@admin.register(Approval)
class ApprovalAdmin(ReadOnlyAdmin):
    """An approval is a record of a decision: it is never added, edited or deleted after the fact."""

    list_display = ("decided_at", "action", "decision", "decided_by_label", "amount", "currency", "expires_at")
    list_filter = ("decision", "policy", CurrencyFilter)
    search_fields = ("action__action_id__exact",)
    search_help_text = "An exact action id."
    list_select_related = ("action",)


def _money(value: Decimal | None) -> str | None:
    return None if value is None else str(value)


@admin.register(ApprovalLimit)
class ApprovalLimitAdmin(admin.ModelAdmin):
    """Limits are validated by the model (positive, an ISO currency the console uses) and every
    change is written to the security trail. Nobody edits their own limit here."""

    list_display = ("user", "currency", "max_amount")
    list_filter = (CurrencyFilter,)
    list_select_related = ("user",)
    search_fields = ("user__username",)
    raw_id_fields = ("user",)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        # A limit belongs to one person and currency; another person's limit is a new row.
        return ("user", "currency") if obj else ()

    def _own(self, request: HttpRequest, obj: Any) -> bool:
        return obj is not None and obj.user_id == request.user.pk

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Raising one's own limit is the first thing an attacker with an admin account tries.
        return not self._own(request, obj) and super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return not self._own(request, obj) and super().has_delete_permission(request, obj)

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        form = super().get_form(request, obj, change=change, **kwargs)
        if obj is None and "user" in form.base_fields:
            # Adding a limit for oneself is refused like editing one's own.
            user_field = form.base_fields["user"]
            user_field.queryset = user_field.queryset.exclude(pk=request.user.pk)  # type: ignore[attr-defined]
        return form

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        before = (
            ApprovalLimit.objects.filter(pk=obj.pk).values_list("max_amount", flat=True).first() if change else None
        )
        with transaction.atomic():
            super().save_model(request, obj, form, change)
            security_event_record(
                kind=SecurityEventKind.APPROVAL_LIMIT_CHANGED,
                user=request.user,
                subject=f"approval limit of {obj.user.get_username()} in {obj.currency}",
                detail={
                    "user": obj.user.get_username(),
                    "currency": obj.currency,
                    "before": _money(before),
                    "after": _money(obj.max_amount),
                },
            )

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        with transaction.atomic():
            security_event_record(
                kind=SecurityEventKind.APPROVAL_LIMIT_DELETED,
                user=request.user,
                subject=f"approval limit of {obj.user.get_username()} in {obj.currency}",
                detail={"user": obj.user.get_username(), "currency": obj.currency, "before": _money(obj.max_amount)},
            )
            super().delete_model(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        for obj in queryset.exclude(user=request.user):
            self.delete_model(request, obj)


@admin.register(AutoApprovalCap)
class AutoApprovalCapAdmin(admin.ModelAdmin):
    """Caps on what the auto-approval policy may approve with no person involved. Every change
    is written to the security trail."""

    list_display = ("scope", "currency", "max_amount", "max_count", "window_hours")
    list_filter = ("scope", CurrencyFilter)

    def _detail(self, obj: AutoApprovalCap) -> dict[str, Any]:
        return {
            "scope": obj.scope,
            "currency": obj.currency,
            "max_amount": _money(obj.max_amount),
            "max_count": obj.max_count,
            "window_hours": obj.window_hours,
        }

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        before = AutoApprovalCap.objects.filter(pk=obj.pk).first() if change else None
        with transaction.atomic():
            super().save_model(request, obj, form, change)
            security_event_record(
                kind=SecurityEventKind.CAP_CHANGED,
                user=request.user,
                subject=f"auto-approval cap {obj.scope} {obj.currency}",
                detail={"before": self._detail(before) if before else None, "after": self._detail(obj)},
            )

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        with transaction.atomic():
            security_event_record(
                kind=SecurityEventKind.CAP_DELETED,
                user=request.user,
                subject=f"auto-approval cap {obj.scope} {obj.currency}",
                detail={"before": self._detail(obj)},
            )
            super().delete_model(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        for obj in queryset:
            self.delete_model(request, obj)
