from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

from actions.admin.base import CurrencyFilter, ReadOnlyAdmin
from approvals.models import (
    Approval,
    ApprovalLimit,
    AutoApprovalCap,
    PolicyChange,
    PolicyChangeStatus,
    PolicyOperation,
    PolicyTarget,
)
from approvals.policy_changes import PolicyChangeRefused, policy_change_propose


@admin.register(Approval)
class ApprovalAdmin(ReadOnlyAdmin):
    """An approval is a record of a decision: it is never added, edited or deleted after the fact."""

    list_display = ("decided_at", "action", "decision", "decided_by_label", "amount", "currency", "expires_at")
    list_filter = ("decision", "policy", CurrencyFilter)
    search_fields = ("action__action_id__exact",)
    search_help_text = "An exact action id."
    list_select_related = ("action",)


class PolicyChangeAdmin(admin.ModelAdmin):
    """A limit or cap is changed in two steps: saving or deleting here proposes the change
    (approvals/policy_changes.py), and a second person, a member of finance, confirms it on the
    console's policy-changes page. Until then the old values stay in force, so nothing here
    writes the row, and the admin log records nothing (the security trail has the proposal)."""

    def _propose(self, request: HttpRequest, obj: Any, operation: str) -> None:
        try:
            change = policy_change_propose(proposed_by=request.user, row=obj, operation=operation)
        except PolicyChangeRefused as refused:
            self.message_user(request, str(refused), messages.ERROR)
            return
        if change is None:
            self.message_user(request, "Nothing changed: those are the values in force.", messages.INFO)
            return
        self.message_user(
            request,
            f"Sent to finance: the {change.what()} stays {change.before_text()} until a member of finance "
            f"other than you confirms {change.after_text()}.",
            messages.WARNING,
        )

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        self._propose(request, obj, PolicyOperation.UPDATE if change else PolicyOperation.CREATE)

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        self._propose(request, obj, PolicyOperation.DELETE)

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        for obj in queryset:
            self.delete_model(request, obj)

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        # The bulk delete would report rows deleted that are only proposed for removal; each
        # removal goes through its own delete page instead.
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        pass  # nothing related, and nothing saved yet

    # The admin log would record a row added, changed or deleted that is only proposed (and,
    # for an addition, has no key yet): the security trail records the proposal instead.
    def log_addition(self, request: HttpRequest, obj: Any, message: Any) -> None:  # type: ignore[override]
        pass

    def log_change(self, request: HttpRequest, obj: Any, message: Any) -> None:  # type: ignore[override]
        pass

    def log_deletions(self, request: HttpRequest, queryset: Any) -> None:  # type: ignore[override]
        pass

    def _back_to_list(self) -> HttpResponseRedirect:
        opts = self.opts
        return HttpResponseRedirect(reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist"))

    def response_add(self, request: HttpRequest, obj: Any, post_url_continue: str | None = None) -> HttpResponse:
        return self._back_to_list()

    def response_change(self, request: HttpRequest, obj: Any) -> HttpResponse:
        return self._back_to_list()

    def response_delete(self, request: HttpRequest, obj_display: str, obj_id: Any) -> HttpResponse:
        return self._back_to_list()

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if request.method == "GET":
            # What is proposed but not yet in force, so that the list is not read as the future.
            target = PolicyTarget.APPROVAL_LIMIT if self.model is ApprovalLimit else PolicyTarget.AUTO_APPROVAL_CAP
            waiting = PolicyChange.objects.filter(target=target, status=PolicyChangeStatus.PENDING).select_related(
                "proposed_by", "limit_user"
            )
            for change in waiting.order_by("proposed_at", "pk"):
                self.message_user(
                    request,
                    f"Waiting for finance: {change.get_operation_display().lower()} of the {change.what()}, "
                    f"{change.before_text()} to {change.after_text()} "
                    f"(proposed by {change.proposed_by.get_username()}).",
                    messages.INFO,
                )
        return super().changelist_view(request, extra_context)


@admin.register(ApprovalLimit)
class ApprovalLimitAdmin(PolicyChangeAdmin):
    """Limits are validated by the model (positive, an ISO currency the console uses). Every
    change waits for finance to confirm it. Nobody edits their own limit here."""

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

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        super().delete_queryset(request, queryset.exclude(user=request.user))


@admin.register(AutoApprovalCap)
class AutoApprovalCapAdmin(PolicyChangeAdmin):
    """Caps on what the auto-approval policy may approve with no person involved. Every change
    waits for finance to confirm it."""

    list_display = ("scope", "currency", "max_amount", "max_count", "window_hours")
    list_filter = ("scope", CurrencyFilter)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        # A cap is one scope and currency; another scope or currency is a new cap.
        return ("scope", "currency") if obj else ()


@admin.register(PolicyChange)
class PolicyChangeHistoryAdmin(ReadOnlyAdmin):
    """Proposed changes to limits and caps, and who confirmed or rejected them. Finance decides
    them on the console's policy-changes page, not here."""

    list_display = (
        "proposed_at",
        "operation",
        "what",
        "before_text",
        "after_text",
        "status",
        "proposed_by",
        "decided_by",
    )
    list_filter = ("status", "target")
    list_select_related = ("proposed_by", "limit_user", "decided_by")

    @admin.display(description="limit or cap")
    def what(self, obj: PolicyChange) -> str:
        return obj.what()

    @admin.display(description="before")
    def before_text(self, obj: PolicyChange) -> str:
        return obj.before_text()

    @admin.display(description="after")
    def after_text(self, obj: PolicyChange) -> str:
        return obj.after_text()
